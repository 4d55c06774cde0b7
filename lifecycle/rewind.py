"""Rewind: a run goes back to one of its steps, and the world goes back with it.

`POST /api/v1/sessions/{id}/rewind {"to_step": N | "to": "<savepoint>", "reason", "leave_irreversible"}`
undoes every effect of the run after step N, newest first, with the compensation walk itself
(`undo.py`: the same claims, retries, escalation and exactly-once delivery as a rollback), and
the run goes on from step N once the walk is done. The run's state says where it is:

- `compensating` with `rewind_to` set while the walk runs: not `running`, so every intercept
  of the run gets a 409 `session_rewinding`, and a second rewind a 409 `rewind_in_progress`;
- `compensation_failed` when a compensation needs a person: the rewind waits, exactly like a
  rollback (retry or resolve the entry, and the walk goes on); a rewind asked for meanwhile is
  refused with a 409 `walk_stopped` naming the entry;
- `running` again at step N when the walk is done (`awaiting_approval` when a call at or
  before step N still waits for a reviewer).

A completed run may be rewound too: the rewind reopens it (`completed → compensating → running`,
its `ended_at` cleared), for an agent framework that resumes a finished thread from an earlier
checkpoint (LangGraph's time travel: sdk/README.md). It is then a running run like any other (the
idle sweep, a fail, a fleet rollback take it as such), and its end-of-run budget verdict is not given
twice: `budgets.runs.run_ended` acts once per run (its `RunOutcome` row), so completing it again
applies only a first violation the run had not had by its first end. A halted run stays ended: a
reviewer's no is not undone by going back before it.

What a rewind does to the rest of the run, in the transaction that starts it:

- calls after the step still waiting for a person are withdrawn (expired, their requests say
  the run was rewound; the queue sees them go live, as for a failed run);
- irreversible calls after the step that acted, or may still act (approved), cannot be undone:
  without `leave_irreversible` the rewind is refused with a 409 `irreversible_in_the_way`
  naming them (step, tool, when); with it they are left done and listed in the rewind's record
  (`Rewind.left_done`, the run's history and the `session.rewound` event);
- the calls after the step leave the run's signature scope (`retire`): a call identical to one
  rewound is a new call, while a retry of a call made after the rewind still replays;
- SAFE calls after the step are taken off the run into the rewind's record: the steps are run
  again and their SAFE calls are charged again;
- savepoints after the step are dropped (they name steps that no longer happened);
- budgets are not refunded: the run's counters keep every call it made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from approvals.models import ApprovalRequest
from core.errors import Conflict, DomainError, Invalid, NotFound
from effects.models import (
    Effect,
    Rewind,
    SafeCall,
    Savepoint,
    Session,
    Tier,
    UndoEntry,
    sha256,
    walk_due,
)
from orgs.models import Agent, Event, Organization

ACTOR = "rewind"
# Effects after the step that a rewind cannot undo: irreversible calls that acted or may still act.
IN_THE_WAY = Effect.STARTED | {Effect.State.APPROVED}
REWINDABLE = frozenset({Session.State.RUNNING, Session.State.AWAITING_APPROVAL})
REOPENABLE = frozenset({Session.State.COMPLETED})  # a rewind reopens a completed run (above)


@dataclass
class Plan:
    """What a rewind of `session` to `to_step` does (the preview says it; the rewind does it)."""

    session: Session
    to_step: int
    savepoint: str = ""
    from_step: int = 0
    undo: list[dict[str, Any]] = field(default_factory=list)  # newest first, as the walk takes them
    left_done: list[dict[str, Any]] = field(default_factory=list)
    withdrawn: list[dict[str, Any]] = field(default_factory=list)
    approvals: list[ApprovalRequest] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {"to_undo": len(self.undo), "left_done": len(self.left_done), "withdrawn": len(self.withdrawn)}

    def as_dict(self) -> dict[str, Any]:
        return {"session": str(self.session.pk), "to_step": self.to_step, "savepoint": self.savepoint or None,
                "from_step": self.from_step, "resumes_at": self.to_step, "to_undo": self.undo,
                "left_done": self.left_done, "withdrawn": self.withdrawn, "counts": self.counts()}


def _effect_item(effect: Effect, **more: Any) -> dict[str, Any]:
    return {"effect": str(effect.pk), "step_index": effect.step_index, "tool": effect.tool_name,
            "tier": effect.tier, "state": effect.state, "at": effect.created.isoformat(), **more}


def target_step(session: Session, to_step: Any = None, to: str | None = None) -> tuple[int, str]:
    """The step a rewind goes back to, from a step number or a savepoint's name: 400 when it is
    outside the run (below 0, or after its current step), 404 for an unknown savepoint."""
    if (to_step is None) == (to is None):
        raise Invalid({"to_step": "Give to_step or to (a savepoint's name), not both."},
                      "Give to_step (a step of the run) or to (a savepoint's name).")
    if to is not None:
        if not isinstance(to, str) or not to:
            raise Invalid({"to": "A savepoint's name."}, "to must be a savepoint's name.")
        point = Savepoint.objects.filter(session=session, name=to).first()
        if point is None:
            raise NotFound(f"The run has no savepoint named {to!r}.", code="savepoint_not_found", name=to)
        return point.step_index, to
    if isinstance(to_step, str) and to_step.lstrip("-").isdigit():
        to_step = int(to_step)  # a query parameter
    if not isinstance(to_step, int) or isinstance(to_step, bool):
        raise Invalid({"to_step": "A whole number."}, "to_step must be a whole number.")
    if not 0 <= to_step <= session.step_index:
        raise DomainError(f"Step {to_step} is outside the run: it is at step {session.step_index}; rewind to a "
                          f"step from 0 to {session.step_index}.", code="step_outside_run",
                          fields={"to_step": f"Between 0 and {session.step_index}, the run's current step."},
                          to_step=to_step, step_index=session.step_index)
    return to_step, ""


def check_state(session: Session) -> None:
    """A rewind needs a running run (or one waiting for a reviewer, or a completed one, which it
    reopens): 409 saying why otherwise."""
    if session.state in REWINDABLE | REOPENABLE:
        return
    if session.state == Session.State.COMPENSATING and session.rewind_to is not None:
        raise Conflict(f"The run is being rewound to step {session.rewind_to} already; rewind again once it "
                       "runs.", code="rewind_in_progress", to_step=session.rewind_to)
    if session.state == Session.State.COMPENSATION_FAILED:
        entry = UndoEntry.objects.filter(session=session, state=UndoEntry.State.COMPENSATION_FAILED).lifo().first()
        where = (f"the compensation {entry.fn_name}@{entry.fn_version} of step {entry.step_index} failed: "
                 f"{entry.last_error[:300]}" if entry else "a compensation failed")
        raise Conflict(f"The run's walk is stopped: {where}. Retry or resolve that undo entry first.",
                       code="walk_stopped", undo_entry=str(entry.pk) if entry else None,
                       step_index=entry.step_index if entry else None)
    raise Conflict(f"The run is {session.state}; only a running run (or one waiting for a reviewer), or a "
                   "completed one, can be rewound.", code="session_state_conflict", state=session.state)


def plan(session: Session, to_step: int, savepoint: str = "") -> Plan:
    """What rewinding to `to_step` undoes, leaves done and withdraws (reads only)."""
    found = Plan(session, to_step, savepoint, from_step=session.step_index)
    later = list(Effect.objects.filter(session=session, step_index__gt=to_step)
                 .select_related("undo_entry").order_by("-step_index", "-created"))
    for effect in later:
        entry = getattr(effect, "undo_entry", None) if effect.tier == Tier.COMPENSABLE else None
        if entry is not None and entry.state in UndoEntry.OPEN and effect.state in Effect.STARTED:
            found.undo.append(_effect_item(effect, undo_entry=str(entry.pk)))
        elif effect.tier == Tier.IRREVERSIBLE and effect.state in IN_THE_WAY:
            found.left_done.append(_effect_item(effect))
    found.approvals = list(ApprovalRequest.objects.filter(session=session, effect__step_index__gt=to_step)
                           .pending().select_related("effect"))
    found.withdrawn = [_effect_item(a.effect, approval=str(a.pk)) for a in found.approvals]
    return found


def refuse_irreversible(found: Plan) -> Conflict:
    names = ", ".join(f"{item['tool']} at step {item['step_index']} ({item['at']})" for item in found.left_done)
    return Conflict(f"Irreversible calls after step {found.to_step} cannot be undone: {names}. Rewind with "
                    "leave_irreversible to leave them done.", code="irreversible_in_the_way",
                    irreversible=found.left_done, to_step=found.to_step)


def preview(session: Session, to_step: Any = None, to: str | None = None) -> Plan:
    check_state(session)
    step, name = target_step(session, to_step, to)
    return plan(session, step, name)


def rewind(sessions, session_id: Any, *, to_step: Any = None, to: str | None = None, reason: str = "",
           leave_irreversible: bool = False, actor: str) -> tuple[Plan, Rewind]:
    """Start a rewind, in one transaction; the walk runs after commit.

    1. Lock the run (an intercept, a commit's session update or another rewind waits for it, then
       finds the run rewinding).
    2. Check it can be rewound and resolve the step; plan what is undone, left done, withdrawn.
       An irreversible call in the way without `leave_irreversible`: 409, nothing written.
    3. Withdraw the requests after the step; retire the signatures of the calls after it; take
       its SAFE calls off the run; drop the savepoints after it.
    4. The run becomes `compensating` with `rewind_to` (and its step set back; a completed run is
       reopened: no `ended_at`), its rewind recorded, and a `session.rewound` event (audited: who,
       why, counts, whether it reopened the run).
    5. Nothing to walk: the run resumes at once; else the walk after commit (`walk_due`), which
       resumes it when done (`resume`).
    """
    with transaction.atomic():
        session = sessions.select_for_update().filter(pk=session_id).first()
        if session is None:
            raise NotFound("No such session.", code="session_not_found")
        check_state(session)
        step, name = target_step(session, to_step, to)
        found = plan(session, step, name)
        if found.left_done and not leave_irreversible:
            raise refuse_irreversible(found)
        epoch = session.rewinds + 1
        why = f"Withdrawn: the run was rewound to step {step} before a decision."
        for approval in found.approvals:
            approval.withdraw(actor, reason=why)
        retire(session, step, epoch)
        safe = SafeCall.objects.filter(session=session, step_index__gt=step)
        taken = [{"tool": s.tool_name, "step_index": s.step_index, "args": s.args, "at": s.created.isoformat()}
                 for s in safe]
        safe.delete()
        Savepoint.objects.filter(session=session, step_index__gt=step).delete()
        record = Rewind.objects.create(session=session, epoch=epoch, to_step=step, from_step=session.step_index,
                                       savepoint=name, reason=reason, by=actor, undone=found.undo,
                                       left_done=found.left_done, withdrawn=found.withdrawn, safe_calls=taken)
        note = ("; not undone by the rewind: " + ", ".join(f"{i['tool']} at step {i['step_index']}"
                                                             for i in found.left_done)) if found.left_done else ""
        from_step, reopened = session.step_index, session.state in REOPENABLE
        session.move(REWINDABLE | REOPENABLE, Session.State.COMPENSATING, actor=actor,
                     reason=f"rewinding to step {step}{' (reopened)' if reopened else ''}: {reason}{note}"[:2000],
                     rewind_to=step, rewinds=epoch, step_index=step, **({"ended_at": None} if reopened else {}))
        org = Organization(pk=session.org_id)  # Event.record needs only its id: no query
        Event.record(org, "session.rewound", agent=Agent(pk=session.agent_id),
                     session_id=session.pk, by=actor, reason=reason[:2000], to_step=step, from_step=from_step,
                     savepoint=name or None, epoch=epoch, counts=found.counts(), reopened=reopened,
                     left_done=[{k: i[k] for k in ("tool", "step_index", "at")} for i in found.left_done])
        if not UndoEntry.objects.filter(session=session, step_index__gt=step).open().exists():
            resume(session.pk, actor)
        else:
            transaction.on_commit(lambda: walk_due.send(sender=Session, session_id=session.pk))
    return found, record


def retire(session: Session, to_step: int, epoch: int) -> None:
    """The calls after the step leave the run's signature scope.

    A run's signature scope is its live calls: the unique (run, signature) the intercept relies
    on for exactly-once holds over them. A rewind takes the calls after its step out of it by
    rewriting their signatures into the rewind's epoch (`sha256(signature:rewound:epoch)`: unique,
    and no call can compute it), so the intercept's three paths compute signatures exactly as
    before and find only live calls."""
    effects = list(Effect.objects.filter(session=session, step_index__gt=to_step).only("id", "call_signature"))
    for effect in effects:
        effect.call_signature = sha256(f"{effect.call_signature}:rewound:{epoch}")
    Effect.objects.bulk_update(effects, ["call_signature"], batch_size=500)


def resume(session_id: Any, actor: str = "undo-walk") -> bool:
    """The rewind's walk is done: the run goes on at its step (`awaiting_approval` when a call at
    or before it still waits for a reviewer). False when it is not (or no longer) rewinding."""
    session = (Session.objects.filter(pk=session_id, state=Session.State.COMPENSATING, rewind_to__isnull=False)
               .only("state", "org_id", "step_index", "rewind_to").first())
    if session is None:
        return False
    waiting = ApprovalRequest.objects.filter(session_id=session_id).pending().exists()
    to = Session.State.AWAITING_APPROVAL if waiting else Session.State.RUNNING
    step = session.rewind_to
    try:
        with transaction.atomic():
            session.move({Session.State.COMPENSATING}, to, actor=actor, guard=Q(rewind_to=step),
                         reason=f"rewound to step {step}: the walk is done", rewind_to=None)
            Rewind.objects.filter(session_id=session_id, finished_at__isnull=True).update(finished_at=timezone.now())
    except Conflict:
        return False  # another walker resumed it a moment earlier
    return True


def progress(session: Session) -> dict[str, Any] | None:
    """The rewind under way, with the undo entries it has left (the dashboard's live progress)."""
    if session.rewind_to is None:
        return None
    left = UndoEntry.objects.filter(session=session, step_index__gt=session.rewind_to).open().count()
    record = session.rewind_log.order_by("-epoch").first()
    return {"to_step": session.rewind_to, "entries_left": left, "state": session.state,
            "rewind": record.as_dict() if record else None}


def savepoint(session: Session, name: str) -> Savepoint:
    """Mark the run's current step as `name` (a name marked again moves to the current step)."""
    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        raise Invalid({"name": "A name of 1 to 100 characters."}, "name must be a string of 1 to 100 characters.")
    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=session.pk)
        if locked.state not in REWINDABLE:
            raise Conflict(f"The run is {locked.state}; a savepoint marks a step of a running run.",
                           code="session_not_running", state=locked.state)
        point, _ = Savepoint.objects.update_or_create(session=locked, name=name.strip(),
                                                      defaults={"step_index": locked.step_index,
                                                                "created": timezone.now()})
    return point
