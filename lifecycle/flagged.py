"""Undo one flagged call alone (issue 38): "run now, review after".

A rule may `flag` a compensable call: it runs at once and an approval request of its own opens
(`ApprovalRequest.flagged`). A reviewer who rejects it undoes that call alone, while its run goes
on: its undo entry, through the walk's own claim and record (`lifecycle.undo`), exactly once:

1. Read the entry; nothing to do unless it is open (`pending`, or `running` with a lease that ran
   out) and its request is a rejected flagged one.
2. Its effect never started: skip it. A template that needs a result the call never committed:
   the entry goes to a person (as the walk does).
3. Claim it with the walk's guarded UPDATE (state and attempt count): of any number of workers,
   messages and sweeps, one holds it; the handler gets the entry id as `Idempotency-Key`.
4. Run the handler outside any transaction; record the attempt fenced by its number:
   `compensated`; or `pending` again after a backoff (the sweep, `due_entries`, picks it up when
   due); or `compensation_failed` with a `compensation.failed` event. Unlike the walk, the run is
   left alone: only this call was rejected.

An entry whose undo runs on the agent side (handler `agent`) is claimed by the agent only while
its run rolls back: rejecting such a flagged call alone leaves it to a person (its entry is
marked, with the reason), and a rollback of the run still undoes it.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from effects import handlers
from effects.models import CompensationFunction, Effect, Session, UndoAttempt, UndoEntry
from lifecycle import attempts
from orgs.models import Event

logger = logging.getLogger(__name__)

ACTOR = "undo-flagged"


def undo_one(entry_id: uuid.UUID | str) -> datetime | None:
    """Undo one rejected flagged call (steps above). Returns when to try again, or None."""
    entry = _rejected_flagged(entry_id)
    if entry is None:
        return None
    entry.fn = CompensationFunction.objects.select_related("org").get(pk=entry.fn_id)
    now = timezone.now()
    if entry.effect.state not in Effect.STARTED | {Effect.State.COMPENSATING}:
        entry.move({UndoEntry.State.PENDING}, UndoEntry.State.SKIPPED)
        return None
    if entry.args_template is not None and entry.state == UndoEntry.State.PENDING \
            and entry.effect.state in (Effect.State.EXECUTING, Effect.State.FAILED):
        entry.flag(f"the call never committed ({entry.effect.state}): no result to render the undo from; "
                   "undo it by hand")
        return None
    if entry.fn.handler == CompensationFunction.Handler.AGENT:
        entry.flag("a flagged call was rejected, and its undo runs on the agent side, which claims entries only "
                   "while the run rolls back: undo it by hand, or reject again with rollback")
        return None
    if entry.state == UndoEntry.State.RUNNING and entry.lease_until and entry.lease_until > now:
        return None  # another worker holds it
    if entry.state == UndoEntry.State.PENDING and entry.next_attempt_at and entry.next_attempt_at > now:
        return entry.next_attempt_at
    if entry.state == UndoEntry.State.RUNNING and not entry.retries_left:
        return None  # a stalled last attempt: left to a person (compensation_failed by hand)
    number = attempts.claim(entry, now)
    if number is None:
        return None
    return _record(entry, number, handlers.run(entry, entry.fn, number))


def _rejected_flagged(entry_id: uuid.UUID | str) -> UndoEntry | None:
    entry = UndoEntry.objects.select_related("effect").filter(pk=entry_id).first()
    if entry is None or entry.state not in (UndoEntry.State.PENDING, UndoEntry.State.RUNNING):
        return None
    from approvals.models import ApprovalRequest  # lifecycle sits above approvals: a plain import

    rejected = ApprovalRequest.objects.filter(effect_id=entry.effect_id, flagged=True,
                                              state=ApprovalRequest.State.REJECTED).exists()
    return entry if rejected else None


def _record(entry: UndoEntry, number: int, result: handlers.Result) -> datetime | None:
    now = timezone.now()
    started = now - timedelta(milliseconds=result.duration_ms)
    fields = {"lease_until": None, "last_error": result.error[:10_000], "last_status_code": result.status_code}
    with transaction.atomic():
        effect = Effect.objects.select_for_update().get(pk=entry.effect_id)
        if result.ok:
            if entry.move({UndoEntry.State.RUNNING}, UndoEntry.State.COMPENSATED, attempt=number, **fields):
                attempts.log_attempt(entry, number, started, result, UndoAttempt.Outcome.SUCCESS)
                if effect.state in (Effect.State.COMPENSATING, Effect.State.COMPENSATION_FAILED):
                    effect.mark_compensated(ACTOR, reason="a reviewer rejected the flagged call")
            return None
        if not result.permanent and entry.retries_left:
            delay = attempts.backoff_ms(entry.attempts_in_round, entry.retry_backoff_ms)
            at = now + timedelta(milliseconds=delay)
            if entry.move({UndoEntry.State.RUNNING}, UndoEntry.State.PENDING, attempt=number, next_attempt_at=at,
                          **fields):
                attempts.log_attempt(entry, number, started, result, UndoAttempt.Outcome.RETRY, retry_delay_ms=delay)
            return at
        if entry.move({UndoEntry.State.RUNNING}, UndoEntry.State.COMPENSATION_FAILED, attempt=number, **fields):
            outcome = UndoAttempt.Outcome.PERMANENT if result.permanent else UndoAttempt.Outcome.RETRY
            attempts.log_attempt(entry, number, started, result, outcome)
            if effect.state == Effect.State.COMPENSATING:
                effect.mark_compensation_failed(ACTOR, reason=result.error[:2000])
            session = Session.objects.select_related("org", "agent").get(pk=entry.session_id)
            Event.record(session.org, "compensation.failed", agent=session.agent, session_id=session.id,
                         undo_entry=str(entry.id), effect=str(entry.effect_id), tool=effect.tool_name,
                         step_index=entry.step_index, fn_name=entry.fn_name, fn_version=entry.fn_version,
                         attempts=entry.attempts, error=result.error[:2000], status_code=result.status_code,
                         flagged=True)
    return None


def due_entries(now: datetime | None = None, limit: int = 200) -> list[uuid.UUID]:
    """Entries of rejected flagged calls that nobody is moving: pending and due (a lost message,
    a retry's time), or running with a lease that ran out (a worker died)."""
    from approvals.models import ApprovalRequest

    now = now or timezone.now()
    quiet = now - timedelta(seconds=settings.UNDOLOG_UNDO_STALL_S)
    rejected = ApprovalRequest.objects.filter(flagged=True, state=ApprovalRequest.State.REJECTED,
                                              decided_at__lt=quiet).values("effect_id")
    rows = UndoEntry.objects.filter(effect_id__in=rejected).exclude(session__state=Session.State.COMPENSATING)
    due = Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now)
    rows = rows.filter((Q(state=UndoEntry.State.PENDING) & due) | Q(state=UndoEntry.State.RUNNING, lease_until__lt=now))
    return list(rows.values_list("pk", flat=True)[:limit])
