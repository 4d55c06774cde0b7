"""Decisions beyond one click, in a real headless Chromium against the real server: edit the
args before approving (the agent's long poll returns the edit), approve and grant the tool for
the rest of the run, batch-decide from the queue, revoke a grant."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest, Grant
from effects.models import Effect, canonical_json, sha256
from tests.conftest import intercept
from tests.dashboard.conftest import hold, log_in
from tests.dashboard.test_browser import long_poll

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_reviewer_edits_the_args_and_the_agent_receives_the_edit(acme, server, new_page):
    held = hold(acme, args={"account_id": "acct-102"})
    page = new_page()
    log_in(page, acme.reviewer.user)
    page.goto(f"/approvals/{held['approval']['id']}/")
    polled = long_poll(server, acme, held["effect"]["id"])

    page.click("#edit-args summary")
    page.fill("#args-editor", '{"account_id": "acct-103"')  # not JSON: said, nothing sent
    page.click("#approve-button")
    page.wait_for_selector("#args-editor-status.error-text")
    assert ApprovalRequest.objects.get(pk=held["approval"]["id"]).state == "pending"
    page.fill("#args-editor", '{"account_id": "acct-103"}')
    page.click("#approve-button")

    polled["_thread"].join(timeout=10)
    page.wait_for_selector("#decision.decision-approved")
    assert "with edited arguments" in page.inner_text("#decision")
    assert polled["effect"]["state"] == "approved"
    assert polled["effect"]["approved_args"] == {"account_id": "acct-103"}
    assert polled["effect"]["args"] == {"account_id": "acct-102"}
    assert polled["effect"]["approval"]["decided_args_digest"] == sha256(canonical_json({"account_id": "acct-103"}))
    assert page.is_hidden("#edit-args")


def test_approve_and_grant_for_the_rest_of_the_run_decides_the_runs_next_call_at_once(acme, server, new_page):
    held = hold(acme)
    page = new_page()
    log_in(page, acme.reviewer.user)
    page.goto(f"/approvals/{held['approval']['id']}/")

    page.click("#approve-run-button")

    page.wait_for_selector("#decision.decision-approved")
    # The page approves, then grants (two requests); the live push may show the decision before the
    # grant is made. The flash comes once both answered.
    page.wait_for_selector(".flash.ok:has-text('Approved, and granted.')")
    grant = Grant.objects.get()
    assert (grant.tool_name, str(grant.session_id), grant.created_by_label) == (
        "delete_account", held["session"], "acme-reviewer")
    acme.api.post(f"/api/v1/effects/{held['effect']['id']}/commit", {"result": "ok"}, format="json")
    answer = intercept(acme, held["session"], "delete_account", {"account_id": "acct-2"}, 3)
    assert answer.json()["decision"] == "approved"
    assert answer.json()["approval"]["decided_by"] == f"grant:{grant.pk}"

    page.goto("/grants/")
    page.click(f'button.revoke-grant[data-id="{grant.pk}"]')
    page.wait_for_selector(".flash.ok")
    assert not Grant.objects.live().exists()


def test_a_reviewer_rejects_two_requests_at_once_from_the_queue(acme, server, new_page):
    first = hold(acme, args={"account_id": "acct-1"})
    second = hold(acme, args={"account_id": "acct-2"})
    third = hold(acme, args={"account_id": "acct-3"})
    page = new_page()
    log_in(page, acme.reviewer.user)
    for held in (first, second):
        page.check(f'tr.queue-row[data-id="{held["approval"]["id"]}"] input.pick-row')
    assert page.inner_text("#picked-count") == "2 selected"

    page.click("#batch-reject")
    page.fill("#confirm-input", "Not during the freeze")
    page.click("#confirm-ok")

    page.wait_for_selector(".flash.ok")
    page.wait_for_function("() => document.querySelectorAll('tr.queue-row').length === 1")
    states = {str(a.pk): (a.state, a.decision_reason) for a in ApprovalRequest.objects.all()}
    assert states[first["approval"]["id"]] == states[second["approval"]["id"]] == ("rejected", "Not during the freeze")
    assert states[third["approval"]["id"]][0] == "pending"
    assert Effect.objects.filter(state="rejected").count() == 2
