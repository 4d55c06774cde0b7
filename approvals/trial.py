"""Trying a rule before it is switched on: what it would have done to the org's real approval
requests of the last N days (`POST /api/v1/rules/trial`).

Each request is evaluated as the intercept would have evaluated it, with what was stored:
its proposed args, its tool (the tool as registered now; the request's own risk tags), its
agent, and `now` at the time it was made, in the org's zone. Two approximations, said in the
answer too: `run` is the run's counters as they are now (the step of the call itself is
exact), and `day` is that whole day's usage from the effect log.

Run-aware conditions see the run as it was at that call: `run.calls` and `tainted()` only what
came before its step, `window()` what the agent did before it. Compensable calls of the period
are tried too (they have no approval request: a rule naming them would have held them), counted
under `compensable` and never as something people decided.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import cel
from django.utils import timezone

from approvals import runaware
from approvals.models import ApprovalRequest
from approvals.rules import Rule, compile_condition, now_in, reads_of, run_of, tool_of, usage_of
from budgets import day_usage
from effects.models import Effect, Tier, Tool
from orgs.models import Agent, Organization

MAX_REQUESTS = 10_000
EXAMPLES = 5
BUCKETS = ("approved", "denied", "left_to_people")
NOTE = ("Evaluated on each request's stored args, tool, agent and time; `run` is the run's counters as they "
        "are now and `day` that whole day's usage.")


def trial(org: Organization, condition: str, outcome: str, days: int = 7, *, agent: Agent | None = None,
          tool: str = "") -> dict[str, Any]:
    """1. Compile the condition (a 400 naming the position if it does not).
    2. Read the org's approval requests of the last `days` (newest first, at most 10,000),
       narrowed to the rule's agent and tool if it has them.
    3. Evaluate each; a match counts toward the outcome (`require` still leaves it to people),
       anything else (no match, an error) is left to people.
    4. Counts, how often the rule disagrees with what people decided, and a few examples of each.
    """
    program = compile_condition(condition)
    since = timezone.now() - timedelta(days=days)
    requests = (ApprovalRequest.objects.for_org(org).filter(created__gte=since)
                .select_related("session__agent", "effect").order_by("-created"))
    if agent is not None:
        requests = requests.filter(session__agent=agent)
    if tool:
        requests = requests.filter(tool_name=tool)
    rows = list(requests[: MAX_REQUESTS + 1])
    reads = reads_of(condition, program)
    tools = {t.name: t for t in Tool.objects.for_org(org)}
    # A run-aware condition, or one for a compensable tool, may hold compensable calls: try those too.
    tries_compensable = bool(reads) or (tool in tools and tools[tool].tier == Tier.COMPENSABLE)
    if tries_compensable:
        rows = rows + _compensable_calls(org, since, agent, tool, MAX_REQUESTS + 1 - len(rows))
    days_used = _DayUsage(org) if "day" in program.variables() else None
    counts = dict.fromkeys(("requests", "matched", "errors", *BUCKETS, "approved_but_people_rejected",
                            "denied_but_people_approved", *(["compensable"] if tries_compensable else [])), 0)
    examples: dict[str, list[dict[str, Any]]] = {bucket: [] for bucket in BUCKETS}
    for request in rows[:MAX_REQUESTS]:
        view = _view(request, reads)
        matched, error = _matches(program, _activation(org, request, tools, days_used, view, reads), view)
        if tries_compensable:
            counts["compensable"] += isinstance(request, _CompensableCall)
        bucket = _bucket(outcome, matched)
        counts["requests"] += 1
        counts["matched"] += matched
        counts["errors"] += error
        counts[bucket] += 1
        counts["approved_but_people_rejected"] += bucket == "approved" and request.state == "rejected"
        counts["denied_but_people_approved"] += bucket == "denied" and request.state == "approved"
        if len(examples[bucket]) < EXAMPLES:
            examples[bucket].append(_example(request, matched))
    return {"condition": condition, "outcome": outcome, "days": days, "since": since.isoformat(),
            "truncated": len(rows) > MAX_REQUESTS, "counts": counts, "examples": examples, "note": NOTE}


def _bucket(outcome: str, matched: bool) -> str:
    if matched and outcome == Rule.Outcome.APPROVE:
        return "approved"
    if matched and outcome == Rule.Outcome.DENY:
        return "denied"
    return "left_to_people"


def _matches(program: Any, activation: dict[str, Any], view: runaware.RunView | None = None) -> tuple[bool, bool]:
    """(matched, failed): as on the intercept, only a boolean true matches."""
    try:
        functions = view.functions() if view is not None else None
        return program.execute(cel.Context(activation, functions)) is True, False
    except Exception:  # a CEL runtime error (a missing key, bad operands) is no match
        return False, True


class _CompensableCall:
    """A compensable effect of the period, read as the trial reads an approval request."""

    def __init__(self, effect: Effect) -> None:
        self.id, self.effect, self.session = effect.id, effect, effect.session
        self.tool_name, self.proposed_args, self.created = effect.tool_name, effect.args, effect.created
        self.risk_tags, self.state, self.decided_by_label = [], effect.state, ""


def _compensable_calls(org: Organization, since: Any, agent: Agent | None, tool: str,
                       limit: int) -> list[_CompensableCall]:
    if limit <= 0:
        return []
    effects = (Effect.objects.filter(org=org, tier=Tier.COMPENSABLE, created__gte=since)
               .select_related("session__agent").order_by("-created"))
    if agent is not None:
        effects = effects.filter(session__agent=agent)
    if tool:
        effects = effects.filter(tool_name=tool)
    return [_CompensableCall(e) for e in effects[:limit]]


def _view(request: Any, reads: frozenset[str]) -> runaware.RunView | None:
    if not reads:
        return None
    return runaware.RunView(request.session, request.session.agent_id, step_index=request.effect.step_index,
                            moment=request.created, exclude=request.effect.pk, args=request.proposed_args)


def _activation(org: Organization, request: ApprovalRequest, tools: dict[str, Tool],
                days_used: _DayUsage | None, view: runaware.RunView | None = None,
                reads: frozenset[str] = frozenset()) -> dict[str, Any]:
    registered = tools.get(request.tool_name)
    tool = tool_of(registered) if registered else {"name": request.tool_name, "tier": Tier.IRREVERSIBLE,
                                                   "cost_weight": 1.0, "irreversible": True}
    tool["risk_tags"] = list(request.risk_tags or [])  # as the request was shown
    session = request.session
    activation = {"args": request.proposed_args, "tool": tool, "agent": {"name": session.agent.name},
                  "run": {**run_of(session, view, reads), "step_index": request.effect.step_index},
                  "now": now_in(org, request.created)}
    if days_used is not None:
        activation["day"] = days_used.of(session.agent_id, request.created)
    return activation


class _DayUsage:
    """That day's usage of an agent from the effect log, read once per agent and day."""

    def __init__(self, org: Organization) -> None:
        self.org, self.seen = org, {}

    def of(self, agent_id: Any, moment) -> dict[str, Any]:
        day = moment.astimezone(self.org.tz).date()
        if (agent_id, day) not in self.seen:
            self.seen[(agent_id, day)] = usage_of(day_usage.from_log(self.org, day, [agent_id]).get(agent_id))
        return self.seen[(agent_id, day)]


def _example(request: ApprovalRequest, matched: bool) -> dict[str, Any]:
    kind = "effect" if isinstance(request, _CompensableCall) else "approval"
    return {kind: str(request.id), "tool": request.tool_name, "agent": request.session.agent.name,
            "args": request.proposed_args, "created": request.created.isoformat(), "matched": matched,
            "state": request.state, "decided_by": request.decided_by_label or None}
