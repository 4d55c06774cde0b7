"""What the API says about a budget: limits, usage and what remains; an agent's row; the org
default with its incident switch. Read by budgets' API and by a session's detail."""

from __future__ import annotations

from typing import Any

from budgets import day_usage
from budgets.models import (
    DAY_LIMITS,
    LIMIT_FIELDS,
    RUN_LIMITS,
    TOOL_CAPS,
    BudgetPolicy,
    Limits,
    Usage,
    number,
)
from effects.models import Session
from orgs.models import Agent, Organization


def _remaining(cap: Any, used: Any) -> Any:
    return None if cap is None else max(cap - used, 0)


def budget_body(agent: Agent, session: Session | None = None, *, latest: bool = True) -> dict[str, Any]:
    """Limits, usage and what remains: of `session`, or of the agent's latest run."""
    limits = Limits.for_agent(agent.org_id, agent.id)
    if session is None and latest:
        session = Session.objects.filter(agent=agent).order_by("-created").first()
    day = agent.org.today()
    run = Usage(session.tool_calls, session.irreversible_calls, session.cost) if session else Usage()
    today = day_usage.today(agent.org, [agent.pk])[agent.pk]  # true with or without a daily limit
    usage: dict[str, Any] = {}
    remaining: dict[str, Any] = {}
    for limits_of, used in ((RUN_LIMITS, run), (DAY_LIMITS, today)):
        for name, counter, key in limits_of:
            usage[key] = number(used.get(counter))
            remaining[key] = number(_remaining(limits.values[name], used.get(counter)))
    counts = session.tool_counts if session else {}
    tools = {tool: {"limit": cap, "used": counts.get(tool, 0), "remaining": _remaining(cap, counts.get(tool, 0))}
             for tool, cap in sorted(limits.tool_caps.items())}
    return {
        "agent": agent.name, "state": agent.state, "suspend_reason": agent.suspend_reason or None,
        "source": limits.source, "mode": limits.mode, "on_exceeded": limits.on_exceeded,
        "escalation_url": limits.escalation_url or None, "incident": limits.incident,
        "limits": limits.as_dict(), "policy": limits.policy.settings() if limits.policy else None,
        "usage": usage, "remaining": remaining, "tool_caps": tools,
        "session": ({"id": str(session.id), "state": session.state, "violation": session.violation}
                    if session else None),
        "day": day.isoformat(), "day_tracked": limits.tracks_day,
    }


def agent_dict(agent: Agent, today: Usage | None, source: str) -> dict[str, Any]:
    usage = today or Usage()
    return {"name": agent.name, "state": agent.state, "suspend_reason": agent.suspend_reason or None,
            "budget_source": source,
            "today": {"tool_calls": usage.tool_calls, "irreversible_calls": usage.irreversible_calls,
                      "cost": number(usage.cost)}}


def agents_body(org: Organization) -> dict[str, Any]:
    """Every agent of the org with its state, where its budget comes from, and today's counters."""
    agents = list(Agent.objects.for_org(org).order_by("name"))
    days = day_usage.today(org, [agent.pk for agent in agents])
    policies = dict(BudgetPolicy.objects.filter(org=org).values_list("agent_id", "pk"))
    default = "org" if None in policies else "none"
    return {"day": org.today().isoformat(), "incident": incident_on(org),
            "agents": [agent_dict(a, days.get(a.pk), "agent" if a.pk in policies else default) for a in agents]}


def agent_with_today(agent: Agent) -> dict[str, Any]:
    today = day_usage.today(agent.org, [agent.pk])[agent.pk]
    return agent_dict(agent, today, Limits.for_agent(agent.org_id, agent.id).source)


def org_body(org: Organization) -> dict[str, Any]:
    policy = BudgetPolicy.objects.org_default(org).first() or BudgetPolicy(org=org)
    own = BudgetPolicy.objects.filter(org=org, agent__isnull=False).count()
    return {**policy.settings(), "limits": {name: number(getattr(policy, name)) for name in LIMIT_FIELDS}
            | {TOOL_CAPS: dict(policy.tool_caps_per_run)},
            "incident": incident_body(policy), "agents_with_own_policy": own}


def incident_on(org: Organization) -> bool:
    return BudgetPolicy.objects.org_default(org).filter(incident=True).exists()


def incident_body(policy: BudgetPolicy | None) -> dict[str, Any]:
    on = bool(policy and policy.incident)
    changed_at = policy.incident_changed_at if policy else None
    return {"on": on, "changed_at": changed_at.isoformat() if changed_at else None,
            "changed_by": (policy.incident_changed_by or None) if policy else None,
            "effect": "every agent of the org at 0 irreversible calls" if on else None}
