"""The run's page offers "Roll back to here" (a rewind, lifecycle/rewind.py) on its steps to
reviewers and admins, never to viewers nor on a run that cannot be rewound; another org's run is
a 404 on the page and on the API's preview the page reads; after a rewind the run's history
shows it: who, why, the counts and the calls "not undone by the rewind". Django's test client
against the real views, a real webhook receiver for the walk (eager Celery)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import intercept
from tests.dashboard.conftest import page_client
from tests.effects.conftest import build_stack
from tests.receiver import Receiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]

BUTTON = re.compile(r'<button type="button" class="small rewind-button" data-step="(\d+)">Roll back to here')


@pytest.fixture
def receiver():
    with Receiver() as receiver:
        yield receiver


def steps_offered(persona, role: str, session_id) -> list[int]:
    response = page_client(persona, role).get(f"/sessions/{session_id}/")
    assert response.status_code == 200
    return [int(step) for step in BUTTON.findall(response.content.decode())]


def test_reviewers_and_admins_get_roll_back_to_here_on_each_earlier_step_and_viewers_none(acme, receiver):
    stack = build_stack(acme, receiver.url, 3)

    # Step 0 (the run before its first call) up to the step before the current one (3).
    assert steps_offered(acme, "reviewer", stack.session_id) == [0, 1, 2]
    assert steps_offered(acme, "admin", stack.session_id) == [0, 1, 2]
    assert steps_offered(acme, "viewer", stack.session_id) == []
    assert "rewind-button" not in page_client(acme, "viewer").get(f"/sessions/{stack.session_id}/").content.decode()

    # A run that has ended cannot be rewound: no control, even for an admin.
    assert stack.fail().status_code == 200
    assert steps_offered(acme, "admin", stack.session_id) == []


def test_another_orgs_run_is_not_found_on_the_page_nor_by_the_preview(acme, outsider, receiver):
    stack = build_stack(acme, receiver.url, 2)

    assert page_client(outsider, "admin").get(f"/sessions/{stack.session_id}/").status_code == 404
    preview = outsider.reviewer.get(f"/api/v1/sessions/{stack.session_id}/rewind?to_step=1")
    assert preview.status_code == 404 and preview.json()["error"] == "session_not_found"
    refused = outsider.reviewer.post(f"/api/v1/sessions/{stack.session_id}/rewind", {"to_step": 1, "reason": "x"},
                                     format="json")
    assert refused.status_code == 404
    assert receiver.log == [] and stack.session.rewinds == 0


def test_the_runs_history_shows_the_rewind_who_why_the_counts_and_what_was_left_done(acme, receiver):
    stack = build_stack(acme, receiver.url, 2)
    assert acme.api.post("/api/v1/tools", {"tools": [
        {"name": "send_invoice", "tier": "irreversible", "approval": {"reason": "money leaves"}}]},
        format="json").status_code == 200
    assert acme.admin.post("/api/v1/rules", {"name": "let-invoices", "condition": 'tool.name == "send_invoice"',
                                             "outcome": "approve"}, format="json").status_code == 201
    invoice = intercept(acme, stack.session_id, "send_invoice", {"amount": 10}, 3)
    assert invoice.status_code == 202, invoice.content
    effect = invoice.json()["effect"]["id"]
    assert acme.api.post(f"/api/v1/effects/{effect}/start").status_code == 200
    assert acme.api.post(f"/api/v1/effects/{effect}/commit", {"result": {}}, format="json").status_code == 200

    response = acme.reviewer.post(f"/api/v1/sessions/{stack.session_id}/rewind",
                                  {"to_step": 1, "reason": "wrong turn at step 2", "leave_irreversible": True},
                                  format="json")
    assert response.status_code == 200, response.content
    html = page_client(acme, "viewer").get(f"/sessions/{stack.session_id}/").content.decode()

    rows = re.findall(r'<li data-rewind="[^"]+">(.*?)</li>\s*</ol>', html, re.S)
    assert len(rows) == 1
    row = " ".join(re.sub(r"<[^>]+>", " ", rows[0]).split())
    assert "rolled back from step 3 to step 1" in row and "wrong turn at step 2" in row
    assert "by acme-reviewer" in row
    assert "1 undone · 1 left done · 0 withdrawn · done" in row
    assert "not undone by the rewind: send_invoice at step 3" in row
    assert 'id="rewind-progress" data-entries-left="0" hidden' in html  # nothing under way any more
    assert len(receiver.applied) == 1
