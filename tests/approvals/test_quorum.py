"""Two-person rule: a tool, a risk tag or a rule asks for N distinct approvers; one rejection
rejects; nobody counts twice; whoever started the run cannot approve it; concurrent approvals
by different reviewers count exactly (real threads, each with its own connection)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from approvals.models import ApprovalRequest
from effects.models import EffectTransition, Session
from orgs.models import Event
from tests.approvals.conftest import irreversible, register
from tests.conftest import intercept, make_persona


def held(persona, tool: str = "refund", started_by: str = "", **approval) -> dict:
    register(persona, irreversible(tool, **approval))
    session = persona.api.post("/api/v1/sessions", {"started_by": started_by}, format="json").json()
    body = intercept(persona, session["id"], tool, {"amount": 10}, 1).json()
    return {**body, "session": session}


def approve(client, approval_id: str, **body):
    return client.post(f"/api/v1/approvals/{approval_id}/approve", body, format="json")


@pytest.mark.django_db
def test_a_tool_that_needs_two_stays_pending_after_one_and_shows_one_of_two(acme):
    approval_id = held(acme, approvals_required=2)["approval"]["id"]

    first = approve(acme.reviewer, approval_id, reason="looks fine")

    assert first.status_code == 200
    body = first.json()["approval"]
    assert (body["state"], body["approvals_required"], body["quorum"]) == ("pending", 2, "1 of 2")
    assert [a["by"] for a in body["approvals"]] == ["acme-reviewer"]
    queue = acme.viewer.get("/api/v1/approvals?state=pending").json()["approvals"]
    assert queue[0]["quorum"] == "1 of 2"
    assert Event.objects.filter(kind="approval.counted").count() == 1
    assert not Event.objects.filter(kind="approval.decided").exists()
    assert ApprovalRequest.objects.get().effect.state == "pending"


@pytest.mark.django_db
def test_the_same_approver_twice_does_not_count_twice(acme):
    approval_id = held(acme, approvals_required=2)["approval"]["id"]
    approve(acme.reviewer, approval_id)

    again = approve(acme.reviewer, approval_id)

    assert (again.status_code, again.json()["error"]) == (409, "already_approved_by_you")
    approval = ApprovalRequest.objects.get()
    assert (approval.state, len(approval.approvals)) == ("pending", 1)


@pytest.mark.django_db
def test_two_distinct_approvers_approve_and_the_agent_may_run(acme):
    body = held(acme, approvals_required=2)
    second = acme.person("second", "admin")

    approve(acme.reviewer, body["approval"]["id"])
    final = approve(second, body["approval"]["id"])

    approval = final.json()["approval"]
    assert (approval["state"], approval["quorum"], approval["decided_by"]) == ("approved", "2 of 2", "second")
    assert acme.api.get(f"/api/v1/effects/{body['effect']['id']}").json()["effect"]["state"] == "approved"
    assert Session.objects.get(pk=body["session"]["id"]).state == "running"


@pytest.mark.django_db
def test_one_rejection_rejects_even_after_an_approval(acme):
    approval_id = held(acme, approvals_required=3)["approval"]["id"]
    approve(acme.reviewer, approval_id)

    rejected = acme.person("skeptic", "reviewer").post(f"/api/v1/approvals/{approval_id}/reject",
                                                       {"reason": "not this one"}, format="json")

    assert rejected.json()["approval"]["state"] == "rejected"
    assert approve(acme.admin, approval_id).json()["error"] == "already_decided"


@pytest.mark.django_db
def test_a_risk_tag_sets_the_quorum_and_the_larger_ask_wins(acme):
    acme.admin.patch("/api/v1/org/settings", {"approvals_by_risk_tag": {"data-loss": 3}}, format="json")

    body = held(acme, approvals_required=2)

    assert body["approval"]["approvals_required"] == 3


@pytest.mark.django_db
def test_the_person_who_started_the_run_cannot_approve_it(acme):
    body = held(acme, started_by="acme-reviewer")
    assert body["session"]["started_by"] == "acme-reviewer"

    refused = approve(acme.reviewer, body["approval"]["id"])

    assert (refused.status_code, refused.json()["error"]) == (403, "run_starter_cannot_approve")
    assert ApprovalRequest.objects.get().state == "pending"
    assert approve(acme.admin, body["approval"]["id"]).json()["approval"]["state"] == "approved"


@pytest.mark.django_db
def test_the_run_starter_is_matched_by_email_too(acme):
    acme.reviewer.user.email = "Rev@Acme.test"
    acme.reviewer.user.save()
    body = held(acme, started_by="rev@acme.test")

    assert approve(acme.reviewer, body["approval"]["id"]).json()["error"] == "run_starter_cannot_approve"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(3))
def test_two_reviewers_approving_at_once_with_quorum_two_approve_once_and_both_count(attempt):
    acme = make_persona(f"quorum-{attempt}")
    body = held(acme, approvals_required=2)
    reviewers = [acme.reviewer, acme.person(f"q{attempt}-second", "reviewer")]
    start = threading.Barrier(2)
    answers: list[tuple[int, dict]] = []

    def decide(client) -> None:
        try:
            start.wait()
            response = approve(client, body["approval"]["id"])
            answers.append((response.status_code, response.json()))
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(client,)) for client in reviewers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(code for code, _ in answers) == [200, 200], answers
    approval = ApprovalRequest.objects.get(pk=body["approval"]["id"])
    assert approval.state == "approved"
    assert sorted(a["by"] for a in approval.approvals) == sorted(c.user.username for c in reviewers)
    assert EffectTransition.objects.filter(effect_id=body["effect"]["id"], to_state="approved").count() == 1
    assert Event.objects.filter(org=acme.org, kind="approval.decided").count() == 1
    assert Event.objects.filter(org=acme.org, kind="approval.counted").count() == 1
