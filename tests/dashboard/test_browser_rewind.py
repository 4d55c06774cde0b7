"""A run's rewind from its page, in a real headless Chromium against the real ASGI server, a real
Celery worker and a real webhook receiver (signatures checked): a reviewer clicks "Roll back to
here" on step 1 of a run with three compensable calls, the confirmation lists the two later
calls (the API's preview), a reason is given, the page follows the walk while the receiver (slow
on purpose) gets the two compensations newest first, and the page shows the run running again at
step 1, with the rewind in its history. On a phone (390 px) and a desktop (1440 px). Leaves
var/responsive-rewind-<size>.png and responsive-rewind-confirm-<size>.png for people to look at."""

from __future__ import annotations

import pytest

from tests.dashboard.conftest import SCREENSHOTS, log_in
from tests.dashboard.test_browser_daily import FITS, NAV, SIZES
from tests.processes import celery_worker

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def worker(django_db_setup):
    """A real Celery worker for this module's walks; gone before another module starts its own."""
    from undolog_site.celery import app

    app.control.purge()  # messages other tests' walks (no worker there) left in the test broker
    with celery_worker(concurrency=2, UNDOLOG_WEBHOOK_RETRY_BASE_MS="100") as process:
        yield process


@pytest.mark.parametrize("size", list(SIZES))
def test_a_reviewer_rolls_a_run_back_to_step_1_and_watches_it_run_again(acme, server, browser, worker, size):
    from effects.models import Effect, Session
    from tests.effects.conftest import build_stack
    from tests.receiver import Receiver

    # Each compensation takes the receiver 0.8 s: long enough for the page to show the walk.
    with Receiver(secrets=[acme.org.webhook_secret], behaviour=lambda delivery: (200, 0.8)) as receiver:
        stack = build_stack(acme, receiver.url, 3)
        context = browser.new_context(base_url=server, viewport=SIZES[size])
        context.set_default_timeout(10_000)
        page = context.new_page()
        try:
            log_in(page, acme.reviewer.user)
            page.goto(f"/sessions/{stack.session_id}/")
            fits = page.evaluate(FITS, [NAV, ".rewind-button[data-step='1']", "#timeline"])
            page.click(".rewind-button[data-step='1']")
            page.wait_for_function("() => document.getElementById('confirm-title').textContent.includes('step 1')")
            title = page.inner_text("#confirm-title")
            listed = page.locator("#rewind-undo li").all_inner_texts()
            left_listed = page.locator("#rewind-left").count()
            dialog_fits = page.evaluate(FITS, ["#confirm-body", "#confirm-ok"])
            page.screenshot(path=str(SCREENSHOTS / f"responsive-rewind-confirm-{size}.png"))
            page.fill("#confirm-input", "took a wrong turn after step 1")
            page.click("#confirm-ok")

            page.wait_for_selector("#rewind-progress:not([hidden])")
            progress = page.inner_text("#rewind-progress")
            page.wait_for_selector("#session-summary[data-state=running]", timeout=20_000)
            page.wait_for_selector("#rewind-progress", state="hidden")
            page.wait_for_selector("#rewinds li[data-rewind]")
            summary = page.inner_text("#session-summary")
            history = page.inner_text("#rewinds li[data-rewind]")
            buttons = page.locator(".rewind-button").evaluate_all("nodes => nodes.map(n => n.dataset.step)")
            page.screenshot(path=str(SCREENSHOTS / f"responsive-rewind-{size}.png"), full_page=True)
        finally:
            context.close()
        order, verified = list(receiver.order), all(d.verified for d in receiver.log)

    assert fits == [] and dialog_fits == []
    assert title == "Roll the run back to step 1?"
    assert [line.split(":")[0] for line in listed] == ["step 3", "step 2"]  # newest first, as the walk
    assert all("send_email" in line for line in listed) and left_listed == 0
    assert "Rolling back to step 1" in progress
    # The receiver got the two compensations newest first, each once, signed.
    assert order == [stack.entries[2], stack.entries[1]] and verified
    assert "step 1" in summary and "Running" in summary
    assert "rolled back from step 3 to step 1" in history and "took a wrong turn after step 1" in history
    assert "2 undone · 0 left done · 0 withdrawn · done" in history and "acme-reviewer" in history
    assert buttons == ["0"]  # the run is at step 1 again: only the start lies before it
    session = Session.objects.get(pk=stack.session_id)
    assert (session.state, session.step_index, session.rewind_to) == ("running", 1, None)
    states = dict(Effect.objects.filter(session_id=stack.session_id).values_list("step_index", "state"))
    assert states == {1: "committed", 2: "compensated", 3: "compensated"}


