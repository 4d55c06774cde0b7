"""Celery tasks of deliveries: thin, take primary keys, claim rows with guarded updates.

Beat runs `sweep` every 5 s (CELERY_BEAT_SCHEDULE): rows due but unheld past a grace lost
their message (or their worker died holding them), so a worker or beat that was down catches
up from the rows on restart.
"""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task

from core.enqueue import enqueue
from deliveries import send
from deliveries.models import Delivery

SWEEP_BATCH = 500
# A row due this long and not held lost its message (or the queue is that far behind;
# a duplicate message is then harmless: the claim lets one through).
LOST_MESSAGE_GRACE = timedelta(seconds=10)


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def deliver(delivery_id: str) -> str:
    return send.run(delivery_id)


def on_delivery_due(sender, delivery_id: str, countdown: float | None = None, **kwargs) -> None:
    """`models.delivery_due`, sent after the commit that wrote a row or set its retry's time."""
    enqueue(deliver, delivery_id, countdown=countdown)


@shared_task(ignore_result=True)
def sweep() -> int:
    """Re-enqueue deliveries that are due but unheld past the grace: their message was lost."""
    ids = list(Delivery.objects.due(grace=LOST_MESSAGE_GRACE).order_by("next_attempt_at")
               .values_list("pk", flat=True)[:SWEEP_BATCH])
    for pk in ids:
        enqueue(deliver, str(pk))
    return len(ids)
