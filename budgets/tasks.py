"""Celery tasks of budgets: deliver escalation webhooks, and sweep the ones a lost message left behind."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.db.models import Q
from django.utils import timezone

from budgets.models import Escalation
from core import metrics, outbound, retry

TIMEOUT_S = 10
MAX_COUNTDOWN_S = 3600  # never past the broker's visibility timeout (DESIGN)


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def deliver_escalation(escalation_id: str) -> None:
    """1. Claim the row (a guarded update: one worker at a time, a redelivered message is harmless).
    2. POST the signed payload with `Idempotency-Key: <escalation id>`.
    3. Delivered, or retried with backoff (state in the row), or failed for good."""
    escalation = _claim(escalation_id)
    if escalation is None:
        return
    delivery = outbound.post(escalation.url, escalation.payload, secret=escalation.org.webhook_secret,
                             timeout_s=TIMEOUT_S, headers={"Idempotency-Key": str(escalation.id)})
    attempts = escalation.attempts + 1
    mine = Escalation.objects.filter(pk=escalation.pk, state=Escalation.State.SENDING,
                                     claimed_at=escalation.claimed_at)
    metrics.webhook_delivery("escalation", "delivered" if delivery.ok else "retry" if delivery.retryable
                             and attempts < Escalation.MAX_ATTEMPTS else "failed")
    if delivery.ok:
        mine.update(state=Escalation.State.DELIVERED, attempts=attempts, status_code=delivery.status_code,
                    last_error="", delivered_at=timezone.now())
    elif delivery.retryable and attempts < Escalation.MAX_ATTEMPTS:
        delay = retry.backoff_s(attempts, Escalation.BACKOFF_S, MAX_COUNTDOWN_S, spread=0.5)
        if mine.update(state=Escalation.State.PENDING, attempts=attempts, status_code=delivery.status_code,
                       last_error=delivery.error[:2000], next_attempt_at=timezone.now() + timedelta(seconds=delay)):
            deliver_escalation.apply_async((str(escalation.id),), countdown=delay)
    else:
        mine.update(state=Escalation.State.FAILED, attempts=attempts, status_code=delivery.status_code,
                    last_error=delivery.error[:2000])


def _claim(escalation_id: str) -> Escalation | None:
    now = timezone.now()
    stalled = now - timedelta(seconds=Escalation.CLAIM_TIMEOUT_S)
    claimable = (Q(state=Escalation.State.PENDING, next_attempt_at__lte=now) |
                 Q(state=Escalation.State.SENDING, claimed_at__lt=stalled))
    if not Escalation.objects.filter(claimable, pk=escalation_id).update(state=Escalation.State.SENDING,
                                                                         claimed_at=now):
        return None
    return Escalation.objects.select_related("org").get(pk=escalation_id)


@shared_task(ignore_result=True)
def sweep_escalations() -> int:
    """Beat: re-enqueue escalations that are due, or whose worker died holding them."""
    due = list(Escalation.objects.due().values_list("pk", flat=True)[:500])
    for pk in due:
        deliver_escalation.delay(str(pk))
    return len(due)
