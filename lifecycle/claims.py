"""Agent-side compensations: undo entries whose function has the `agent` handler are run by
the agent side (the MCP gateway, or an SDK process in `serve_compensations`), where the
credentials are, not by the worker.

The walk still decides the order: it reaches such an entry, vets it (its effect started; its
args rendered) and sets its `claim_deadline`; only then may the agent side claim it, and only
while it is the top open entry of its session. A claim is the same guarded UPDATE the worker
uses (`UndoEntry.claim`), with a lease the claimer asks for; a report is recorded exactly like
a worker's attempt (`attempts.record`): same attempts, backoff and escalation. An entry nobody
claims before its deadline, or whose claim runs out with no retries left, goes to a person.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, OuterRef, Q, Subquery
from django.utils import timezone

from core.errors import Conflict
from effects import handlers
from effects.models import CompensationFunction, Effect, PreImage, Session, UndoEntry, walk_due
from lifecycle import attempts
from orgs.models import Agent

ACTOR = "agent-side"


def unclaimed_error(entry: UndoEntry) -> str:
    serving = f"serving the upstream {entry.fn.scope!r} " if entry.fn.scope else ""
    return (f"no agent claimed {entry.fn_name}@{entry.fn_version} within {entry.fn.claim_timeout_s} s "
            f"(is the gateway or serve_compensations {serving}running with this agent's key?)")


def wait_for_claimer(entry: UndoEntry, now: datetime) -> datetime | None:
    """The walk's step for an agent entry: when to look again, or None once a person is called.

    1. Claimed and its lease still runs: look again when the lease ends.
    2. Claimed but the lease ran out (the claimer died): a lost attempt; pending again, or a
       person when no retries are left.
    3. Pending, first reached: its claim deadline starts now.
    4. Pending past the deadline: a person is called, as for a webhook out of retries.
    """
    if entry.state == UndoEntry.State.RUNNING:
        if entry.lease_until and entry.lease_until > now:
            return entry.lease_until
        return _lost(entry, now)
    if entry.claim_deadline is None:
        deadline = now + timedelta(seconds=entry.fn.claim_timeout_s)
        UndoEntry.objects.filter(pk=entry.pk, state=UndoEntry.State.PENDING, claim_deadline__isnull=True) \
            .update(claim_deadline=deadline)
        return deadline
    if entry.claim_deadline > now:
        return entry.claim_deadline
    error = unclaimed_error(entry)
    with transaction.atomic():
        if entry.move({UndoEntry.State.PENDING}, UndoEntry.State.COMPENSATION_FAILED, attempt=entry.attempts,
                      last_error=error):
            attempts.escalate(entry, error)
    return None


def _lost(entry: UndoEntry, now: datetime) -> datetime | None:
    number, since = entry.attempts, entry.claimed_at
    with transaction.atomic():
        if not entry.retries_left:
            if entry.move({UndoEntry.State.RUNNING}, UndoEntry.State.COMPENSATION_FAILED, attempt=number,
                          lease_until=None, last_error=attempts.LOST_ERROR):
                attempts.log_lost(entry, number, since, now)
                attempts.escalate(entry, attempts.LOST_ERROR)
            return None
        deadline = now + timedelta(seconds=entry.fn.claim_timeout_s)
        if entry.move({UndoEntry.State.RUNNING}, UndoEntry.State.PENDING, attempt=number, lease_until=None,
                      claim_deadline=deadline, last_error=attempts.LOST_ERROR):
            attempts.log_lost(entry, number, since, now)
    return deadline


def claimable(agent: Agent, now: datetime, scopes: Sequence[str] | None = None):
    """Agent entries of this agent's compensating sessions that the walk has reached (it set the
    deadline), that are the top of their stack, and are due: pending past any backoff, or
    running with a lease that ran out. Only those of functions scoped to one of `scopes` (the
    upstreams the claimer serves); with none, only those of unscoped functions: a claimer that
    names no upstream never runs an undo meant for one."""
    top = UndoEntry.objects.filter(session=OuterRef("session")).open().lifo().values("pk")[:1]
    return (UndoEntry.objects
            .filter(session__agent=agent, session__state=Session.State.COMPENSATING,
                    fn__handler=CompensationFunction.Handler.AGENT, claim_deadline__isnull=False)
            .filter(Q(fn__scope__in=scopes) if scopes else Q(fn__scope=""))
            .filter(Q(state=UndoEntry.State.PENDING, next_attempt_at__isnull=True)
                    | Q(state=UndoEntry.State.PENDING, next_attempt_at__lte=now)
                    | Q(state=UndoEntry.State.RUNNING, lease_until__lte=now))
            .annotate(top=Subquery(top)).filter(pk=F("top"))
            .select_related("effect", "fn").order_by("claim_deadline"))


def claim(agent: Agent, limit: int, lease_s: int, scopes: Sequence[str] | None = None) -> list[UndoEntry]:
    """Claim up to `limit` entries (of `scopes`: see `claimable`) for `lease_s` seconds each; every
    one is held by this caller alone (the guarded UPDATE on state and attempt count) until it
    reports or the lease ends."""
    now = timezone.now()
    claimed = []
    for entry in claimable(agent, now, scopes)[:limit]:
        stalled, lost, since = entry.state == UndoEntry.State.RUNNING, entry.attempts, entry.claimed_at
        with transaction.atomic():
            if stalled and not entry.retries_left:
                continue  # the walk escalates it (its lease ran out with no retries left)
            if not entry.claim(timedelta(seconds=lease_s)):
                continue  # another claimer got there first
            if stalled:
                attempts.log_lost(entry, lost, since, now)
            effect = Effect.objects.select_for_update().get(pk=entry.effect_id)
            if effect.state in Effect.STARTED:
                effect.start_compensating(f"agent:{agent.name}")
            entry.effect = effect
        claimed.append(entry)
    return claimed


def report(entry: UndoEntry, ok: bool, error: str, permanent: bool, attempt: int | None) -> None:
    """Record what the claimer says happened, fenced by the attempt it holds; the walk goes on.

    A report for an entry that is not running, or under a claim that was taken over, is a 409:
    the claimer must not believe its result counted.
    """
    number = entry.attempts if attempt is None else attempt
    if entry.state != UndoEntry.State.RUNNING or number != entry.attempts:
        raise Conflict(f"The undo entry is {entry.state} (attempt {entry.attempts}); this report for attempt "
                       f"{number} does not count.", code="undo_entry_not_claimed", state=entry.state)
    now = timezone.now()
    started = entry.claimed_at or now
    result = handlers.Result(ok=ok, permanent=permanent and not ok, error="" if ok else (error or "failed"),
                             duration_ms=int((now - started).total_seconds() * 1000))
    entry.effect = Effect.objects.get(pk=entry.effect_id)
    before = entry.updated
    attempts.record(entry, number, result)
    if entry.updated == before:  # fenced out: the lease ran out and someone else holds it now
        raise Conflict("This claim ran out and was taken over; the report does not count.",
                       code="undo_entry_not_claimed", state=entry.state)
    if entry.state == UndoEntry.State.PENDING:
        # Retried after its backoff: the claim deadline counts from now again.
        UndoEntry.objects.filter(pk=entry.pk).update(
            claim_deadline=now + timedelta(seconds=entry.fn.claim_timeout_s))
    session_id = entry.session_id
    transaction.on_commit(lambda: walk_due.send(sender=Session, session_id=session_id))


def claim_dict(entry: UndoEntry) -> dict[str, Any]:
    return {"id": str(entry.id), "fn_name": entry.fn_name, "fn_version": entry.fn_version, "args": entry.args,
            "attempt": entry.attempts, "lease_expires_at": entry.lease_until.isoformat(),
            "session": str(entry.session_id), "effect": str(entry.effect_id), "tool": entry.effect.tool_name,
            "step_index": entry.step_index, "scope": entry.fn.scope, **_pre_image(entry)}


def _pre_image(entry: UndoEntry) -> dict[str, Any]:
    """A claimed entry's pre-image, unsealed for the claimer alone (it restores it), with the call's
    args its restore templates read and the digests its compare-and-restore checks (issue 42)."""
    kept = PreImage.objects.filter(entry=entry).first()
    if kept is None:
        return {}
    if kept.dropped_at is not None:  # past the undo window: the claimer sends it to a person
        return {"pre_image": kept.digests()}
    return {"pre_image": {"value": kept.value(), **kept.digests(), "call_args": entry.effect.args_to_run}}