def test_what_cannot_be_undone_is_named_and_a_refused_rewind_is_said_in_words(acme, server, browser, worker):
    """An irreversible call after the step: the confirmation names it, a rewind without leave to
    keep it done is refused in words and changes nothing; a rewind started meanwhile by someone
    else refuses this one in words too; with the box ticked the run goes back and its history
    lists the call as not undone."""
    from effects.models import Effect, Session
    from tests.conftest import intercept
    from tests.effects.conftest import build_stack
    from tests.receiver import Receiver

    with Receiver(secrets=[acme.org.webhook_secret], behaviour=lambda delivery: (200, 2.0)) as receiver:
        stack = build_stack(acme, receiver.url, 2, timeout_ms=10_000)
        assert acme.api.post("/api/v1/tools", {"tools": [
            {"name": "send_invoice", "tier": "irreversible", "approval": {"reason": "money leaves"}}]},
            format="json").status_code == 200
        assert acme.admin.post("/api/v1/rules", {"name": "let-invoices", "condition": 'tool.name == "send_invoice"',
                                                 "outcome": "approve"}, format="json").status_code == 201
        invoice = intercept(acme, stack.session_id, "send_invoice", {"amount": 10}, 3).json()["effect"]["id"]
        assert acme.api.post(f"/api/v1/effects/{invoice}/start").status_code == 200
        assert acme.api.post(f"/api/v1/effects/{invoice}/commit", {"result": {}}, format="json").status_code == 200
        later = intercept(acme, stack.session_id, "send_email", {"to": "later@x.io"}, 4).json()["effect"]["id"]
        assert acme.api.post(f"/api/v1/effects/{later}/commit", {"result": {}}, format="json").status_code == 200

        context = browser.new_context(base_url=server, viewport=SIZES["desktop"])
        context.set_default_timeout(10_000)
        page = context.new_page()
        flash = "() => document.getElementById('flash').textContent.includes('Not rolled back')"
        try:
            log_in(page, acme.reviewer.user)
            page.goto(f"/sessions/{stack.session_id}/")

            # 1. Refused: the irreversible invoice is in the way and the box is not ticked.
            page.click(".rewind-button[data-step='1']")
            page.wait_for_selector("#rewind-left li")
            undo_listed = page.locator("#rewind-undo li").all_inner_texts()
            left_listed = page.locator("#rewind-left li").all_inner_texts()
            page.fill("#confirm-input", "back to the start")
            page.click("#confirm-ok")
            page.wait_for_function(flash)
            in_the_way = page.inner_text("#flash")
            refused_state = Session.objects.values_list("state", "step_index").get(pk=stack.session_id)

            # 2. Refused: someone else's rewind starts while the confirmation is open.
            page.click(".rewind-button[data-step='1']")
            page.wait_for_selector("#rewind-leave-input")
            page.check("#rewind-leave-input")
            page.fill("#confirm-input", "me too")
            other = acme.reviewer.post(f"/api/v1/sessions/{stack.session_id}/rewind",
                                       {"to_step": 3, "reason": "only the last call"}, format="json")
            assert other.status_code == 200, other.content
            page.click("#confirm-ok")
            page.wait_for_function("() => document.getElementById('flash').textContent.includes('already')")
            in_progress = page.inner_text("#flash")
            page.wait_for_selector("#session-summary[data-state=running]", timeout=20_000)

            # 3. With the box ticked: rolled back, the invoice left done and listed.
            page.click(".rewind-button[data-step='1']")
            page.wait_for_selector("#rewind-leave-input")
            page.check("#rewind-leave-input")
            page.fill("#confirm-input", "keep the invoice")
            page.click("#confirm-ok")
            page.wait_for_selector("#rewinds li[data-rewind] .not-undone", timeout=20_000)
            page.wait_for_selector("#session-summary[data-state=running]", timeout=20_000)
            newest = page.inner_text("#rewinds li[data-rewind]")
        finally:
            context.close()
        order = list(receiver.order)

    assert [line.split(":")[0] for line in undo_listed] == ["step 4", "step 2"]
    assert len(left_listed) == 1 and left_listed[0].startswith("step 3: send_invoice")
    assert in_the_way.startswith("Not rolled back: irreversible calls after step 1 cannot be undone (send_invoice "
                                 "at step 3)")
    assert refused_state == ("running", 4)
    assert in_progress == ("Not rolled back: the run is being rolled back to step 3 already; try again once it runs.")
    assert "keep the invoice" in newest and "1 undone · 1 left done" in newest
    assert "not undone by the rewind: send_invoice at step 3" in newest
    later_entry = str(Effect.objects.get(pk=later).undo_entry.pk)
    assert order == [later_entry, stack.entries[1]]  # step 4 by the other rewind, then step 2; step 1 kept
    assert Session.objects.values_list("state", "step_index").get(pk=stack.session_id) == ("running", 1)
