"""Sending one delivery row: an org webhook's event, or an approved call to its tool's executor.

Run by the `deliver` task; safe to run twice for the same row (a redelivered message, the
sweep and a retry countdown may all arrive): the guarded claim lets one through at a time.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals.models import DeliveryAttempt, WebhookDelivery
from core import outbound as webhooks
from core.enqueue import enqueue
from effects.models import Effect, EffectTransition
from undolog_site.errors import Conflict

log = logging.getLogger(__name__)
EXECUTOR_ACTOR = "executor"


def run(delivery_id: str) -> str:
    """1. Claim the row (due, unheld; the claim counts the attempt).
    2. An execution first moves its effect approved → executing (or is cancelled if the
       effect has moved on: the caller committed it, say).
    3. POST, signed, outside any transaction.
    4. In one transaction: the attempt row and the outcome: delivered, retry later
       (exponential backoff, state in the row, a short countdown as the fast path), or failed;
       an execution commits or fails its effect with it.
    """
    delivery = (WebhookDelivery.objects.select_related("webhook", "org").filter(pk=delivery_id).first())
    if delivery is None:
        return "gone"
    number = delivery.claim()
    if number is None:
        return "not ours"
    if delivery.purpose == WebhookDelivery.Purpose.EXECUTOR and not _start_execution(delivery, number):
        return "cancelled"
    started = timezone.now()
    result = webhooks.post(delivery.url, delivery.body, secret=delivery.secret,
                           timeout_s=delivery.timeout_ms / 1000, headers=delivery.headers())
    return _settle(delivery, number, started, result)


def _start_execution(delivery: WebhookDelivery, number: int) -> bool:
    """Run only what the executor itself claimed: the first attempt moves the effect
    approved → executing; later ones find it executing by the executor (a retry, or a worker
    that died after claiming). A caller that claimed it first (`POST /effects/{id}/start`)
    runs it instead, so nothing runs twice."""
    effect = Effect.objects.get(pk=delivery.effect_id)
    if effect.state == Effect.State.APPROVED:
        try:
            effect.start_executing(actor=EXECUTOR_ACTOR)
        except Conflict:
            effect.refresh_from_db()
        else:
            return True
    if number > 1 and effect.state == Effect.State.EXECUTING and _claimed_by_executor(effect):
        return True
    delivery.finish(state=WebhookDelivery.State.CANCELLED,
                    last_error=f"The effect is {effect.state} and not the executor's to run.")
    return False


def _claimed_by_executor(effect: Effect) -> bool:
    claim = (EffectTransition.objects.filter(effect_id=effect.pk, to_state=Effect.State.EXECUTING)
             .order_by("-created", "-id").values_list("actor", flat=True).first())
    return claim == EXECUTOR_ACTOR


def _settle(delivery: WebhookDelivery, number: int, started, result: webhooks.Delivery) -> str:
    now = timezone.now()
    executor = delivery.purpose == WebhookDelivery.Purpose.EXECUTOR
    with transaction.atomic():
        DeliveryAttempt.objects.create(delivery=delivery, number=number, started_at=started,
                                       duration_ms=result.duration_ms, ok=result.ok,
                                       status_code=result.status_code, error=result.error[:5000])
        common = {"last_status_code": result.status_code, "last_error": result.error[:5000]}
        if result.ok:
            outcome = "delivered"
            owned = delivery.finish(state=WebhookDelivery.State.DELIVERED, delivered_at=now, **common)
            if owned and executor:
                _effect_verb(delivery, "commit", _result_of(result))
        elif result.retryable and number < delivery.max_attempts:
            outcome = "retry"
            wait = delivery.backoff(number)
            owned = delivery.finish(next_attempt_at=now + wait, **common)
            if owned:
                transaction.on_commit(lambda: _enqueue(delivery.pk, wait.total_seconds()))
        else:
            outcome = "failed"
            owned = delivery.finish(state=WebhookDelivery.State.FAILED, **common)
            if owned and executor:
                _effect_verb(delivery, "fail", f"The executor failed after {number} attempt(s): {result.error}")
    if not owned:
        log.warning("delivery %s: lease lost before attempt %s finished", delivery.pk, number)
    return outcome


def _effect_verb(delivery: WebhookDelivery, verb: str, value: Any) -> None:
    effect = Effect.objects.get(pk=delivery.effect_id)
    try:
        getattr(effect, verb)(value, actor=EXECUTOR_ACTOR)
    except Conflict:
        # The guarded UPDATE changed nothing (no database error), so the attempt row stands.
        log.warning("executor %s of effect %s: the effect is %s", verb, effect.pk, effect.state)


def _result_of(result: webhooks.Delivery) -> Any:
    if not result.body:
        return None
    try:
        return json.loads(result.body)
    except ValueError:
        return {"status_code": result.status_code, "body": result.body}


def _enqueue(delivery_id, countdown: float) -> None:
    from approvals import tasks

    # Short countdowns only (<= 1 h, the broker's visibility timeout); the row has the time too.
    enqueue(tasks.deliver, str(delivery_id), countdown=min(countdown, 3600))
