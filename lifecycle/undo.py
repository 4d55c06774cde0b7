"""The compensation walk: a rolled-back session's undo stack, newest first, each entry once.

`Session.fail()` and `Session.undo()` move a session to `compensating` and enqueue
`lifecycle.tasks.walk_undo_stack` after commit; that task calls `walk()`. Everything the walk
knows lives in rows (entry state, attempt count, lease, next attempt time), so a lost
message or a dead worker only delays it: `due_sessions()`, run by a beat sweep, finds
walks that are due or stalled and enqueues them again. What every walk shares with this one (the
top entry's read, the guarded claim, the record fenced by its attempt number, escalation to a
person) is lifecycle/attempts.py's.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from core.errors import Conflict
from effects import handlers
from effects.models import CompensationFunction, Effect, Session, UndoEntry, canonical_json
from lifecycle import claims
from lifecycle.attempts import ACTOR, UNREAD, claim, escalate_flagged, record, top_entry
from orgs.models import Event, Organization

logger = logging.getLogger(__name__)


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
    following: Any = UNREAD  # the next top entry, when recording the last outcome read it already
    refused = None  # (entry, attempt) whose claim the database refused a moment ago
    while True:
        entry = top_entry(session_id) if following is UNREAD else following
        following = UNREAD
        if entry is None:
            # Either the session is not compensating, or nothing is left to do.
            _finish(session_id)
            return None
        if entry.fn_id not in functions:
            functions[entry.fn_id] = CompensationFunction.objects.select_related("org").get(pk=entry.fn_id)
        entry.fn = functions[entry.fn_id]
        now = timezone.now()
        if entry.state == UndoEntry.State.COMPENSATION_FAILED:
            # Flagged at commit (its template could not be rendered): the session says so now.
            escalate_flagged(entry)
            return None  # waiting for a person
        if entry.effect.state not in Effect.STARTED | {Effect.State.COMPENSATING}:
            if not entry.move({UndoEntry.State.PENDING}, UndoEntry.State.SKIPPED):
                return None  # a claimed entry whose effect never started: leave it to the sweep
            continue
        if (entry.args_template is not None and entry.state == UndoEntry.State.PENDING
                and entry.effect.state in (Effect.State.EXECUTING, Effect.State.FAILED)):
            # The call never committed (the run died mid-call): no result to render its undo from.
            if not entry.flag(f"the call never committed ({entry.effect.state}): there is no result to render "
                              f"the compensation args {canonical_json(entry.args_template)} from; "
                              "undo it by hand"):
                return None  # changed under us; the next walk looks again
            continue
        if entry.fn.handler == CompensationFunction.Handler.AGENT:
            return claims.wait_for_claimer(entry, now)  # the agent side runs it; the walk waits in order
        if refused == (entry.pk, entry.attempts):
            # Unchanged since the database refused our claim: not due by its clock, though it is by
            # ours. Looking again would spin; the sweep enqueues it again once it is due.
            logger.warning("undo entry %s is not due by the database's clock but is by this worker's: "
                           "is this host's clock off?", entry.pk)
            return None
        if entry.state == UndoEntry.State.RUNNING and entry.lease_until and entry.lease_until > now:
            return None
        if entry.state == UndoEntry.State.PENDING and entry.next_attempt_at and entry.next_attempt_at > now:
            return entry.next_attempt_at
        if ran and time.monotonic() > stop_at:
            return now
        number = claim(entry, now)
        if number is None:
            refused = (entry.pk, entry.attempts)
            continue  # another worker got there first, or the claim escalated; look again
        following = record(entry, number, handlers.run(entry, entry.fn, number))
        ran = True


def _finish(session_id: uuid.UUID | str) -> None:
    # org_id and step_index too: the move announces the change (session.updated) without a query.
    session = (Session.objects.filter(pk=session_id, state=Session.State.COMPENSATING)
               .only("state", "org_id", "step_index", "rewind_to").first())
    if session is None:
        return
    if session.rewind_to is not None:
        from lifecycle import rewind  # a rewind's walk is done: the run goes on at its step

        rewind.resume(session_id)
        return
    try:
        with transaction.atomic():
            session.move({Session.State.COMPENSATING}, Session.State.COMPENSATED, actor=ACTOR,
                         reason="undo stack walked back")
            # The audit chain's record that the run was undone (ops/audit.py seals it).
            org = Organization(pk=session.org_id)  # Event.record needs only its id: no query
            Event.record(org, "session.compensated", session_id=session.pk)
    except Conflict:
        pass  # a second walker finished it a moment earlier


def due_sessions(now: datetime | None = None, limit: int = 500) -> list[uuid.UUID]:
    """Compensating sessions that no worker is moving: what the beat sweep enqueues again.

    Due: the top entry's claim ran out (its worker died); its retry time passed a while ago
    (the countdown message was lost); or the session sat still a while between entries or
    after the last one (the walker died between two steps).
    """
    now = now or timezone.now()
    quiet = now - timedelta(seconds=settings.UNDOLOG_UNDO_STALL_S)
    top = (UndoEntry.objects.filter(session=OuterRef("pk"))
           .filter(step_index__gt=Coalesce(OuterRef("rewind_to"), -1)).open().lifo())  # a rewind's scope
    sessions = Session.objects.filter(state=Session.State.COMPENSATING).annotate(
        top_state=Subquery(top.values("state")[:1]),
        top_due=Subquery(top.values("next_attempt_at")[:1]),
        top_lease=Subquery(top.values("lease_until")[:1]),
        top_claim=Subquery(top.values("claim_deadline")[:1]),
    )
    # An agent-side entry waiting for its claimer is not stalled: its walk looks again at the deadline.
    not_waiting = Q(top_claim__isnull=True) | Q(top_claim__lte=now)
    due = sessions.filter(
        Q(top_state__isnull=True, updated__lt=quiet)
        | (Q(top_state=UndoEntry.State.PENDING, top_due__isnull=True, updated__lt=quiet) & not_waiting)
        | (Q(top_state=UndoEntry.State.PENDING, top_due__lt=quiet) & not_waiting)
        | Q(top_state=UndoEntry.State.RUNNING, top_lease__lt=now)
    )
    return list(due.order_by("updated").values_list("pk", flat=True)[:limit])
