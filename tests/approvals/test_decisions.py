"""The decision verbs on ApprovalRequest, below the API: deadlines, and runs that ended first."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest
from budgets.models import Refusal
from core.errors import Conflict
from effects.models import Effect, Session
from orgs.models import Event
from tests.approvals.conftest import hold


def due(body: dict, *, auto: bool = False) -> ApprovalRequest:
    ApprovalRequest.objects.filter(pk=body["approval"]["id"]).update(
        timeout_at=timezone.now() - timedelta(seconds=1), auto_approve_on_timeout=auto)
    return ApprovalRequest.objects.get(pk=body["approval"]["id"])


def test_expire_auto_approves_in_the_name_of_the_deadline(acme):
    body = hold(acme)

    due(body, auto=True).expire()

    approval = ApprovalRequest.objects.get(pk=body["approval"]["id"])
    assert (approval.state, approval.decided_by_label, approval.decided_by) == ("approved", "timeout", None)
    assert Effect.objects.get(pk=body["effect"]["id"]).state == "approved"
    assert Session.objects.get(pk=body["session"]).state == "running"
    assert not Refusal.objects.exists()


def test_expire_without_auto_approve_halts_the_run_and_records_a_refusal(acme):
    body = hold(acme)

    due(body).expire()

    assert Effect.objects.get(pk=body["effect"]["id"]).state == "expired"
    assert Session.objects.get(pk=body["session"]).state == "halted"
    assert Refusal.objects.get().decided_by == "timeout"
    assert Event.objects.get(kind="approval.expired").data["decision"] == "expired"


def test_expire_leaves_a_request_whose_deadline_was_extended(acme):
    body = hold(acme)
    stale = due(body)
    ApprovalRequest.objects.filter(pk=stale.pk).update(timeout_at=timezone.now() + timedelta(minutes=5))

    with pytest.raises(Conflict) as raised:
        stale.expire()

    assert raised.value.code == "not_due"
    assert ApprovalRequest.objects.get(pk=stale.pk).state == "pending"


def test_a_run_that_ended_while_waiting_is_withdrawn_not_auto_approved(acme):
    body = hold(acme)
    Session.objects.get(pk=body["session"]).fail("gave up", actor="agent:cleanup")
    failed_state = Session.objects.get(pk=body["session"]).state

    with pytest.raises(Conflict) as raised:
        due(body, auto=True).expire()  # the deadline sweep comes later: nothing left to decide

    assert raised.value.code == "already_decided"
    assert ApprovalRequest.objects.get(pk=body["approval"]["id"]).state == "expired"
    assert Effect.objects.get(pk=body["effect"]["id"]).state == "expired"
    assert Session.objects.get(pk=body["session"]).state == failed_state


def test_a_decided_request_cannot_expire(acme):
    body = hold(acme)
    approval = ApprovalRequest.objects.get(pk=body["approval"]["id"])
    approval.reject(acme.reviewer.user, "no")

    with pytest.raises(Conflict) as raised:
        due(body).expire()

    assert raised.value.code == "already_decided"
    assert ApprovalRequest.objects.get(pk=body["approval"]["id"]).state == "rejected"
