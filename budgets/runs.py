"""After the run: the first violation of a run applies the budget's on_exceeded, once.

`run_ended(session, actor)` is called by the Session verbs that end a run (`complete`,
`fail`, `halt`) inside their transaction, so the run's end and its consequence commit
together, and the unique `RunOutcome` row makes a second call (a halted run failed later,
or the `fail` that `stop` itself calls) a no-op.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from budgets.models import BudgetPolicy, Limits, RunOutcome
from core.errors import Conflict
from deliveries.models import Delivery
from effects.models import Session
from orgs.models import Agent, Event

ACTOR = "budget"


def on_session_ended(sender: type, session: Session, actor: str, **kwargs: Any) -> None:
    """Receives effects' `session_ended` (connected in budgets/apps.py)."""
    run_ended(session, actor)


def run_ended(session: Session, actor: str) -> None:
    """1. No violation (or one already acted on): nothing to do.
    2. Observe mode: record what would have happened (`budget.exceeded`, action `none`).
    3. pause → agent suspended (reason budget); stop → agent stopped and the run rolled back;
       escalate → suspended and the escalation webhook called (Celery, after commit).
    """
    # Read again: the verb's UPDATE holds the row now, so an intercept that refused a call
    # just before the run ended has committed its violation, which the caller's copy may miss.
    violation = type(session).objects.filter(pk=session.pk).values_list("violation", flat=True).first()
    if not violation:
        return
    session.violation = violation
    limits = Limits.for_agent(session.org_id, session.agent_id)
    action = "none" if violation.get("observed") else limits.on_exceeded
    if not _claim(session, action, violation):
        return
    agent = Agent.objects.select_related("org").get(pk=session.agent_id)
    data: dict[str, Any] = {"limit": violation.get("limit"), "limit_value": violation.get("limit_value"),
                            "current": violation.get("current"), "tool": violation.get("tool"),
                            "reason": violation.get("reason"), "observed": bool(violation.get("observed")),
                            "action": action, "would_apply": limits.on_exceeded, "session_state": session.state}
    if action == BudgetPolicy.OnExceeded.STOP:
        data["agent_stopped"] = agent.stop()
        data["rollback"] = _roll_back(session)
    elif action in (BudgetPolicy.OnExceeded.PAUSE, BudgetPolicy.OnExceeded.ESCALATE):
        suspended = agent.suspend(Agent.SuspendReason.BUDGET)
        if suspended:
            Event.record(agent.org, "agent.suspended", agent=agent, session_id=session.id,
                         reason=Agent.SuspendReason.BUDGET, by=ACTOR, limit=violation.get("limit"))
        if action == BudgetPolicy.OnExceeded.ESCALATE:
            data["escalation"] = _escalate(agent, session, limits, data)
    Event.record(agent.org, "budget.exceeded", agent=agent, session_id=session.id, **data)


def _claim(session: Session, action: str, violation: dict) -> bool:
    try:
        with transaction.atomic():  # a savepoint: a lost race must not poison the caller's transaction
            RunOutcome.objects.create(session_id=session.id, action=action, violation=violation)
    except IntegrityError:
        return False
    return True


def _roll_back(session: Session) -> str:
    """stop walks the run's undo stack: fail a halted run (the compensation walk follows the
    failure); undo a completed one where the compensation branch offers it."""
    if session.state == session.State.HALTED:
        # After the caller commits: a reviewer's "reject and roll back" halts and fails the run in
        # one transaction, and must not find it failed under its feet.
        session_id = session.pk
        transaction.on_commit(lambda: _fail_if_halted(session_id))
        return "fail"
    if session.state == session.State.COMPLETED:
        undo = getattr(session, "undo", None)
        if undo is None:
            return "unavailable"  # a completed run cannot be failed; Session.undo() is the compensation branch's
        undo(actor=ACTOR)
        return "undo"
    return "failed"  # the run failed on its own: that failure already walks its undo stack


def _fail_if_halted(session_id: Any) -> None:
    session = Session.objects.filter(pk=session_id, state=Session.State.HALTED).first()
    if session is None:
        return  # already failed (and being walked) by whoever halted it
    try:
        session.fail("budget exceeded: on_exceeded stop", actor=ACTOR)
    except Conflict:
        pass  # failed by someone else between the read and the guarded move: same outcome


def _escalate(agent: Agent, session: Session, limits: Limits, data: dict[str, Any]) -> str | None:
    """Queue the escalation webhook as an `escalation` delivery in the run's transaction: the
    worker sends it signed with the org's secret, `Idempotency-Key: <delivery id>`."""
    if not limits.escalation_url:
        return None
    escalation = Delivery.objects.create(
        org_id=agent.org_id, purpose=Delivery.Purpose.ESCALATION, agent=agent, session_id=session.id,
        kind="budget.exceeded", url=limits.escalation_url, max_attempts=Delivery.ESCALATION_MAX_ATTEMPTS,
        body={"event": "budget.exceeded", "org": agent.org.slug, "agent": agent.name,
              "session": str(session.id), "at": timezone.now().isoformat(),
              **{k: v for k, v in data.items() if k != "escalation"}})
    escalation.enqueue_after_commit()
    return str(escalation.id)
