"""One agent's page in a real headless Chromium against the real ASGI server: an admin rolls back
the agent's runs since a date and time typed on the organization's clocks (the browser's own zone
is another), confirms what the preview says, and watches the entries left until the walks are
done; on a phone (390 px) and a desktop (1440 px) the page lays out within the window. Leaves
var/responsive-agent-<size>.png for people to look at."""

from __future__ import annotations

import zoneinfo
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from tests.dashboard.conftest import SCREENSHOTS, log_in
from tests.dashboard.test_browser_daily import FITS, NAV, SIZES

pytestmark = pytest.mark.django_db(transaction=True)


def open_in(browser, server, zone: str, size: dict):
    context = browser.new_context(base_url=server, viewport=size, timezone_id=zone)
    context.set_default_timeout(10_000)
    return context, context.new_page()


def test_an_admin_rolls_back_the_runs_since_a_time_on_the_orgs_clocks_and_watches_them_walk_back(acme, server, browser):
    from effects.models import Session
    from lifecycle import undo
    from orgs.models import Event
    from tests.effects.conftest import build_stack
    from tests.receiver import Receiver

    acme.org.time_zone = "America/New_York"
    acme.org.save()
    zone = zoneinfo.ZoneInfo("America/New_York")
    since = (timezone.now() - timedelta(hours=1)).astimezone(zone).replace(second=0, microsecond=0)
    with Receiver(secrets=[acme.org.webhook_secret]) as receiver:
        running = build_stack(acme, receiver.url, 2)
        recent = build_stack(acme, receiver.url, 1)
        old = build_stack(acme, receiver.url, 1)
        for stack in (recent, old):
            assert acme.api.post(f"/api/v1/sessions/{stack.session_id}/complete").status_code == 200
        # Ended 10 minutes before the time typed: left alone. Before the zone's offset was applied
        # (as the browser's Tokyo clocks would read it) it would be 14 hours inside the window.
        Session.objects.filter(pk=old.session_id).update(ended_at=since - timedelta(minutes=10))
        context, page = open_in(browser, server, "Asia/Tokyo", SIZES["desktop"])
        try:
            log_in(page, acme.admin.user)
            page.goto("/agents/")
            page.click("[data-agent=cleanup] h2 a")
            page.wait_for_url("**/agents/cleanup/")
            assert "America/New_York" in page.inner_text("#rollback-zone")

            page.fill("#rollback-since", since.strftime("%Y-%m-%dT%H:%M"))
            page.click("#rollback-submit")
            page.wait_for_function("() => document.getElementById('confirm-title').textContent.includes('2 runs')")
            asked = page.inner_text("#confirm-body")
            page.fill("#confirm-input", "prompt injection")
            page.click("#confirm-ok")
            # No worker in this test: the walks wait, and the page says how many entries are left.
            page.wait_for_selector("#rollback-progress:not([hidden])")
            entries_left = page.inner_text("#rollback-entries")
            page.wait_for_selector("#rollbacks tr[data-rollback]")
            row = page.inner_text("#rollbacks tr[data-rollback]")

            for stack in (running, recent):
                undo.walk(stack.session_id)
            page.wait_for_selector("#rollback-progress", state="hidden", timeout=5000)
            page.wait_for_function("() => document.querySelector('#rollbacks tr[data-rollback] .progress')"
                                   ".textContent.includes('done')")
        finally:
            context.close()

    event = Event.objects.get(kind="agent.rolled_back")
    assert datetime.fromisoformat(event.data["since"]) == since  # the typed time on New York's clocks
    assert "1 running run" in asked and "3 undo entries" in asked and "America/New_York" in asked
    assert entries_left == "3"
    assert since.strftime("%b %d %H:%M") in row and "prompt injection" in row  # shown on the org's clocks
    assert running.session.state == recent.session.state == "compensated"
    assert old.session.state == "completed"


@pytest.mark.parametrize("size", list(SIZES))
def test_the_agent_page_fits_the_window(acme, server, browser, size):
    from lifecycle import rollback

    rollback.rollback(acme.agent, timezone.now() - timedelta(hours=1), "a long reason " * 8, "alice")
    context, page = open_in(browser, server, "UTC", SIZES[size])
    try:
        log_in(page, acme.admin.user)
        page.goto("/agents/cleanup/")
        page.wait_for_selector("#rollbacks tr[data-rollback]")
        fits = page.evaluate(FITS, [NAV, "#rollback-since", "#rollback-zone", "#rollback-submit",
                                    "#rollbacks tr[data-rollback]", ".agent-summary .budget-bars"])
        submit_top = page.locator("#rollback-submit").bounding_box()["y"]
        page.screenshot(path=str(SCREENSHOTS / f"responsive-agent-{size}.png"), full_page=True)
    finally:
        context.close()

    assert fits == []
    assert submit_top < SIZES[size]["height"]  # the control needs no scrolling, on a phone too
