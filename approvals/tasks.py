"""Celery tasks of approvals: thin, take primary keys, claim rows with guarded updates.

Beat runs the two sweeps (CELERY_BEAT_SCHEDULE in settings.py): deadlines every 2 s and
deliveries whose message was lost every 5 s, so a worker or beat that was down catches up
from the rows on restart.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task

from approvals import delivery, notify
from approvals.models import ApprovalRequest, WebhookDelivery
from orgs.models import Event
from undolog_site.errors import Conflict

log = logging.getLogger(__name__)
SWEEP_BATCH = 500
# A row due this long and not held lost its message (or the queue is that far behind;
# a duplicate message is then harmless: the claim lets one through).
LOST_MESSAGE_GRACE = timedelta(seconds=10)


@shared_task(ignore_result=True)
def sweep_deadlines() -> int:
    """Decide every request whose deadline passed: auto-approve or expire (guarded updates)."""
    due = ApprovalRequest.objects.due().order_by("timeout_at").values_list("pk", flat=True)[:SWEEP_BATCH]
    decided = 0
    for pk in list(due):
        approval = ApprovalRequest.objects.select_related("org", "session").filter(pk=pk).first()
        if approval is None:
            continue
        try:
            approval.expire()
            decided += 1
        except Conflict as exc:
            log.debug("approval %s not expired: %s", pk, exc.message)  # decided or extended first
    return decided


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def deliver(delivery_id: str) -> str:
    return delivery.run(delivery_id)


@shared_task(ignore_result=True)
def sweep_deliveries() -> int:
    """Re-enqueue deliveries that are due but unheld past the grace: their message was lost."""
    ids = list(WebhookDelivery.objects.due(grace=LOST_MESSAGE_GRACE).values_list("pk", flat=True)[:SWEEP_BATCH])
    for pk in ids:
        deliver.delay(str(pk))
    return len(ids)


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def email_event(event_id: str) -> int:
    event = Event.objects.select_related("org", "agent").filter(pk=event_id).first()
    return notify.email(event) if event is not None else 0
