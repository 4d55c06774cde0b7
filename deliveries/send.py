"""Sending one delivery row, whatever its purpose.

Run by the `deliver` task; safe to run twice for the same row (a redelivered message, the
sweep and a retry countdown may all arrive): the guarded claim lets one through at a time.
What is special about a purpose is registered by the app that queues it (`register`):
approvals' executor moves its effect before the POST and commits or fails it after.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from core import metrics, outbound
from deliveries.models import Delivery, DeliveryAttempt, delivery_due

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Purpose:
    """What an app adds to the one mechanism for its purpose.

    `start(delivery, number) -> bool`: before the call, outside a transaction; False cancels
    (the row is then settled by `start` itself). `settled(delivery, outcome, result, number)`:
    inside the transaction that records the attempt, once the outcome is ours (lease held).
    """

    start: Callable[[Delivery, int], bool] | None = None
    settled: Callable[[Delivery, str, outbound.Delivery, int], None] | None = None


PURPOSES: dict[str, Purpose] = {}


def register(purpose: str, *, start=None, settled=None) -> None:
    PURPOSES[purpose] = Purpose(start=start, settled=settled)


def run(delivery_id: str) -> str:
    """1. Claim the row (due, unheld; the claim counts the attempt).
    2. The purpose's `start`, if any (an execution moves its effect approved → executing, or is
       cancelled if the effect has moved on).
    3. Send, outside any transaction: a signed POST (`core.outbound`), or the email.
    4. In one transaction: the attempt row and the outcome: delivered, retry later
       (the one backoff, state in the row, a short countdown as the fast path), or failed;
       then the purpose's `settled` (an execution commits or fails its effect with it).
    """
    delivery = Delivery.objects.select_related("webhook", "org").filter(pk=delivery_id).first()
    if delivery is None:
        return "gone"
    number = delivery.claim()
    if number is None:
        return "not ours"
    purpose = PURPOSES.get(delivery.purpose, Purpose())
    if purpose.start is not None and not purpose.start(delivery, number):
        return "cancelled"
    started = timezone.now()
    result = _email(delivery) if delivery.purpose == Delivery.Purpose.EMAIL else outbound.post(
        delivery.url, delivery.body, secret=delivery.secret, timeout_s=delivery.timeout_ms / 1000,
        headers=delivery.headers())
    outcome = _settle(delivery, number, started, result, purpose)
    metrics.webhook_delivery(delivery.purpose, outcome)
    return outcome


def _email(delivery: Delivery) -> outbound.Delivery:
    """An email as a delivery: the backend raising (SMTP down) is a retryable failure."""
    started = time.perf_counter()
    body = delivery.body
    try:
        send_mail(body["subject"], body["message"], settings.DEFAULT_FROM_EMAIL, body["recipients"])
    except Exception as exc:  # any backend error: the row retries, the sweep keeps it
        log.warning("email delivery %s failed: %s", delivery.pk, exc)
        return outbound.Delivery(False, None, f"{type(exc).__name__}: {exc}", _ms(started))  # retryable
    return outbound.Delivery(True, None, "", _ms(started))


def _ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


def _settle(delivery: Delivery, number: int, started, result: outbound.Delivery, purpose: Purpose) -> str:
    now = timezone.now()
    with transaction.atomic():
        DeliveryAttempt.objects.create(delivery=delivery, number=number, started_at=started,
                                       duration_ms=result.duration_ms, ok=result.ok,
                                       status_code=result.status_code, error=result.error[:5000])
        common = {"last_status_code": result.status_code, "last_error": result.error[:5000]}
        if result.ok:
            outcome = "delivered"
            owned = delivery.finish(state=Delivery.State.DELIVERED, delivered_at=now, **common)
        elif result.retryable and number < delivery.max_attempts:
            outcome = "retry"
            wait = delivery.backoff(number)
            owned = delivery.finish(next_attempt_at=now + wait, **common)
            if owned:
                transaction.on_commit(lambda: _enqueue(delivery.pk, wait.total_seconds()))
        else:
            outcome = "failed"
            owned = delivery.finish(state=Delivery.State.FAILED, **common)
        if owned and purpose.settled is not None:
            purpose.settled(delivery, outcome, result, number)
    if not owned:
        log.warning("delivery %s: lease lost before attempt %s finished", delivery.pk, number)
    return outcome


def _enqueue(delivery_id, countdown: float) -> None:
    # Short countdowns only (<= 1 h, the broker's visibility timeout); the row has the time too.
    delivery_due.send(sender=Delivery, delivery_id=str(delivery_id), countdown=min(countdown, Delivery.MAX_BACKOFF_S))
