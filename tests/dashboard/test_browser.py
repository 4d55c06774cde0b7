"""The dashboard in a real headless Chromium against the real ASGI server (HTTP and websockets),
with agents calling that server over HTTP. Few and focused: each proves one promise end to end."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from effects.models import Session
from tests.conftest import open_session, register_standard_tools
from tests.dashboard.conftest import SCREENSHOTS, hold, log_in

pytestmark = pytest.mark.django_db(transaction=True)


def agent_http(server: str, persona) -> httpx.Client:
    return httpx.Client(base_url=server, headers={"Authorization": f"Bearer {persona.key}"}, timeout=40)


def long_poll(server: str, persona, effect_id: str) -> dict:
    """Start the agent's long poll on the effect in a thread; the dict fills in when it returns."""
    answer: dict = {}

    def wait() -> None:
        with agent_http(server, persona) as agent:
            answer.update(agent.get(f"/api/v1/effects/{effect_id}", params={"wait": 30}).json())

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    answer["_thread"] = thread
    time.sleep(0.3)  # the poll is waiting before the reviewer decides
    return answer


def test_it_shows_a_new_request_in_the_queue_within_a_second_without_reload(acme, server, new_page):
    register_standard_tools(acme)
    session = open_session(acme)
    page = new_page()
    log_in(page, acme.reviewer.user)
    page.evaluate("window.notReloaded = true")

    with agent_http(server, acme) as agent:
        started = time.monotonic()
        response = agent.post(f"/api/v1/sessions/{session}/intercept",
                              json={"tool": "delete_account", "args": {"account_id": "acct-7"}, "step_index": 1,
                                    "reasoning": "Inactive for 14 months.\nOwner asked for it."})
        approval = response.json()["approval"]["id"]
        page.wait_for_selector(f'tr.queue-row[data-id="{approval}"]', timeout=1000)
        elapsed = time.monotonic() - started

    row = page.locator(f'tr.queue-row[data-id="{approval}"]')
    assert response.status_code == 202
    assert elapsed < 1.0, elapsed
    assert page.evaluate("window.notReloaded") is True
    assert row.locator(".tool").inner_text() == "delete_account"
    assert row.locator(".agent").inner_text() == "cleanup"
    assert row.locator(".tag.risk-loss").inner_text() == "data-loss"
    assert row.locator(".impact").inner_text() == "account acct-7 and its data"
    assert row.locator(".reasoning").inner_text() == "Inactive for 14 months."
    page.wait_for_function("document.title.startsWith('(1) ')")
    page.wait_for_function(f"""() => /min/.test(document.querySelector('tr[data-id="{approval}"] time').textContent)""")


def test_it_approves_in_the_browser_and_the_agents_long_poll_returns_approved(acme, server, new_page):
    held = hold(acme)
    page = new_page()
    log_in(page, acme.reviewer.user)
    page.click(f'tr.queue-row[data-id="{held["approval"]["id"]}"] a.row-link')
    page.wait_for_selector("#approve-button")
    polled = long_poll(server, acme, held["effect"]["id"])

    page.keyboard.press("a")

    polled["_thread"].join(timeout=10)
    page.wait_for_selector("#decision.decision-approved")
    assert polled["effect"]["state"] == "approved"
    assert "acme-reviewer" in page.inner_text("#decision")
    assert page.inner_text("#approval-state") == "approved"
    assert Session.objects.get(pk=held["session"]).state == Session.State.RUNNING


def test_it_rejects_with_a_reason_and_the_run_halts(acme, server, new_page):
    held = hold(acme)
    page = new_page()
    log_in(page, acme.reviewer.user)
    page.goto(f"/approvals/{held['approval']['id']}/")
    polled = long_poll(server, acme, held["effect"]["id"])

    page.click("#reject-button")  # no reason yet: refused on the page, nothing sent
    page.wait_for_selector(".flash.error")
    page.fill("#reject-reason", "That account has an open invoice")
    page.click("#reject-button")

    polled["_thread"].join(timeout=10)
    page.wait_for_selector("#decision.decision-rejected")
    assert polled["effect"]["state"] == "rejected"
    assert "That account has an open invoice" in page.inner_text("#decision")
    assert Session.objects.get(pk=held["session"]).state == Session.State.HALTED


