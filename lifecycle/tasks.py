"""Celery tasks of the compensation walk: thin, keyed by primary key, safe to run twice.

`acks_late` with `reject_on_worker_lost`: a message is acknowledged only after the walk
returns, and a worker that dies puts it back. Either way the walk re-reads the rows and
claims entries with guarded updates, so a message delivered twice changes nothing; and if a
message is lost altogether, the beat sweep finds the session from its rows.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime

from celery import shared_task
from django.utils import timezone

from core.enqueue import enqueue
from lifecycle import abandon, flagged, rollback, undo

logger = logging.getLogger(__name__)

# The tasks keep the names they had in effects/tasks.py: the beat schedule (settings.py) names
# them, and messages already queued on a broker carry them.
WALK, SWEEP_WALKS, SWEEP_ABANDONED = ("effects.tasks.walk_undo_stack", "effects.tasks.sweep_undo_walks",
                                      "effects.tasks.sweep_abandoned")

# Below the broker's visibility timeout (1 h on Redis), after which it would deliver the
# message again; anything later is left to the sweep, which reads next_attempt_at.
MAX_COUNTDOWN_S = 3000


@shared_task(name=WALK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def walk_undo_stack(session_id: str) -> None:
    next_at = undo.walk(session_id)
    if next_at is not None:
        schedule_walk(session_id, next_at)


@shared_task(name=SWEEP_WALKS, ignore_result=True)
def sweep_undo_walks() -> int:
    """Beat, every few seconds: re-enqueue walks that are due or stalled."""
    due = undo.due_sessions()
    for session_id in due:
        enqueue_walk(session_id)
    for entry_id in flagged.due_entries():  # rejected flagged calls, undone alone
        enqueue(undo_flagged_call, str(entry_id))
    if due:
        logger.debug("undo sweep: re-enqueued %d walk(s)", len(due))
    return len(due)


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def undo_flagged_call(entry_id: str) -> None:
    """A rejected flagged call's undo entry, alone (lifecycle/flagged.py); a retry's time is kept in
    the row, so a countdown past the broker's visibility timeout is left to the sweep."""
    next_at = flagged.undo_one(entry_id)
    if next_at is not None:
        delay = max(0.0, (next_at - timezone.now()).total_seconds())
        if delay <= MAX_COUNTDOWN_S:
            if undo_flagged_call.app.conf.task_always_eager:
                time.sleep(delay)
            enqueue(undo_flagged_call, entry_id, countdown=delay or None)


def on_undo_one_due(sender, entry_id: uuid.UUID | str, **kwargs) -> None:
    """`effects.models.undo_one_due`, sent after the commit that rejected a flagged call."""
    enqueue(undo_flagged_call, str(entry_id))


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def walk_fleet(session_ids: list[str]) -> None:
    """A chunk of a fleet rollback's runs, walked side by side (lifecycle/rollback.py)."""
    left = rollback.walk_fleet(session_ids)
    if left:
        enqueue_fleet_walk(left)


def enqueue_fleet_walk(session_ids: list[uuid.UUID | str]) -> None:
    """Called after commit. Lost, it loses nothing: the sweep walks each run that sits still."""
    enqueue(walk_fleet, [str(pk) for pk in session_ids])


def on_fleet_walk_due(sender, session_ids: list[uuid.UUID | str], **kwargs) -> None:
    """`rollback.fleet_walk_due`, sent after the commit of a fleet rollback, a chunk of runs each."""
    enqueue_fleet_walk(session_ids)


def enqueue_walk(session_id: uuid.UUID | str, countdown: float = 0) -> None:
    """Called after commit. A broker that is down loses nothing: the sweep finds the session."""
    enqueue(walk_undo_stack, str(session_id), countdown=countdown or None)


def on_walk_due(sender, session_id: uuid.UUID | str, **kwargs) -> None:
    """`effects.models.walk_due`, sent after the commit that made a run compensating (or by the walk's
    own modules: an agent's report, a fleet round handing a run to its own walk)."""
    enqueue_walk(session_id)


def schedule_walk(session_id: uuid.UUID | str, at: datetime) -> None:
    delay = max(0.0, (at - timezone.now()).total_seconds())
    if delay > MAX_COUNTDOWN_S:
        return
    if walk_undo_stack.app.conf.task_always_eager:
        # Eager mode (unit tests) runs a countdown at once; honour it, so backoffs stay real.
        time.sleep(delay)
    enqueue_walk(session_id, countdown=delay)


@shared_task(name=SWEEP_ABANDONED, ignore_result=True)
def sweep_abandoned() -> int:
    """Beat, every UNDOLOG_ABANDON_SWEEP_S: fail runs silent past their idle timeout."""
    count = abandon.sweep()
    if count:
        logger.info("abandon sweep: %d run(s) failed as abandoned", count)
    return count
