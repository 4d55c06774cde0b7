"""Who runs an approved call with an executor: only the executor's own claim, never twice.
The delivery is run in-process here (one step at a time); test_executor.py runs it on a worker."""

from __future__ import annotations

from django.utils import timezone

from deliveries import send as delivery
from deliveries.models import Delivery
from effects.models import Effect
from tests.approvals.conftest import hold, irreversible, register
from tests.conftest import open_session


def approved_with_executor(acme, receiver) -> dict:
    register(acme, {**irreversible("wire_money"), "executor": {"url": receiver.url(), "timeout_ms": 2000}})
    held = hold(acme, "wire_money", {"amount": 5}, session=open_session(acme))
    response = acme.reviewer.post(f"/api/v1/approvals/{held['approval']['id']}/approve", {}, format="json")
    assert response.status_code == 200
    return {**held, "delivery": Delivery.objects.get(effect_id=held["effect"]["id"])}


def test_a_caller_that_claimed_the_effect_first_runs_it_and_the_executor_does_not(acme, receiver):
    held = approved_with_executor(acme, receiver)
    assert acme.api.post(f"/api/v1/effects/{held['effect']['id']}/start").status_code == 200

    assert delivery.run(str(held["delivery"].pk)) == "cancelled"

    assert receiver.requests == []
    assert Delivery.objects.get(pk=held["delivery"].pk).state == "cancelled"
    assert Effect.objects.get(pk=held["effect"]["id"]).state == "executing"


def test_a_retry_runs_what_the_executor_claimed_on_its_first_attempt(acme, receiver):
    receiver.statuses = [503, 200]
    held = approved_with_executor(acme, receiver)

    assert delivery.run(str(held["delivery"].pk)) == "retry"
    assert delivery.run(str(held["delivery"].pk)) == "not ours"  # not due yet: the backoff holds
    Delivery.objects.filter(pk=held["delivery"].pk).update(next_attempt_at=timezone.now())
    assert delivery.run(str(held["delivery"].pk)) == "delivered"

    assert len(receiver.requests) == 2
    assert Effect.objects.get(pk=held["effect"]["id"]).state == "committed"
    assert acme.api.post(f"/api/v1/effects/{held['effect']['id']}/start").status_code == 409


def test_a_delivery_that_is_gone_or_done_is_left_alone(acme, receiver):
    held = approved_with_executor(acme, receiver)
    assert delivery.run(str(held["delivery"].pk)) == "delivered"

    assert delivery.run(str(held["delivery"].pk)) == "not ours"
    assert delivery.run("00000000-0000-0000-0000-000000000000") == "gone"
    assert len(receiver.requests) == 1
