"""What every walk shares: an undo entry's attempts, from the top entry's read to a person called.

The walk of one run (`undo.walk`), the agent side's claims and reports (`claims`), a fleet
rollback's rounds (`rollback.walk_fleet`) and a rejected flagged call undone alone (`flagged`) all
take an entry the same way, so none of them may diverge on what makes exactly-once hold:

1. Read the top open entry of a compensating run (`top_entry`; `TOP_COLUMNS` and `TOP_FROM` are
   the same read for many runs at once) with its effect.
2. Claim it with a guarded UPDATE on the state and attempt count read (`claim`): of any number of
   workers, one holds it, for the function's timeout plus `UNDOLOG_UNDO_STALL_S`; a stalled claim
   taken over is logged as a lost attempt (`log_lost`).
3. Record the attempt's outcome fenced by its number (`record`): `compensated`; `pending` again
   after a full-jitter backoff (`backoff_ms`); or out of retries (or permanent) `escalate`d: entry,
   effect and run `compensation_failed` and the `compensation.failed` event that calls a person. A
   worker whose claim was taken over writes nothing (`fenced_out`).

On PostgreSQL the claim of a pending entry and the record of a success are one prepared statement
each (`core.prepared`); everything else takes the ORM.
"""

from __future__ import annotations

import logging
import random
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from core import metrics, prepared, retry
from effects import handlers, longpoll
from effects.models import Effect, Session, UndoAttempt, UndoEntry
from orgs.models import Event

logger = logging.getLogger(__name__)

ACTOR = "undo-walk"
LOST_ERROR = "no result: the worker died or stalled mid-attempt, and its claim ran out"
# The loop's "not read yet" (None means read, and there is none).
UNREAD = object()
# The jitter's random source; a test may swap it for one that always draws the ceiling.
jitter = random.Random()

_ENTRY_FIELDS, _EFFECT_FIELDS = UndoEntry._meta.concrete_fields, Effect._meta.concrete_fields
TOP_COLUMNS = (", ".join(f"u.{f.column}" for f in _ENTRY_FIELDS) + ", "
               + ", ".join(f"e.{f.column}" for f in _EFFECT_FIELDS))

# The open states written out, not a parameter: a prepared statement's generic plan can then
# prove the partial index's condition (undo_stack_open_lifo) and use it.
TOP_FROM = f"""
FROM effects_undoentry u
JOIN effects_session s ON s.id = u.session_id AND s.state = 'compensating'
    AND u.step_index > COALESCE(s.rewind_to, -1)  -- a rewind walks only the entries above its step
JOIN effects_effect e ON e.id = u.effect_id
WHERE u.session_id = %(session)s AND u.state IN ({", ".join(f"'{state}'" for state in sorted(UndoEntry.OPEN))})"""

_TOP = f"SELECT {TOP_COLUMNS} {TOP_FROM} ORDER BY u.step_index DESC, u.created DESC LIMIT 1"


def top_entry(session_id: uuid.UUID | str) -> UndoEntry | None:
    """Step 1's read: the session's top open entry with its effect, if the session is compensating.
    On PostgreSQL a prepared statement: the ORM's compile and PostgreSQL's planning were ~2 of
    its 2.8 ms, once per compensation."""
    if not prepared.available():
        return (UndoEntry.objects.filter(session_id=session_id, session__state=Session.State.COMPENSATING)
                .filter(step_index__gt=Coalesce(F("session__rewind_to"), -1))  # a rewind walks above its step
                .open().lifo().select_related("effect").first())
    row = prepared.execute(_TOP, {"session": session_id})
    return entry_of(row) if row is not None else None


def entry_of(columns: tuple | list) -> UndoEntry | None:
    """The entry with its effect from `TOP_COLUMNS` (None when they are NULL: there is none)."""
    if columns[0] is None:
        return None
    entry = prepared.instance(UndoEntry, columns[:len(_ENTRY_FIELDS)])
    entry.effect = prepared.instance(Effect, columns[len(_ENTRY_FIELDS):])
    return entry


