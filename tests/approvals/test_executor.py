"""A tool registered with an executor webhook: once approved, the worker runs the call (signed,
`Idempotency-Key: <effect id>`), commits or fails the effect, and the agent's resubmission replays."""

from __future__ import annotations

import pytest

from approvals import webhooks
from deliveries.models import Delivery, DeliveryAttempt
from effects.models import Effect, EffectTransition, Session
from tests.approvals.conftest import hold, irreversible, register
from tests.approvals.receiver import Receiver
from tests.conftest import eventually, intercept, make_persona, open_session

pytestmark = pytest.mark.django_db(transaction=True)


def executor_tool(receiver: Receiver) -> dict:
    return {**irreversible("wire_money"), "executor": {"url": receiver.url("/execute"), "timeout_ms": 2000}}


def approve(persona, held: dict) -> None:
    response = persona.reviewer.post(f"/api/v1/approvals/{held['approval']['id']}/approve", {"reason": "ok"},
                                     format="json")
    assert response.status_code == 200, response.content


def test_the_worker_executes_an_approved_call_and_commits_what_the_executor_answered(worker):
    receiver = Receiver(answer={"transfer": "tr_1"})
    acme = make_persona("acme")
    register(acme, executor_tool(receiver))
    session = open_session(acme)
    held = hold(acme, "wire_money", {"amount": 100, "to": "acct-9"}, session=session)
    assert held["effect"]["executor"] is True

    approve(acme, held)
    answer = eventually(lambda: (acme.api.get(f"/api/v1/effects/{held['effect']['id']}?wait=5").json()
                                 if Effect.objects.get(pk=held["effect"]["id"]).state == "committed" else None))

    [request] = receiver.requests
    assert request.path == "/execute"
    assert request.headers["Idempotency-Key"] == held["effect"]["id"]
    assert webhooks.verify([acme.org.webhook_secret], request.headers["Undolog-Signature"], request.body)
    assert request.json()["args"] == {"amount": 100, "to": "acct-9"}
    assert request.json()["approval"]["decided_by"] == "acme-reviewer"
    assert answer["effect"]["result"] == {"transfer": "tr_1"}
    assert [(t.from_state, t.to_state, t.actor) for t in EffectTransition.objects.filter(
        effect_id=held["effect"]["id"])] == [("pending", "approved", "acme-reviewer"),
                                             ("approved", "executing", "executor"),
                                             ("executing", "committed", "executor")]
    replay = intercept(acme, session, "wire_money", {"amount": 100, "to": "acct-9"}, 1).json()
    assert (replay["decision"], replay["effect"]["result"]) == ("replay", {"transfer": "tr_1"})
    assert Session.objects.get(pk=session).state == "running"
    receiver.close()


def test_a_failing_executor_is_retried_with_the_same_key_then_the_effect_fails(worker):
    receiver = Receiver(statuses=[500])
    acme = make_persona("acme")
    register(acme, executor_tool(receiver))
    held = hold(acme, "wire_money", {"amount": 5}, session=open_session(acme))

    approve(acme, held)
    eventually(lambda: Effect.objects.get(pk=held["effect"]["id"]).state == "failed")

    assert len(receiver.requests) == 3  # UNDOLOG_EXECUTOR_MAX_ATTEMPTS
    assert {r.headers["Idempotency-Key"] for r in receiver.requests} == {held["effect"]["id"]}
    delivery = Delivery.objects.get(effect_id=held["effect"]["id"])
    assert (delivery.state, delivery.attempts, delivery.last_status_code) == ("failed", 3, 500)
    assert list(DeliveryAttempt.objects.filter(delivery=delivery).values_list("number", flat=True)) == [1, 2, 3]
    assert "after 3 attempt(s)" in Effect.objects.get(pk=held["effect"]["id"]).error
    receiver.close()


def test_a_refused_execution_is_not_retried(worker):
    receiver = Receiver(statuses=[422])
    acme = make_persona("acme")
    register(acme, executor_tool(receiver))
    held = hold(acme, "wire_money", {"amount": 5}, session=open_session(acme))

    approve(acme, held)
    eventually(lambda: Effect.objects.get(pk=held["effect"]["id"]).state == "failed")

    assert len(receiver.requests) == 1
    assert Delivery.objects.get(effect_id=held["effect"]["id"]).state == "failed"
    receiver.close()


def test_a_rejected_call_never_reaches_its_executor(worker):
    receiver = Receiver()
    acme = make_persona("acme")
    register(acme, executor_tool(receiver))
    held = hold(acme, "wire_money", {"amount": 5}, session=open_session(acme))

    acme.reviewer.post(f"/api/v1/approvals/{held['approval']['id']}/reject", {"reason": "no"}, format="json")

    assert not Delivery.objects.filter(effect_id=held["effect"]["id"]).exists()
    assert receiver.requests == []
    receiver.close()
