"""Where the policy features meet: an edit needs a single approver (every approver of a quorum
approves the same args), and a grant is one reviewer's standing approval, so it never stands in
for a quorum and never beats a deny rule."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from budgets.models import Refusal
from tests.approvals.conftest import irreversible, register
from tests.conftest import intercept, open_session

pytestmark = pytest.mark.django_db


def grant_for_run(persona, session: str):
    response = persona.reviewer.post("/api/v1/grants", {"agent": "cleanup", "tool": "refund", "session": session},
                                     format="json")
    assert response.status_code == 201, response.content


def refund(persona, session: str, amount: int, step: int = 1):
    return intercept(persona, session, "refund", {"amount": amount}, step)


def test_an_edit_of_a_request_that_needs_two_approvers_is_refused_and_counts_nothing(acme):
    register(acme, irreversible("refund", approvals_required=2))
    approval_id = refund(acme, open_session(acme), 10).json()["approval"]["id"]

    response = acme.reviewer.post(f"/api/v1/approvals/{approval_id}/approve", {"args": {"amount": 5}}, format="json")

    assert (response.status_code, response.json()["error"]) == (409, "edit_needs_single_approver")
    approval = ApprovalRequest.objects.get(pk=approval_id)
    assert (approval.state, approval.approvals, approval.effect.approved_args) == ("pending", [], None)


def test_a_grant_does_not_decide_a_call_that_needs_two_approvers(acme):
    register(acme, irreversible("refund", approvals_required=2))
    session = open_session(acme)
    grant_for_run(acme, session)

    response = refund(acme, session, 10)

    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["decision"], body["effect"]["state"], body["approval"]["approvals_required"]) == \
        ("await_approval", "pending", 2)


def test_a_grant_does_not_beat_a_deny_rule(acme):
    register(acme, irreversible("refund"))
    rule = acme.admin.post("/api/v1/rules", {"name": "no-big-refunds", "condition": "args.amount > 100",
                                             "outcome": "deny", "message": "too large"}, format="json")
    assert rule.status_code == 201, rule.content
    session = open_session(acme)
    grant_for_run(acme, session)

    denied, granted = refund(acme, session, 500, 1), refund(acme, session, 50, 2)

    assert (denied.status_code, denied.json()["kind"]) == (403, "rule")
    assert Refusal.objects.get().kind == "rule"
    assert (granted.status_code, granted.json()["decision"]) == (201, "approved")
