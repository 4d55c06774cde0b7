"""A dashboard left open on a quiet org keeps its one live connection: no close, no reconnect, no
"Reconnecting…" for a minute, and the next event still arrives over that same socket at once.

The channel layer's receive blocks in a 5 s BZPOPMIN; redis-py 8 gave up on a read after 5 s, so
the server closed every quiet socket with 1011 about every 5 s (issue 39). The server here uses the
test Redis as configured: the embedded one over its unix socket, or REDIS_URL's when set."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import open_session, register_standard_tools
from tests.dashboard.conftest import log_in

pytestmark = pytest.mark.django_db(transaction=True)

QUIET_S = 60

# Counts every socket the page opens, every close and every message type, before the page's script runs.
WATCH_SOCKETS = """
(() => {
  const Native = window.WebSocket;
  window.socketLog = {opened: 0, closes: [], kinds: [], states: []};
  window.WebSocket = function (url, protocols) {
    const socket = protocols === undefined ? new Native(url) : new Native(url, protocols);
    window.socketLog.opened += 1;
    socket.addEventListener("close", (event) => window.socketLog.closes.push(event.code));
    socket.addEventListener("message", (event) => {
      try { window.socketLog.kinds.push(JSON.parse(event.data).type); } catch (err) { /* not JSON */ }
    });
    return socket;
  };
  window.WebSocket.prototype = Native.prototype;
  Object.assign(window.WebSocket, {CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3});
  document.addEventListener("DOMContentLoaded", () => {
    const status = document.getElementById("live-status");
    new MutationObserver(() => window.socketLog.states.push(status.dataset.state))
      .observe(status, {attributes: true, attributeFilter: ["data-state"]});
  });
})();
"""


def test_a_quiet_dashboard_keeps_its_socket_for_a_minute_and_hears_the_next_event_at_once(acme, server, new_page):
    register_standard_tools(acme)
    session = open_session(acme)
    page = new_page()
    page.add_init_script(WATCH_SOCKETS)
    log_in(page, acme.reviewer.user)
    page.evaluate("window.notReloaded = true")
    assert page.evaluate("window.socketLog.opened") == 1

    page.wait_for_timeout(QUIET_S * 1000)
    quiet = page.evaluate("window.socketLog")
    assert quiet["closes"] == [] and quiet["opened"] == 1, quiet
    assert "down" not in quiet["states"] and "connecting" not in quiet["states"], quiet
    assert page.locator("#live-status").get_attribute("data-state") == "live"
    assert page.locator("#connection-banner").is_hidden()

    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {acme.key}"}) as agent:
        started = time.monotonic()
        response = agent.post(f"/api/v1/sessions/{session}/intercept",
                              json={"tool": "delete_account", "args": {"account_id": "acct-quiet"}, "step_index": 1})
        approval = response.json()["approval"]["id"]
        page.wait_for_selector(f'tr.queue-row[data-id="{approval}"]', timeout=2000)
        elapsed = time.monotonic() - started

    after = page.evaluate("window.socketLog")
    assert elapsed < 1.0, elapsed  # as soon as on a fresh page (test_browser: under a second)
    assert "approval.requested" in after["kinds"]  # over the socket, not a re-fetch after a reconnect
    assert after["opened"] == 1 and after["closes"] == [], after
    assert page.evaluate("window.notReloaded") is True