def claim(entry: UndoEntry, now: datetime) -> int | None:
    """Step 5 of `undo.walk`: the attempt number we hold, or None."""
    lease = timedelta(milliseconds=entry.fn.timeout_ms, seconds=settings.UNDOLOG_UNDO_STALL_S)
    stalled = entry.state == UndoEntry.State.RUNNING
    if not stalled and prepared.available():
        return _claim_at_once(entry, now, lease)
    lost, lost_since = entry.attempts, entry.claimed_at
    with transaction.atomic():
        if stalled and not entry.retries_left:
            if entry.move({UndoEntry.State.RUNNING}, UndoEntry.State.COMPENSATION_FAILED, attempt=lost,
                          lease_until=None, last_error=LOST_ERROR, last_status_code=None):
                log_lost(entry, lost, lost_since, now)
                escalate(entry, LOST_ERROR)
            return None
        if not entry.claim(lease):
            return None
        if stalled:
            log_lost(entry, lost, lost_since, now)
        # Locked and re-read: the agent may be committing or failing the effect right now, and
        # the history row must name the state it really left.
        effect = Effect.objects.select_for_update().get(pk=entry.effect_id)
        if effect.state in Effect.STARTED:
            effect.start_compensating(ACTOR)
        entry.effect = effect
    return entry.attempts


# PostgreSQL: the claim of a pending entry and the record of a success are one statement each
# (autocommit, atomic on their own), instead of two transactions of four and five statements.
# The effect row is locked (FOR UPDATE in the statement) so its history names the state it
# really left, as in the ORM path; everything else (a stalled claim, a retry, an escalation)
# stays on the ORM path below.
#
# The claim commits without waiting for its WAL flush (synchronous_commit off for its own
# transaction: ~0.65 ms, a fifth of a compensation's time). Losing it in a crash is harmless:
# the entry is pending again and is sent again with the same Idempotency-Key, which receivers
# dedupe (the walk is at-least-once by contract). The record of the outcome stays synchronous,
# and since WAL is flushed in order, a durable record implies a durable claim.
_CLAIM = """
WITH quick AS (
    SELECT set_config('synchronous_commit', 'off', true)
), claim AS (
    UPDATE effects_undoentry SET state = 'running', attempts = attempts + 1, claimed_at = now(),
        lease_until = now() + %(lease)s, next_attempt_at = NULL, updated = %(now)s
    WHERE id = %(entry)s AND state = 'pending' AND attempts = %(attempts)s
      AND (next_attempt_at IS NULL OR next_attempt_at <= now())
    RETURNING attempts, claimed_at, lease_until
), locked AS (
    SELECT id, state FROM effects_effect WHERE id = %(effect)s FOR UPDATE
), moved AS (
    UPDATE effects_effect e SET state = 'compensating', updated = %(now)s FROM locked
    WHERE e.id = locked.id AND locked.state = ANY(%(started)s) AND EXISTS (SELECT 1 FROM claim)
    RETURNING locked.state AS from_state
), history AS (
    INSERT INTO effects_effecttransition (effect_id, from_state, to_state, actor, reason, created)
    SELECT %(effect)s, from_state, 'compensating', %(actor)s, '', %(now)s FROM moved
)
SELECT (SELECT attempts FROM claim), (SELECT from_state FROM moved), (SELECT state FROM locked),
       (SELECT claimed_at FROM claim), (SELECT lease_until FROM claim),
       (SELECT 1 FROM quick)  -- referenced, or PostgreSQL would never run it
"""


def _claim_at_once(entry: UndoEntry, now: datetime, lease: timedelta) -> int | None:
    # Claimed and leased by the database's clock, as UndoEntry.claim is (see there why).
    row = prepared.execute(_CLAIM, {"now": now, "lease": lease, "entry": entry.pk, "attempts": entry.attempts,
                                    "effect": entry.effect_id, "started": list(Effect.STARTED), "actor": ACTOR})
    number, from_state, effect_state, claimed_at, lease_until = row[:5] if row else (None,) * 5
    if number is None:
        return None  # another worker got there first, or it is not due yet
    entry.announce(entry.state, UndoEntry.State.RUNNING)
    entry.state, entry.attempts, entry.claimed_at, entry.lease_until = (
        UndoEntry.State.RUNNING, number, claimed_at, lease_until)
    entry.next_attempt_at, entry.updated = None, now
    effect_moved(entry.effect, from_state, Effect.State.COMPENSATING, now, effect_state)
    return number