def test_it_shows_the_apis_message_when_a_decision_fails(acme, server, new_page):
    held = hold(acme)
    page = new_page()
    log_in(page, acme.reviewer.user)
    page.goto(f"/approvals/{held['approval']['id']}/")
    acme.admin.post(f"/api/v1/approvals/{held['approval']['id']}/approve", {}, format="json")  # someone else

    page.click("#approve-button")

    page.wait_for_selector(".flash.error")
    assert "already decided" in page.inner_text("#flash")
    page.wait_for_selector("#decision.decision-approved")  # the page catches up with who decided


def test_the_incident_switch_refuses_the_next_irreversible_call(acme, server, new_page):
    register_standard_tools(acme)
    session = open_session(acme)
    page = new_page()
    log_in(page, acme.admin.user)
    page.goto("/agents/")

    page.click("#incident-on")
    page.click("#confirm-ok")

    page.wait_for_selector("#incident-off")
    page.wait_for_selector("#incident-banner:not([hidden])")
    with agent_http(server, acme) as agent:
        refused = agent.post(f"/api/v1/sessions/{session}/intercept",
                             json={"tool": "delete_account", "args": {"account_id": "acct-9"}, "step_index": 1})
        sent = agent.post(f"/api/v1/sessions/{session}/intercept",
                          json={"tool": "send_email", "args": {"to": "a@x.io"}, "step_index": 2})
    assert refused.status_code == 429 and refused.json()["decision"] == "refused"
    assert sent.status_code == 201  # compensable calls go on
    page.goto("/sessions/")
    assert page.is_visible("#incident-banner")


def test_it_says_when_the_websocket_drops_and_fetches_what_it_missed(acme, server, new_page):
    register_standard_tools(acme)
    session = open_session(acme)
    page = new_page()
    log_in(page, acme.reviewer.user)

    page.context.set_offline(True)
    page.evaluate("UL.dropConnection()")
    page.wait_for_selector("#connection-banner:not([hidden])")
    with agent_http(server, acme) as agent:  # published while no socket listens
        approval = agent.post(f"/api/v1/sessions/{session}/intercept",
                              json={"tool": "delete_account", "args": {"account_id": "acct-8"},
                                    "step_index": 1}).json()["approval"]["id"]
    time.sleep(0.3)
    assert page.locator(f'tr.queue-row[data-id="{approval}"]').count() == 0
    page.context.set_offline(False)
    page.evaluate("UL.reconnectNow()")

    page.wait_for_selector(f'tr.queue-row[data-id="{approval}"]', timeout=5000)
    page.wait_for_selector("#connection-banner[hidden]", state="attached")
    assert page.get_attribute("#live-status", "data-state") == "live"


def test_an_outsider_sees_none_of_it_and_its_urls_are_404(acme, outsider, server, new_page):
    held = hold(acme)
    page = new_page()
    log_in(page, outsider.reviewer.user)

    with agent_http(server, acme) as agent:  # a new request of acme while the outsider watches
        agent.post(f"/api/v1/sessions/{open_session(acme)}/intercept",
                   json={"tool": "delete_account", "args": {"account_id": "acct-x"}, "step_index": 1})
    time.sleep(1.0)

    assert page.locator("tr.queue-row").count() == 0
    assert page.inner_text("#queue-count") == "0"
    for url in (f"/approvals/{held['approval']['id']}/", f"/sessions/{held['session']}/"):
        assert page.goto(url).status == 404
    api = page.request.get(f"/api/v1/approvals/{held['approval']['id']}")
    assert api.status == 404


def test_screenshots_of_the_queue_and_a_session(acme, server, new_page):
    """Not an assertion of looks: it leaves var/dashboard-queue.png and var/dashboard-session.png
    for people to look at, and checks the two pages render their main parts."""
    first = hold(acme, {"account_id": "acct-101"})
    hold(acme, {"account_id": "acct-102"}, reasoning="Duplicate account of acct-101; merged last week.")
    page = new_page()
    log_in(page, acme.reviewer.user)
    page.wait_for_selector("tr.queue-row >> nth=1")
    page.screenshot(path=str(SCREENSHOTS / "dashboard-queue.png"), full_page=True)
    page.goto(f"/sessions/{first['session']}/")
    page.wait_for_selector("#timeline .tl-item")
    page.screenshot(path=str(SCREENSHOTS / "dashboard-session.png"), full_page=True)
    assert (SCREENSHOTS / "dashboard-queue.png").stat().st_size > 10_000
