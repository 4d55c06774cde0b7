"""The budget guard on the intercept path: charge every call, refuse the one over a limit.

Called inside the intercept transaction with the session row locked, so run counters
are read and written under that lock; day counters are shared by all runs of an agent
and change only through guarded UPDATEs (`DayCounter.add`).

Queries it adds to an intercept: one (the agent's policy and the org default, with the
org) when no daily limit is set; one more (the day counter's guarded UPDATE) when one is.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol

from django.utils import timezone

from budgets.models import RUN_LIMITS, TOOL_CAPS, DayCounter, Limits, Refusal, Usage, number, text
from orgs.models import Agent

if TYPE_CHECKING:
    from effects.models import Session, Tool


class Call(Protocol):
    """What the guard reads of the intercept's call (`lifecycle.intercept.call.Call`, a layer above)."""

    step_index: int
    args: dict

# Session fields the guard changes; the intercept saves them with its own session update.
RUN_FIELDS = ["tool_calls", "irreversible_calls", "cost", "tool_counts", "violation"]
DEFAULT_WEIGHT = Decimal("1")
STOP = "Stop calling tools and give your final answer."


@dataclass(frozen=True)
class Exceeded:
    """The limit a call would break: its name, its value, and where the counter would go."""

    limit: str
    cap: int | Decimal
    current: int | Decimal
    label: str = ""  # how the message names it, when not the limit itself (a per-tool cap)

    def message(self, tool: str) -> str:
        return (f"Budget limit {self.label or self.limit} reached (limit {text(self.cap)}); "
                f"tool call '{tool}' was not executed. {STOP}")

    def reason(self) -> str:
        return f"budget limit {self.label or self.limit} reached ({text(self.current)} > {text(self.cap)})"


def _usage_of(tool: Tool | None) -> Usage:
    if tool is None:  # an unregistered name counts as an ordinary call with weight 1.0 (the guide)
        return Usage(1, 0, DEFAULT_WEIGHT)
    return Usage(1, int(tool.irreversible), tool.cost_weight)


def _count(session: Session, name: str, usage: Usage) -> None:
    session.tool_calls += usage.tool_calls
    session.irreversible_calls += usage.irreversible_calls
    session.cost += usage.cost
    session.tool_counts[name] = session.tool_counts.get(name, 0) + 1


def _pending(session: Session) -> Usage:
    """SAFE calls charged to the run but not yet to the day (one UPDATE carries them all)."""
    return session.__dict__.setdefault("_budget_unsettled", Usage())


def _limits(session: Session) -> Limits:
    cached = session.__dict__.get("_budget_limits")
    if cached is None:
        cached = session.__dict__["_budget_limits"] = Limits.for_agent(session.org_id, session.agent_id)
    return cached


def charge_safe_call(session: Session, tool: Tool | None, name: str) -> None:
    """A reported SAFE call: its weight and count. It already ran, so it is never refused."""
    usage = _usage_of(tool)
    _count(session, name, usage)
    session.__dict__["_budget_unsettled"] = _pending(session) + usage


def settle(session: Session) -> None:
    """Charge reported SAFE calls to the day when the call itself is not (a replay, a run-limit refusal)."""
    pending = _pending(session)
    limits = _limits(session)
    if pending and limits.tracks_day:
        DayCounter.add(session.org_id, session.agent_id, limits.org.today(), pending)
    session.__dict__["_budget_unsettled"] = Usage()


def admit(session: Session, tool: Tool, call: Call) -> dict[str, Any] | None:
    """Count the call, or return the refusal body if it would exceed a limit.

    1. The incident switch refuses every irreversible call, even in observe mode.
    2. Run limits and per-tool caps, against the session's counters (under its row lock).
    3. Day limits, with one guarded UPDATE that also carries the reported SAFE calls.
    4. Refused: not counted; a refusal row, a `permission_denied` event, the run's first
       violation. In observe mode the same is recorded, and the call is counted and let through.
    """
    limits = _limits(session)
    usage = _usage_of(tool)
    if limits.incident and usage.irreversible_calls:
        settle(session)
        return _refuse(session, tool, call, Exceeded("max_irreversible_per_run", 0,
                                                     session.irreversible_calls + 1), limits, incident=True)
    exceeded = _run_exceeded(session, tool, usage, limits)
    if exceeded is not None and not limits.observe:
        settle(session)
        return _refuse(session, tool, call, exceeded, limits)
    day_exceeded = _charge_day(session, usage, limits)
    if day_exceeded is not None and not limits.observe:
        return _refuse(session, tool, call, day_exceeded, limits)
    if exceeded or day_exceeded:
        _refuse(session, tool, call, exceeded or day_exceeded, limits)  # observe mode: a record only
    _count(session, tool.name, usage)
    return None


