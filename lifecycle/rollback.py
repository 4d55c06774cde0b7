"""Fleet rollback: every run of one agent since a time, stopped and walked back at once.

An incident (an injected agent, a bad prompt shipped) calls for every run of the agent undone
now, not one `POST /sessions/{id}/undo` per run by hand. `rollback()` (behind `POST
/api/v1/agents/{name}/rollback {"since", "reason"}`, admins) fails the agent's open runs and
undoes the ones that ended since `since`, in one transaction with one audited event, and hands
the walks to the workers; `walk_fleet()` (the Celery task `lifecycle.tasks.walk_fleet`) walks a
chunk of those runs side by side, one round at a time: the top entry of every run, claimed in
one statement, sent concurrently, recorded in one statement. Within each run the order is the
walk's own (newest first, one entry at a time); across runs there is no order to keep, so the
rounds overlap the receivers' time instead of paying it run after run.

The rows stay the truth, exactly as for one run's walk (`lifecycle/undo.py`, built on
`lifecycle/attempts.py` as this is): claims are guarded on the state and attempt count, records
fenced by the attempt number, and anything but the plain case (a retry, an escalation, a stalled
claim, an agent- or python-run handler, an entry to skip or flag) leaves the fleet walk for the
run's own walk, which owns every rule. A worker that dies mid-round leaves claimed entries whose
leases run out: the undo sweep takes them over and sends them again with the same
Idempotency-Key.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q
from django.dispatch import Signal
from django.utils import timezone

from approvals import notify
from approvals.models import ApprovalRequest
from core import metrics, prepared
from effects import handlers
from effects.models import (
    CompensationFunction,
    Effect,
    Session,
    SessionTransition,
    UndoAttempt,
    UndoEntry,
    announce,
    walk_due,
)
from lifecycle import attempts
from orgs.models import Agent, Event

logger = logging.getLogger(__name__)

# Runs per walk task: enough for a round to overlap many receivers' time, few enough that the
# runs of a large rollback spread over every worker.
CHUNK = 50
# Run ids the `agent.rolled_back` event carries: a sample, so the event (sealed into the audit
# chain, sent to webhooks) stays small however many runs a rollback takes. The full list is the
# API's (`GET /api/v1/agents/{name}/rollbacks/{id}`), read from the runs themselves.
SAMPLE = 20
ENDED = frozenset({Session.State.COMPLETED, Session.State.HALTED})
# A chunk of runs (`session_ids`) to walk side by side, sent after the rollback commits: its
# receiver (lifecycle/apps.py) enqueues `tasks.walk_fleet`, whose task imports this module. One
# run handed to its own walk goes by `effects.models.walk_due`.
fleet_walk_due = Signal()


@dataclass(frozen=True)
class Scope:
    """What a rollback touches (or touched): runs, and the open undo entries on their stacks."""

    runs: int
    entries: int
    running: int  # of the runs: open or halted ones, failed by the rollback
    ended: int  # completed ones, undone
    id: uuid.UUID | None = None  # a rollback made: its `agent.rolled_back` event's id

    def as_dict(self) -> dict[str, Any]:
        counts: dict[str, Any] = {"runs": self.runs, "entries": self.entries, "running": self.running,
                                  "ended": self.ended}
        return counts if self.id is None else {"id": str(self.id), **counts}


def candidates(agent: Agent, since: datetime):
    """The agent's runs a rollback since `since` takes: every open one (whenever it started), and
    every completed or halted one that ended since then."""
    return Session.objects.filter(agent=agent).filter(
        Q(state__in=Session.OPEN) | Q(state__in=ENDED, ended_at__gte=since) | Q(rewind_to__isnull=False))


def preview(agent: Agent, since: datetime) -> Scope:
    """What `rollback(agent, since, …)` would touch now (the dashboard's confirmation)."""
    runs = list(candidates(agent, since).values_list("state", flat=True))
    entries = UndoEntry.objects.filter(session__in=candidates(agent, since)).open().count()
    ended = sum(state == Session.State.COMPLETED for state in runs)
    return Scope(runs=len(runs), entries=entries, running=len(runs) - ended, ended=ended)


def of_agent(agent: Agent):
    """The agent's rollbacks (their `agent.rolled_back` events), newest first."""
    return Event.objects.filter(org_id=agent.org_id, agent=agent, kind="agent.rolled_back").order_by("-created", "-id")


def runs_of(rollback_id: uuid.UUID):
    """The runs one rollback took, in a stable order (for paging by id)."""
    return Session.objects.filter(rolled_back_in=rollback_id).order_by("id")


def left_in(rollback_ids: list[uuid.UUID]) -> dict[uuid.UUID, dict[str, int]]:
    """Per rollback: its runs still being walked back and the undo entries they have left, in one
    query (rollbacks with nothing left are absent)."""
    rows = (UndoEntry.objects.filter(session__rolled_back_in__in=rollback_ids,
                                     session__state=Session.State.COMPENSATING).open()
            .values("session__rolled_back_in").annotate(runs=Count("session_id", distinct=True), entries=Count("id")))
    return {row["session__rolled_back_in"]: {"runs": row["runs"], "entries_left": row["entries"]} for row in rows}


def progress(agent: Agent) -> dict[str, int]:
    """The agent's runs being walked back now, and the undo entries they have left (live progress)."""
    left = (UndoEntry.objects.filter(session__agent=agent, session__state=Session.State.COMPENSATING).open()
            .aggregate(runs=Count("session_id", distinct=True), entries_left=Count("id")))
    return {"runs": left["runs"], "entries_left": left["entries_left"]}


def rollback(agent: Agent, since: datetime, reason: str, actor: str) -> Scope:
    """Stop and undo the agent's runs since `since`, in one transaction.

    1. Lock the runs it takes (`candidates`): an intercept, a complete or a reviewer's decision
       racing us waits for the lock, then finds its run compensating and stops.
    2. Open and halted runs fail, as `Session.fail` fails one: `failed` with the reason, their
       waiting approvals withdrawn, their budget verdict applied (`run_ended`).
    3. Every one becomes `compensating` (failed runs: rolling back; completed ones: undone, as
       `Session.undo` does), one guarded UPDATE per from-state, each with its history row.
    4. Runs with nothing on their stacks are `compensated` at once.
    5. One `agent.rolled_back` event: who, why, since when, the counts and a sample of the runs
       (`SAMPLE`); each run keeps the event's id (`rolled_back_in`), which lists them all.
    6. After commit, the walks, in chunks of `CHUNK` runs spread over the workers.
    """
    now = timezone.now()
    error = f"rolled back by {actor}: {reason}"[:2000]
    with transaction.atomic():
        runs = list(candidates(agent, since).select_for_update().order_by("created", "id"))
        rewinding = [run for run in runs if run.rewind_to is not None]
        runs = [run for run in runs if run.rewind_to is None]
        running = [run for run in runs if run.state != Session.State.COMPLETED]
        ended = [run for run in runs if run.state == Session.State.COMPLETED]
        history: list[SessionTransition] = []
        _fail(running, error, actor, now, history)
        _move(running, Session.State.FAILED, Session.State.COMPENSATING, actor, "rolling back", now, history)
        _move(ended, Session.State.COMPLETED, Session.State.COMPENSATING, actor, f"undo requested: {reason}",
              now, history)
        counts = dict(UndoEntry.objects.filter(session__in=[run.pk for run in runs]).open()
                      .values("session_id").annotate(n=Count("id")).values_list("session_id", "n"))
        empty = [run for run in runs if run.pk not in counts]
        _move(empty, Session.State.COMPENSATING, Session.State.COMPENSATED, actor, "nothing (left) to compensate",
              now, history, ended_at=now)
        rewound = _rewinds_to_rollbacks(rewinding, error, actor, now, history)
        SessionTransition.objects.bulk_create(history)
        scope = Scope(runs=len(runs), entries=sum(counts.values()), running=len(running), ended=len(ended))
        event = Event.record(agent.org, "agent.rolled_back", agent=agent, by=actor, reason=reason,
                             since=since.isoformat(), **scope.as_dict(),
                             sample=[str(run.pk) for run in runs[:SAMPLE]])
        Session.objects.filter(pk__in=[run.pk for run in runs]).update(rolled_back_in=event.pk)
        walks = [run.pk for run in runs if run.pk in counts] + rewound
        transaction.on_commit(lambda: enqueue_walks(walks))
    return replace(scope, id=event.pk)


def _rewinds_to_rollbacks(runs: list[Session], error: str, actor: str, now: datetime,
                          history: list[SessionTransition]) -> list[uuid.UUID]:
    """Runs of the agent in the middle of a rewind (lifecycle/rewind.py) are neither open nor ended:
    their rewinds become rollbacks (the walk then goes on to the bottom of the stack and ends them
    `compensated`), so the incident does not let them run again. Their walks, to enqueue."""
    if not runs:
        return []
    Session.objects.filter(pk__in=[run.pk for run in runs]).update(rewind_to=None, error=error, updated=now)
    history.extend(SessionTransition(session=run, from_state=run.state, to_state=run.state, actor=actor, created=now,
                                     reason=f"the rewind became a rollback: {error}"[:2000]) for run in runs)
    return [run.pk for run in runs if run.state == Session.State.COMPENSATING]


def _fail(runs: list[Session], error: str, actor: str, now: datetime, history: list[SessionTransition]) -> None:
    """Step 2, for the open and halted runs (locked by the caller)."""
    if not runs:
        return
    for state in {run.state for run in runs}:
        _move([run for run in runs if run.state == state], state, Session.State.FAILED, actor, error, now, history,
              error=error, ended_at=now)
    for approval in ApprovalRequest.objects.filter(session__in=[run.pk for run in runs]).pending():
        approval.withdraw(actor)
    for run in runs:
        # Its budget verdict (`run_ended`) acts on the run's violation only, and the rows we locked
        # hold it as committed (an intercept recording one waits for our lock): a run without one
        # skips the receiver's re-read, a statement per run.
        if run.violation:
            run.run_ended(actor)


def _move(runs: list[Session], from_state: str, to: str, actor: str, reason: str, now: datetime,
          history: list[SessionTransition], **fields: Any) -> None:
    """`Session.move` for many runs in one guarded UPDATE; their history rows join `history`."""
    if not runs:
        return
    changed = Session.objects.filter(pk__in=[run.pk for run in runs], state=from_state).update(
        state=to, updated=now, **fields)
    # The caller holds every row's lock, so no run can have moved since it read them.
    assert changed == len(runs), f"{changed} of {len(runs)} runs moved from {from_state}"
    for run in runs:
        history.append(SessionTransition(session=run, from_state=from_state, to_state=to, actor=actor,
                                         reason=reason[:2000], created=now))
        announce(run, "session", from_state, to, session_id=run.pk, org_id=run.org_id, step_index=run.step_index)
        run.state = to
        for name, value in fields.items():
            setattr(run, name, value)


def enqueue_walks(session_ids: list[uuid.UUID]) -> None:
    """After commit: the walks of a rollback's runs. A lost message loses nothing: the runs are
    `compensating`, and the undo sweep finds each one that sits still."""
    if not prepared.available():
        for session_id in session_ids:  # SQLite: each run's own walk (one writer at a time anyway)
            walk_due.send(sender=Session, session_id=session_id)
        return
    for start in range(0, len(session_ids), CHUNK):
        fleet_walk_due.send(sender=Session, session_ids=session_ids[start:start + CHUNK])


def walk_fleet(session_ids: Iterable[uuid.UUID | str], *, budget_s: float | None = None) -> list[uuid.UUID]:
    """Walk many runs back side by side; returns the runs still left when the time budget ran out
    (the task enqueues them again).

    1. Read the top open entry of every run, in one statement (after the first round, the record
       of the last round's successes read them: step 6).
    2. Runs with none left are `compensated` (one statement for all, and their events); runs no
       longer compensating (finished or escalated elsewhere) leave the walk.
    3. A top entry this round cannot take — anything but a due, pending webhook entry whose
       effect may have acted — sends its run to its own walk (`undo.walk`), which owns every
       other case (skips, flags, stalled claims, backoffs, agent and python handlers).
    4. Claim the rest in one guarded statement (state and attempt count, as `attempts.claim` claims one).
    5. Send their webhooks concurrently, outside any transaction.
    6. Record the successes in one statement, fenced by attempt number, which also reads each of
       their runs' next top entry (as `attempts.record` does for one). A failure is recorded as the run's own
       walk records it (retry or escalation) and its run leaves for that walk.
    7. Again from 2, until no run is left or the time budget is spent (after one round at least):
       two statements a round.
    """
    budget = settings.UNDOLOG_UNDO_WALK_BUDGET_S if budget_s is None else budget_s
    stop_at = timezone.now() + timedelta(seconds=budget)
    functions: dict[int, CompensationFunction] = {}
    tops = _tops([uuid.UUID(str(pk)) for pk in session_ids])
    while tops:
        _finish([pk for pk, entry in tops if entry is None])
        entries = [entry for _, entry in tops if entry is not None]
        _load_functions(entries, functions)
        now = timezone.now()
        quick = []
        for entry in entries:
            if _quick(entry, now):
                quick.append(entry)
            else:
                walk_due.send(sender=Session, session_id=entry.session_id)
        claimed = _claim(quick, now)
        results = handlers.run_webhooks([(entry, entry.fn, number) for entry, number in claimed])
        tops = _record(claimed, results)
        if tops and timezone.now() > stop_at:
            return [pk for pk, _ in tops]
    return []


def _tops(session_ids: list[uuid.UUID]) -> list[tuple[uuid.UUID, UndoEntry | None]]:
    """Step 1: (run, its top open entry with its effect) for every run; None for a run with no open
    entry or no longer compensating."""
    rows = _rows(_TOPS, {"sessions": session_ids})
    return [(row[0], attempts.entry_of(row[1:])) for row in rows]


def _finish(session_ids: list[uuid.UUID]) -> None:
    """Step 2: runs with nothing left become `compensated`, each with its history row and its
    `session.compensated` event (the audit chain's record that it was undone), as `undo._finish`
    does for one."""
    if not session_ids:
        return
    with transaction.atomic():
        finished = _rows(_FINISH, {"sessions": session_ids, "now": timezone.now(), "actor": attempts.ACTOR})
        events = Event.objects.bulk_create(
            Event(org_id=org_id, kind="session.compensated", session_id=pk, data={}) for pk, org_id, _ in finished)
        for pk, org_id, step_index in finished:
            announce(Session(pk=pk), "session", Session.State.COMPENSATING, Session.State.COMPENSATED,
                     session_id=pk, org_id=org_id, step_index=step_index)
        transaction.on_commit(lambda: _fan_out(events))


def _fan_out(events: list[Event]) -> None:
    """After commit, as `Event.record`'s receivers would, but in one batch (a transaction per event
    cost a round as much as its compensations). A failure leaves them to the outbox sweep."""
    try:
        notify.dispatch_many(events)
    except Exception:
        logger.exception("could not fan out %d session.compensated events; the outbox sweep will", len(events))


def _load_functions(entries: list[UndoEntry], functions: dict[int, CompensationFunction]) -> None:
    missing = {entry.fn_id for entry in entries} - functions.keys()
    if missing:
        functions.update(CompensationFunction.objects.select_related("org").in_bulk(missing))
    for entry in entries:
        entry.fn = functions[entry.fn_id]


def _quick(entry: UndoEntry, now: datetime) -> bool:
    """Step 3: the plain case, which a round claims, sends and records in bulk."""
    return (entry.state == UndoEntry.State.PENDING
            and (entry.next_attempt_at is None or entry.next_attempt_at <= now)
            and entry.fn.handler == CompensationFunction.Handler.WEBHOOK
            and entry.effect.state in Effect.STARTED | {Effect.State.COMPENSATING}
            and not (entry.args_template is not None
                     and entry.effect.state in (Effect.State.EXECUTING, Effect.State.FAILED)))


def _claim(entries: list[UndoEntry], now: datetime) -> list[tuple[UndoEntry, int]]:
    """Step 4: the entries claimed, with the attempt number each now holds."""
    if not entries:
        return []
    # Leased by the database's clock, as UndoEntry.claim is (see there why).
    leases = [timedelta(milliseconds=entry.fn.timeout_ms, seconds=settings.UNDOLOG_UNDO_STALL_S)
              for entry in entries]
    rows = _rows(_CLAIM, {"now": now, "entries": [entry.pk for entry in entries],
                          "attempts": [entry.attempts for entry in entries], "leases": leases,
                          "effects": [entry.effect_id for entry in entries], "started": list(Effect.STARTED),
                          "actor": attempts.ACTOR})
    by_id = {row[0]: row[1:] for row in rows}
    claimed = []
    for entry in entries:
        if entry.pk not in by_id:
            continue  # another worker got there first: its walk goes on with the run
        number, from_state, effect_state, claimed_at, lease_until = by_id[entry.pk]
        entry.announce(entry.state, UndoEntry.State.RUNNING)
        entry.state, entry.attempts, entry.claimed_at, entry.lease_until = (
            UndoEntry.State.RUNNING, number, claimed_at, lease_until)
        entry.next_attempt_at, entry.updated = None, now
        attempts.effect_moved(entry.effect, from_state, Effect.State.COMPENSATING, now, effect_state)
        claimed.append((entry, number))
    return claimed


def _record(claimed: list[tuple[UndoEntry, int]],
            results: list[handlers.Result]) -> list[tuple[uuid.UUID, UndoEntry | None]]:
    """Step 6: (run, its next top entry or None) for each entry recorded compensated; their runs go
    on to the next round."""
    done = [(entry, number, result) for (entry, number), result in zip(claimed, results, strict=True) if result.ok]
    for (entry, number), result in zip(claimed, results, strict=True):
        if not result.ok:
            attempts.record(entry, number, result)  # a retry's time or an escalation, in the entry's rows
            walk_due.send(sender=Session, session_id=entry.session_id)
    if not done:
        return []
    now = timezone.now()
    rows = _rows(_COMPENSATED, {
        "now": now, "actor": attempts.ACTOR,
        "entries": [entry.pk for entry, _, _ in done], "attempts": [number for _, number, _ in done],
        "effects": [entry.effect_id for entry, _, _ in done], "sessions": [entry.session_id for entry, _, _ in done],
        "started": [now - timedelta(milliseconds=result.duration_ms) for _, _, result in done],
        "durations": [result.duration_ms for _, _, result in done],
        "statuses": [result.status_code for _, _, result in done]})
    recorded = {row[0]: row[1:] for row in rows}
    following = []
    for entry, number, _ in done:
        if entry.pk not in recorded:
            attempts.fenced_out(entry, number)
            continue
        from_state, effect_state, *top = recorded[entry.pk]
        entry.announce(UndoEntry.State.RUNNING, UndoEntry.State.COMPENSATED)
        metrics.compensation(UndoAttempt.Outcome.SUCCESS)
        entry.state, entry.lease_until, entry.updated = UndoEntry.State.COMPENSATED, None, now
        attempts.effect_moved(entry.effect, from_state, Effect.State.COMPENSATED, now, effect_state)
        following.append((entry.session_id, attempts.entry_of(top)))
    return following


def _rows(sql: str, params: dict[str, Any]) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


# PostgreSQL only (SQLite walks each run on its own). The statements are the ones `attempts` runs for
# one entry, over arrays: unnest() pairs each entry with the values read for it.

_TOPS = f"""
SELECT wanted.id, top.* FROM unnest(%(sessions)s::uuid[]) AS wanted(id)
LEFT JOIN LATERAL (
    SELECT {attempts.TOP_COLUMNS} {attempts.TOP_FROM.replace("%(session)s", "wanted.id")}
    ORDER BY u.step_index DESC, u.created DESC LIMIT 1
) top ON true
"""

_OPEN = ", ".join(f"'{state}'" for state in sorted(UndoEntry.OPEN))
_FINISH = f"""
WITH finished AS (
    UPDATE effects_session s SET state = 'compensated', updated = %(now)s, ended_at = %(now)s
    WHERE s.id = ANY(%(sessions)s::uuid[]) AND s.state = 'compensating' AND s.rewind_to IS NULL
      AND NOT EXISTS (SELECT 1 FROM effects_undoentry u WHERE u.session_id = s.id AND u.state IN ({_OPEN}))
    RETURNING s.id, s.org_id, s.step_index
), history AS (
    INSERT INTO effects_sessiontransition (session_id, from_state, to_state, actor, reason, created)
    SELECT id, 'compensating', 'compensated', %(actor)s, 'undo stack walked back', %(now)s FROM finished
)
SELECT id, org_id, step_index FROM finished
"""

# As attempts._CLAIM: the claim commits without waiting for its WAL flush (a claim lost in a crash
# leaves the entry pending, sent again with the same Idempotency-Key); the effects are locked in
# id order, so two walks locking overlapping sets cannot deadlock.
_CLAIM = """
WITH quick AS (
    SELECT set_config('synchronous_commit', 'off', true)
), wanted AS (
    SELECT * FROM unnest(%(entries)s::uuid[], %(attempts)s::int[], %(leases)s::interval[], %(effects)s::uuid[])
        AS w(entry, attempts, lease, effect)
), claim AS (
    UPDATE effects_undoentry u SET state = 'running', attempts = u.attempts + 1, claimed_at = now(),
        lease_until = now() + w.lease, next_attempt_at = NULL, updated = %(now)s
    FROM wanted w
    WHERE u.id = w.entry AND u.state = 'pending' AND u.attempts = w.attempts
      AND (u.next_attempt_at IS NULL OR u.next_attempt_at <= now())
    RETURNING u.id, u.attempts, w.effect, u.claimed_at, u.lease_until
), locked AS (
    SELECT id, state FROM effects_effect WHERE id IN (SELECT effect FROM claim) ORDER BY id FOR UPDATE
), moved AS (
    UPDATE effects_effect e SET state = 'compensating', updated = %(now)s FROM locked
    WHERE e.id = locked.id AND locked.state = ANY(%(started)s)
    RETURNING e.id, locked.state AS from_state
), history AS (
    INSERT INTO effects_effecttransition (effect_id, from_state, to_state, actor, reason, created)
    SELECT id, from_state, 'compensating', %(actor)s, '', %(now)s FROM moved
)
SELECT c.id, c.attempts, m.from_state, l.state, c.claimed_at, c.lease_until
FROM claim c CROSS JOIN quick LEFT JOIN moved m ON m.id = c.effect LEFT JOIN locked l ON l.id = c.effect
"""

_COMPENSATED = f"""
WITH wanted AS (
    SELECT * FROM unnest(%(entries)s::uuid[], %(attempts)s::int[], %(effects)s::uuid[], %(sessions)s::uuid[],
                         %(started)s::timestamptz[], %(durations)s::int[], %(statuses)s::int[])
        AS w(entry, attempt, effect, session, started, duration, status)
), done AS (
    UPDATE effects_undoentry u SET state = 'compensated', lease_until = NULL, last_error = '',
        last_status_code = w.status, updated = %(now)s
    FROM wanted w
    WHERE u.id = w.entry AND u.state = 'running' AND u.attempts = w.attempt
    RETURNING w.*
), logged AS (
    INSERT INTO effects_undoattempt (entry_id, number, started_at, duration_ms, outcome, status_code, error)
    SELECT entry, attempt, started, duration, 'success', status, '' FROM done
), locked AS (
    SELECT id, state FROM effects_effect WHERE id IN (SELECT effect FROM done) ORDER BY id FOR UPDATE
), moved AS (
    UPDATE effects_effect e SET state = 'compensated', updated = %(now)s FROM locked
    WHERE e.id = locked.id AND locked.state IN ('compensating', 'compensation_failed')
    RETURNING e.id, locked.state AS from_state
), history AS (
    INSERT INTO effects_effecttransition (effect_id, from_state, to_state, actor, reason, created)
    SELECT id, from_state, 'compensated', %(actor)s, '', %(now)s FROM moved
), beat AS (
    -- A heartbeat: the sweep leaves a walk alone while its session keeps moving.
    UPDATE effects_session SET updated = %(now)s WHERE id IN (SELECT session FROM done)
)
SELECT d.entry, m.from_state, l.state, following.*
FROM done d LEFT JOIN moved m ON m.id = d.effect LEFT JOIN locked l ON l.id = d.effect
LEFT JOIN LATERAL (
    -- The run's next top entry, in the statement's snapshot: the one just recorded still looks
    -- running there, so it is left out (as attempts._COMPENSATED reads it for one run).
    SELECT {attempts.TOP_COLUMNS} {attempts.TOP_FROM.replace("%(session)s", "d.session")} AND u.id <> d.entry
    ORDER BY u.step_index DESC, u.created DESC LIMIT 1
) following ON true
"""
