"""A run's savepoints on its timeline, in a real headless Chromium against the real ASGI server,
a real Celery worker and a real webhook receiver: the savepoint `drafted` the agent marked after
step 1 sits between steps 1 and 2, named, with its own "Roll back to here"; a reviewer rolls the
run back to it by name (the confirmation names it, the API gets `{"to": "drafted"}`), the
receiver gets the two later compensations newest first, and the run's history names the savepoint.
On a phone (390 px) and a desktop (1440 px); leaves var/responsive-savepoint-<size>.png."""

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

# The timeline's lines in page order: a call's step, or a savepoint's name and step.
LINES = """() => Array.from(document.querySelectorAll('#timeline > li')).map(li =>
  li.dataset.savepoint ? 'savepoint ' + li.dataset.savepoint + ' #' + li.dataset.step
                       : li.querySelector('.step').textContent)"""


# The rewind is over and the page shows it: its row in the run's history says done, the run runs.
DONE = """() => {
  const row = document.querySelector('#rewinds li[data-rewind]');
  return !!row && /·\\s*done \\d/.test(row.textContent)
    && document.getElementById('session-summary').dataset.state === 'running';
}"""


@pytest.mark.parametrize("size", list(SIZES))
def test_a_savepoint_sits_on_the_timeline_and_a_reviewer_rolls_the_run_back_to_it(acme, server, browser,
                                                                                   worker, size):
    from effects.models import Effect, Rewind, Session
    from tests.conftest import intercept
    from tests.effects.conftest import build_stack
    from tests.receiver import Receiver

    with Receiver(secrets=[acme.org.webhook_secret]) as receiver:
        stack = build_stack(acme, receiver.url, 1)
        marked = acme.api.post(f"/api/v1/sessions/{stack.session_id}/savepoints", {"name": "drafted"},
                               format="json")
        assert marked.status_code == 201 and marked.json()["step_index"] == 1
        for step in (2, 3):
            effect = intercept(acme, stack.session_id, "send_email", {"to": f"late{step}@x.io"}, step).json()["effect"]
            assert acme.api.post(f"/api/v1/effects/{effect['id']}/commit", {"result": {}},
                                 format="json").status_code == 200
        context = browser.new_context(base_url=server, viewport=SIZES[size])
        context.set_default_timeout(10_000)
        page = context.new_page()
        try:
            log_in(page, acme.reviewer.user)
            page.goto(f"/sessions/{stack.session_id}/")
            lines = page.evaluate(LINES)
            flag = page.inner_text(".tl-savepoint[data-savepoint='drafted']")
            fits = page.evaluate(FITS, [NAV, ".tl-savepoint .rewind-button", "#timeline"])
            page.screenshot(path=str(SCREENSHOTS / f"responsive-savepoint-{size}.png"), full_page=True)
            page.click(".tl-savepoint[data-savepoint='drafted'] .rewind-button")
            page.wait_for_function("() => document.getElementById('confirm-title').textContent.includes('drafted')")
            title = page.inner_text("#confirm-title")
            listed = page.locator("#rewind-undo li").all_inner_texts()
            page.fill("#confirm-input", "back to the draft")
            page.click("#confirm-ok")
            # The page as it was still says running: wait for the rewind's row to say it is done.
            page.wait_for_function(DONE, timeout=20_000)
            history = page.inner_text("#rewinds li[data-rewind]")
            after = page.evaluate(LINES)
            buttons = page.locator(".rewind-button").evaluate_all(
                "nodes => nodes.map(n => n.dataset.savepoint || n.dataset.step)")
        finally:
            context.close()
        sent = [d.body["args"]["to"] for d in receiver.log]

    assert lines == ["#0", "#1", "savepoint drafted #1", "#2", "#3"]
    assert "SAVEPOINT" in flag.upper() and "drafted" in flag and "Roll back to here" in flag
    assert fits == []
    assert title == "Roll the run back to step 1 (savepoint \u201cdrafted\u201d)?"
    assert [line.split(":")[0] for line in listed] == ["step 3", "step 2"]
    assert sent == ["late3@x.io", "late2@x.io"]  # newest first, each once
    assert "rolled back from step 3 to step 1 (drafted)" in history and "back to the draft" in history
    # The run is at the savepoint's step now: it stays on the timeline (the undone calls too, as
    # compensated), and only the start lies before it.
    assert after == lines and buttons == ["0"]
    assert Rewind.objects.get(session_id=stack.session_id).savepoint == "drafted"
    assert Session.objects.get(pk=stack.session_id).step_index == 1
    states = dict(Effect.objects.filter(session_id=stack.session_id).values_list("step_index", "state"))
    assert states == {1: "committed", 2: "compensated", 3: "compensated"}
