"""The compensation walk: a rolled-back session's undo stack, newest first, each entry once.

`Session.fail()` and `Session.undo()` move a session to `compensating` and enqueue
`effects.tasks.walk_undo_stack` after commit; that task calls `walk()`. Everything the walk
knows lives in rows (entry state, attempt count, lease, next attempt time), so a lost
message or a dead worker only delays it: `due_sessions()`, run by a beat sweep, finds
walks that are due or stalled and enqueues them again.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from core import retry
from effects import handlers
from effects.models import CompensationFunction, Effect, Session, UndoAttempt, UndoEntry
from orgs.models import Event
from undolog_site.errors import Conflict

logger = logging.getLogger(__name__)

ACTOR = "undo-walk"
# The jitter's random source; a test may swap it for one that always draws the ceiling.
jitter = random.Random()


def walk(session_id: uuid.UUID | str, *, budget_s: float | None = None) -> datetime | None:
    """Walk the session's undo stack back as far as it can go now.

    Returns when to walk again (a retry's time, or now when the time budget is spent), or
    None when there is nothing to schedule: finished, stopped for a person, or another
    worker holds the top entry (if that worker dies, the sweep takes over).

    1. Take the top open entry (highest step first) of the session, if it is `compensating`
       (otherwise there is nothing to do: a finished or escalated walk, or a message
       delivered twice). Order matters: nothing below it is touched until it is done.
    2. None left: the session is `compensated`.
    3. Its effect never started (the tool cannot have acted): skip the entry.
    4. Held by a live claim: stop. Waiting for its backoff: return its next attempt time.
    5. Claim it with a guarded UPDATE on the state and attempt count we read, so two workers
       never run one entry at once; the effect becomes `compensating`. A stalled claim (its
       lease ran out: the worker died) is taken over and recorded as a lost attempt.
    6. Run the handler outside any transaction, under the function's timeout.
    7. Record the attempt, fenced by its number, in one transaction: `compensated`; or
       `pending` again after a full-jitter backoff; or, when permanent or out of retries,
       escalate: entry, effect and session `compensation_failed`, a `compensation.failed`
       event, and the walk stops there until a person retries or resolves the entry.
    8. Go back to 1 until the time budget is spent (after one attempt at least, so every
       task makes progress), then ask to be enqueued again: a long stack must not run into
       the task's time limit.
    """
    budget = settings.UNDOLOG_UNDO_WALK_BUDGET_S if budget_s is None else budget_s
    stop_at, ran = time.monotonic() + budget, False
    functions: dict[int, CompensationFunction] = {}  # read once per task run: a stack repeats a few
    while True:
        entry = (UndoEntry.objects.filter(session_id=session_id, session__state=Session.State.COMPENSATING)
                 .open().lifo().select_related("effect").first())
        if entry is None:
            # Either the session is not compensating, or nothing is left to do.
            _finish(session_id)
            return None
        if entry.fn_id not in functions:
            functions[entry.fn_id] = CompensationFunction.objects.select_related("org").get(pk=entry.fn_id)
        entry.fn = functions[entry.fn_id]
        now = timezone.now()
        if entry.state == UndoEntry.State.COMPENSATION_FAILED:
            return None  # waiting for a person (the session should say so too)
        if entry.effect.state not in Effect.STARTED | {Effect.State.COMPENSATING}:
            if not entry.move({UndoEntry.State.PENDING}, UndoEntry.State.SKIPPED):
                return None  # a claimed entry whose effect never started: leave it to the sweep
            continue
        if entry.state == UndoEntry.State.RUNNING and entry.lease_until and entry.lease_until > now:
            return None
        if entry.state == UndoEntry.State.PENDING and entry.next_attempt_at and entry.next_attempt_at > now:
            return entry.next_attempt_at
        if ran and time.monotonic() > stop_at:
            return now
        number = _claim(entry, now)
        if number is None:
            continue  # another worker got there first, or the claim escalated; look again
        _record(entry, number, handlers.run(entry, entry.fn, number))
        ran = True


def _finish(session_id: uuid.UUID | str) -> None:
    # org_id and step_index too: the move announces the change (session.updated) without a query.
    session = (Session.objects.filter(pk=session_id, state=Session.State.COMPENSATING)
               .only("state", "org_id", "step_index").first())
    if session is None:
        return
    try:
        session.move({Session.State.COMPENSATING}, Session.State.COMPENSATED, actor=ACTOR,
                     reason="undo stack walked back")
    except Conflict:
        pass  # a second walker finished it a moment earlier


def _claim(entry: UndoEntry, now: datetime) -> int | None:
    """Step 5: the attempt number we hold, or None."""
    lease_until = now + timedelta(milliseconds=entry.fn.timeout_ms, seconds=settings.UNDOLOG_UNDO_STALL_S)
    stalled = entry.state == UndoEntry.State.RUNNING
    lost, lost_since = entry.attempts, entry.claimed_at
    with transaction.atomic():
        if stalled and not entry.retries_left:
            if entry.move({UndoEntry.State.RUNNING}, UndoEntry.State.COMPENSATION_FAILED, attempt=lost,
                          lease_until=None, last_error=LOST_ERROR, last_status_code=None):
                _log_lost(entry, lost, lost_since, now)
                _escalate(entry, LOST_ERROR)
            return None
        if not entry.claim(now, lease_until):
            return None
        if stalled:
            _log_lost(entry, lost, lost_since, now)
        # Locked and re-read: the agent may be committing or failing the effect right now, and
        # the history row must name the state it really left.
        effect = Effect.objects.select_for_update().get(pk=entry.effect_id)
        if effect.state in Effect.STARTED:
            effect.start_compensating(ACTOR)
        entry.effect = effect
    return entry.attempts


LOST_ERROR = "no result: the worker died or stalled mid-attempt, and its claim ran out"


def _log_lost(entry: UndoEntry, number: int, since: datetime | None, now: datetime) -> None:
    started = since or now
    UndoAttempt.objects.get_or_create(entry=entry, number=number, defaults={
        "started_at": started, "duration_ms": int((now - started).total_seconds() * 1000),
        "outcome": UndoAttempt.Outcome.LOST, "error": LOST_ERROR})


def _record(entry: UndoEntry, number: int, result: handlers.Result) -> None:
    """Step 7."""
    now = timezone.now()
    started = now - timedelta(milliseconds=result.duration_ms)
    fields = {"lease_until": None, "last_error": result.error[:10_000], "last_status_code": result.status_code}
    with transaction.atomic():
        if result.ok:
            if not entry.move({UndoEntry.State.RUNNING}, UndoEntry.State.COMPENSATED, attempt=number, **fields):
                return _fenced_out(entry, number)
            _log(entry, number, started, result, UndoAttempt.Outcome.SUCCESS)
            entry.effect.mark_compensated(ACTOR)
            # A heartbeat: the sweep leaves a walk alone while its session keeps moving.
            Session.objects.filter(pk=entry.session_id).update(updated=now)
        elif not result.permanent and entry.retries_left:
            delay = backoff_ms(entry.attempts_in_round, entry.retry_backoff_ms)
            if not entry.move({UndoEntry.State.RUNNING}, UndoEntry.State.PENDING, attempt=number,
                              next_attempt_at=now + timedelta(milliseconds=delay), **fields):
                return _fenced_out(entry, number)
            _log(entry, number, started, result, UndoAttempt.Outcome.RETRY, retry_delay_ms=delay)
        else:
            if not entry.move({UndoEntry.State.RUNNING}, UndoEntry.State.COMPENSATION_FAILED, attempt=number,
                              **fields):
                return _fenced_out(entry, number)
            outcome = UndoAttempt.Outcome.PERMANENT if result.permanent else UndoAttempt.Outcome.RETRY
            _log(entry, number, started, result, outcome)
            _escalate(entry, result.error, result.status_code)
    return None


def _fenced_out(entry: UndoEntry, number: int) -> None:
    # Our claim ran out and another worker took the entry over; its attempt is the one that counts.
    logger.warning("undo entry %s: attempt %s finished after its claim was taken over; result dropped",
                   entry.pk, number)


def _log(entry: UndoEntry, number: int, started: datetime, result: handlers.Result, outcome: str,
         retry_delay_ms: int | None = None) -> None:
    UndoAttempt.objects.create(entry=entry, number=number, started_at=started, duration_ms=result.duration_ms,
                               outcome=outcome, status_code=result.status_code, error=result.error[:10_000],
                               retry_delay_ms=retry_delay_ms)


def _escalate(entry: UndoEntry, error: str, status_code: int | None = None) -> None:
    """Effect and session `compensation_failed`, and the event that calls a person."""
    entry.effect.mark_compensation_failed(ACTOR, reason=error)
    session = Session.objects.select_related("org", "agent").get(pk=entry.session_id)
    session.move({Session.State.COMPENSATING}, Session.State.COMPENSATION_FAILED, actor=ACTOR,
                 reason=f"{entry.fn_name}@{entry.fn_version} failed for step {entry.step_index}: {error}")
    Event.record(session.org, "compensation.failed", agent=session.agent, session_id=session.id,
                 undo_entry=str(entry.id), effect=str(entry.effect_id), tool=entry.effect.tool_name,
                 step_index=entry.step_index, fn_name=entry.fn_name, fn_version=entry.fn_version,
                 attempts=entry.attempts, error=error[:2000], status_code=status_code)


def backoff_ms(attempt: int, base_ms: int) -> int:
    """The wait after the `attempt`-th failure of a round: full jitter, a uniform draw between 0
    and base·2^(attempt−1), capped (AWS, "Exponential Backoff And Jitter"). Jitter spreads the
    retries of many walks that failed together against one receiver. The one backoff of every
    retried call (`core.retry`), in milliseconds."""
    return round(1000 * retry.backoff_s(attempt, base_ms / 1000, settings.UNDOLOG_UNDO_MAX_BACKOFF_S, rng=jitter))


def due_sessions(now: datetime | None = None, limit: int = 500) -> list[uuid.UUID]:
    """Compensating sessions that no worker is moving: what the beat sweep enqueues again.

    Due: the top entry's claim ran out (its worker died); its retry time passed a while ago
    (the countdown message was lost); or the session sat still a while between entries or
    after the last one (the walker died between two steps).
    """
    now = now or timezone.now()
    quiet = now - timedelta(seconds=settings.UNDOLOG_UNDO_STALL_S)
    top = UndoEntry.objects.filter(session=OuterRef("pk")).open().lifo()
    sessions = Session.objects.filter(state=Session.State.COMPENSATING).annotate(
        top_state=Subquery(top.values("state")[:1]),
        top_due=Subquery(top.values("next_attempt_at")[:1]),
        top_lease=Subquery(top.values("lease_until")[:1]),
    )
    due = sessions.filter(
        Q(top_state__isnull=True, updated__lt=quiet)
        | Q(top_state=UndoEntry.State.PENDING, top_due__isnull=True, updated__lt=quiet)
        | Q(top_state=UndoEntry.State.PENDING, top_due__lt=quiet)
        | Q(top_state=UndoEntry.State.RUNNING, top_lease__lt=now)
    )
    return list(due.order_by("updated").values_list("pk", flat=True)[:limit])