def log_lost(entry: UndoEntry, number: int, since: datetime | None, now: datetime) -> None:
    started = since or now
    UndoAttempt.objects.get_or_create(entry=entry, number=number, defaults={
        "started_at": started, "duration_ms": int((now - started).total_seconds() * 1000),
        "outcome": UndoAttempt.Outcome.LOST, "error": LOST_ERROR})
    metrics.compensation(UndoAttempt.Outcome.LOST)


def record(entry: UndoEntry, number: int, result: handlers.Result) -> Any:
    """Step 7 of `undo.walk`. Returns the session's next top entry when the record read it (PostgreSQL, a
    success: one statement does both), else UNREAD."""
    now = timezone.now()
    started = now - timedelta(milliseconds=result.duration_ms)
    fields = {"lease_until": None, "last_error": result.error[:10_000], "last_status_code": result.status_code}
    if result.ok and prepared.available():
        return _compensated_at_once(entry, number, started, now, result)
    with transaction.atomic():
        if result.ok:
            if not entry.move({UndoEntry.State.RUNNING}, UndoEntry.State.COMPENSATED, attempt=number, **fields):
                return fenced_out(entry, number)
            log_attempt(entry, number, started, result, UndoAttempt.Outcome.SUCCESS)
            entry.effect.mark_compensated(ACTOR)
            # A heartbeat: the sweep leaves a walk alone while its session keeps moving.
            Session.objects.filter(pk=entry.session_id).update(updated=now)
        elif not result.permanent and entry.retries_left:
            delay = backoff_ms(entry.attempts_in_round, entry.retry_backoff_ms)
            if not entry.move({UndoEntry.State.RUNNING}, UndoEntry.State.PENDING, attempt=number,
                              next_attempt_at=now + timedelta(milliseconds=delay), **fields):
                return fenced_out(entry, number)
            log_attempt(entry, number, started, result, UndoAttempt.Outcome.RETRY, retry_delay_ms=delay)
        else:
            if not entry.move({UndoEntry.State.RUNNING}, UndoEntry.State.COMPENSATION_FAILED, attempt=number,
                              **fields):
                return fenced_out(entry, number)
            outcome = UndoAttempt.Outcome.PERMANENT if result.permanent else UndoAttempt.Outcome.RETRY
            log_attempt(entry, number, started, result, outcome)
            escalate(entry, result.error, result.status_code)
    return UNREAD


# The record of a success also reads the next top entry (what step 1 would read next), in the
# statement's snapshot: the entry just recorded still looks running there, so it is left out.
_COMPENSATED = f"""
WITH done AS (
    UPDATE effects_undoentry SET state = 'compensated', lease_until = NULL, last_error = %(error)s,
        last_status_code = %(status)s, updated = %(now)s
    WHERE id = %(entry)s AND state = 'running' AND attempts = %(attempt)s
    RETURNING 1
), logged AS (
    INSERT INTO effects_undoattempt (entry_id, number, started_at, duration_ms, outcome, status_code, error)
    SELECT %(entry)s, %(attempt)s, %(started)s, %(duration)s, 'success', %(status)s, %(error)s FROM done
), locked AS (
    SELECT id, state FROM effects_effect WHERE id = %(effect)s FOR UPDATE
), moved AS (
    UPDATE effects_effect e SET state = 'compensated', updated = %(now)s FROM locked
    WHERE e.id = locked.id AND locked.state IN ('compensating', 'compensation_failed')
      AND EXISTS (SELECT 1 FROM done)
    RETURNING locked.state AS from_state
), history AS (
    INSERT INTO effects_effecttransition (effect_id, from_state, to_state, actor, reason, created)
    SELECT %(effect)s, from_state, 'compensated', %(actor)s, '', %(now)s FROM moved
), beat AS (
    -- A heartbeat: the sweep leaves a walk alone while its session keeps moving.
    UPDATE effects_session SET updated = %(now)s WHERE id = %(session)s AND EXISTS (SELECT 1 FROM done)
)
SELECT (SELECT count(*) FROM done), (SELECT from_state FROM moved), following.*
FROM (SELECT 1) one LEFT JOIN LATERAL (
    SELECT {TOP_COLUMNS} {TOP_FROM} AND u.id <> %(entry)s
    ORDER BY u.step_index DESC, u.created DESC LIMIT 1
) following ON true
"""