def exceeds(session: Session, tool: Tool, limits: Limits) -> bool:
    """Whether the call would break a run limit or a per-tool cap (no query): the fast approval
    path (lifecycle/intercept/two_statements.py) leaves such a call to `admit`'s refusal in the pipeline."""
    return _run_exceeded(session, tool, _usage_of(tool), limits) is not None


def _run_exceeded(session: Session, tool: Tool, usage: Usage, limits: Limits) -> Exceeded | None:
    for name, counter, _ in RUN_LIMITS:
        cap = limits.values[name]
        after = getattr(session, counter) + usage.get(counter)
        # Only a counter this call adds to can refuse it: a cap lowered to 0 on irreversible
        # calls must not stop a reversible one.
        if cap is not None and usage.get(counter) and after > cap:
            return Exceeded(name, cap, after)
    cap = limits.tool_caps.get(tool.name)
    after = session.tool_counts.get(tool.name, 0) + 1
    if cap is not None and after > cap:
        return Exceeded(TOOL_CAPS, cap, after, label=f"{TOOL_CAPS}[{tool.name}]")
    return None


def _charge_day(session: Session, usage: Usage, limits: Limits) -> Exceeded | None:
    """Charge the day (SAFE calls first, then this call), unless a day cap would break."""
    pending = _pending(session)
    session.__dict__["_budget_unsettled"] = Usage()
    if not limits.tracks_day:
        return None
    org = limits.org
    caps = {counter: cap for counter, cap in limits.day_caps().items() if usage.get(counter)}
    day = org.today()
    row = DayCounter.add(org.id, session.agent_id, day, pending + usage, caps)
    if row is None:
        return None
    # Refused (or, observing, about to be let through anyway): the SAFE calls happened regardless.
    charge = pending + usage if limits.observe else pending
    if charge:
        DayCounter.add(org.id, session.agent_id, day, charge)
    used = row.usage() + pending + usage
    for counter, (name, cap) in caps.items():
        if used.get(counter) > cap:
            return Exceeded(name, cap, used.get(counter))
    raise AssertionError("DayCounter.add returns a row only when a cap is in the way")


def _refuse(session: Session, tool: Tool, call: Call, exceeded: Exceeded, limits: Limits,
            incident: bool = False) -> dict[str, Any]:
    observed = limits.observe and not incident
    agent = Agent.objects.select_related("org").get(pk=session.agent_id)
    message = exceeded.message(tool.name)
    refusal = Refusal.record(
        agent=agent, kind=Refusal.Kind.BUDGET, tool_name=tool.name, decided_by="budget",
        reason=exceeded.reason(), session_id=session.id, step_index=call.step_index, args=call.args,
        limit=exceeded.limit, message=message, observed=observed)
    if session.violation is None or (session.violation.get("observed") and not observed):
        session.violation = {"limit": exceeded.limit, "limit_value": number(exceeded.cap),
                             "current": number(exceeded.current), "tool": tool.name,
                             "step_index": call.step_index, "reason": exceeded.reason(),
                             "refusal": str(refusal.id), "observed": observed, "incident": incident,
                             "at": timezone.now().isoformat()}
    body: dict[str, Any] = {"decision": "refused", "kind": "budget", "limit": exceeded.limit, "message": message,
                            "limit_value": number(exceeded.cap), "current": number(exceeded.current),
                            "refusal": str(refusal.id)}
    if exceeded.limit == TOOL_CAPS:
        body["tool"] = tool.name
    if incident:
        body["incident"] = True
    return body
