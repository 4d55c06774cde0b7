"""Celery tasks of approvals: thin, take primary keys, claim rows with guarded updates.

Beat runs the two sweeps (CELERY_BEAT_SCHEDULE in settings.py): deadlines every 2 s and the
outbox's undispatched events every 5 s, so a worker or beat that was down catches up from
the rows on restart. Deliveries are sent by `deliveries.tasks`.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from approvals import notify, slack
from approvals.models import ApprovalRequest, SlackMessage
from core.enqueue import enqueue
from core.errors import Conflict
from orgs.models import Event

log = logging.getLogger(__name__)
SWEEP_BATCH = 500
# A Slack message row not in step this long after it was written lost its task (or Slack was down).
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


@shared_task(ignore_result=True)
def sweep_events() -> int:
    """The outbox: fan out events recorded more than UNDOLOG_OUTBOX_GRACE_S ago and still not
    fanned out (the process that recorded them died, or its fan-out failed). Each dispatch
    claims its event, so a sweep racing the recording process sends nothing twice."""
    cutoff = timezone.now() - timedelta(seconds=settings.UNDOLOG_OUTBOX_GRACE_S)
    pending = list(Event.objects.undispatched(cutoff).select_related("org", "agent")[:SWEEP_BATCH])
    dispatched = 0
    for event in pending:
        try:
            dispatched += notify.dispatch(event) is not None
        except Exception:
            log.exception("could not dispatch event %s", event.pk)
    return dispatched


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def sync_slack(message_id: str) -> str:
    return slack.sync(message_id)


def on_slack_message_due(sender, message_id: str, **kwargs) -> None:
    """`slack.message_due`, sent after the commit that wrote a message row out of step."""
    enqueue(sync_slack, message_id)


@shared_task(ignore_result=True)
def sweep_slack() -> int:
    """Messages not posted, or showing a state their request has left (a lost task, Slack down)."""
    ids = list(SlackMessage.objects.unsynced().filter(created__lte=timezone.now() - LOST_MESSAGE_GRACE)
               .values_list("pk", flat=True)[:SWEEP_BATCH])
    for pk in ids:
        enqueue(sync_slack, str(pk))
    return len(ids)