def _compensated_at_once(entry: UndoEntry, number: int, started: datetime, now: datetime,
                         result: handlers.Result) -> Any:
    row = prepared.execute(_COMPENSATED, {
        "error": result.error[:10_000], "status": result.status_code, "now": now, "entry": entry.pk,
        "attempt": number, "started": started, "duration": result.duration_ms, "effect": entry.effect_id,
        "actor": ACTOR, "session": entry.session_id})
    if not row or not row[0]:
        return fenced_out(entry, number)
    entry.announce(UndoEntry.State.RUNNING, UndoEntry.State.COMPENSATED)
    metrics.compensation(UndoAttempt.Outcome.SUCCESS)
    entry.state, entry.lease_until, entry.updated = UndoEntry.State.COMPENSATED, None, now
    effect_moved(entry.effect, row[1], Effect.State.COMPENSATED, now, entry.effect.state)
    return entry_of(row[2:])


def effect_moved(effect: Effect, from_state: str | None, to: str, now: datetime, current: str | None) -> None:
    """What `Effect.move` does after its UPDATE, for a move made in one of the statements above."""
    if from_state is None:
        effect.state = current or effect.state
        return
    effect.state, effect.updated = to, now
    effect.announce(from_state, to)
    if from_state in longpoll.WAITED_ON:
        longpoll.publish(effect.pk)


def fenced_out(entry: UndoEntry, number: int) -> Any:
    # Our claim ran out and another worker took the entry over; its attempt is the one that counts.
    logger.warning("undo entry %s: attempt %s finished after its claim was taken over; result dropped",
                   entry.pk, number)
    return UNREAD


def log_attempt(entry: UndoEntry, number: int, started: datetime, result: handlers.Result, outcome: str,
                retry_delay_ms: int | None = None) -> None:
    transaction.on_commit(lambda: metrics.compensation(outcome))
    UndoAttempt.objects.create(entry=entry, number=number, started_at=started, duration_ms=result.duration_ms,
                               outcome=outcome, status_code=result.status_code, error=result.error[:10_000],
                               retry_delay_ms=retry_delay_ms)


def escalate(entry: UndoEntry, error: str, status_code: int | None = None, *, event: bool = True) -> None:
    """Effect and session `compensation_failed`, and the event that calls a person."""
    if entry.effect.state == Effect.State.COMPENSATING:
        entry.effect.mark_compensation_failed(ACTOR, reason=error)
    elif entry.effect.state != Effect.State.COMPENSATION_FAILED:
        entry.effect.give_up_compensating(ACTOR, reason=error)  # no attempt ever ran (agent side unclaimed)
    session = Session.objects.select_related("org", "agent").get(pk=entry.session_id)
    session.move({Session.State.COMPENSATING}, Session.State.COMPENSATION_FAILED, actor=ACTOR,
                 reason=f"{entry.fn_name}@{entry.fn_version} failed for step {entry.step_index}: {error}")
    if not event:
        return
    Event.record(session.org, "compensation.failed", agent=session.agent, session_id=session.id,
                 undo_entry=str(entry.id), effect=str(entry.effect_id), tool=entry.effect.tool_name,
                 step_index=entry.step_index, fn_name=entry.fn_name, fn_version=entry.fn_version,
                 attempts=entry.attempts, error=error[:2000], status_code=status_code)


def escalate_flagged(entry: UndoEntry) -> None:
    """An entry flagged at commit (its template could not be rendered) reached by the walk: its
    effect and run `compensation_failed` too, without a second event."""
    with transaction.atomic():
        effect = Effect.objects.select_for_update().get(pk=entry.effect_id)
        if effect.state != Effect.State.COMPENSATION_FAILED:
            effect.give_up_compensating(ACTOR, entry.last_error)
        entry.effect = effect
        escalate(entry, entry.last_error, event=False)  # its event went out when it was flagged


def backoff_ms(attempt: int, base_ms: int) -> int:
    """The wait after the `attempt`-th failure of a round: full jitter, a uniform draw between 0
    and base·2^(attempt−1), capped (AWS, "Exponential Backoff And Jitter"). Jitter spreads the
    retries of many walks that failed together against one receiver. The one backoff of every
    retried call (`core.retry`), in milliseconds."""
    return round(1000 * retry.backoff_s(attempt, base_ms / 1000, settings.UNDOLOG_UNDO_MAX_BACKOFF_S, rng=jitter))
