"""Budget edits, as workflows: an agent's own policy (its first edit starts from the org
default), going back to the default, the org default, and the incident switch. Each takes
its row lock, so two edits of one policy queue instead of losing one; the views only
validate, look up (scoped to the caller's org) and call these."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from budgets import day_usage
from budgets.models import BudgetPolicy, PolicyChange
from orgs.models import Agent, Organization


def org_default(org: Organization) -> BudgetPolicy:
    """The org default row, or an unsaved one (made on its first edit)."""
    return BudgetPolicy.objects.org_default(org).first() or BudgetPolicy(org=org)


def edit_agent_policy(agent: Agent, changes: dict[str, Any], actor: str) -> BudgetPolicy:
    """Change the agent's limits, from its next call on. Its first change copies the org default."""
    with transaction.atomic():
        _lock_agent(agent)  # serialises the first write, which creates the agent's row
        policy = BudgetPolicy.objects.filter(agent=agent).first()
        if policy is None:
            default = BudgetPolicy.objects.org_default(agent.org).first()
            policy = default.copy_for(agent) if default else BudgetPolicy(org=agent.org, agent=agent)
        _change(policy, changes, actor)
    return policy


def drop_agent_policy(agent: Agent, actor: str) -> bool:
    """Drop the agent's own policy: the org default applies from its next call on."""
    with transaction.atomic():
        _lock_agent(agent)
        deleted, _ = BudgetPolicy.objects.filter(agent=agent).delete()
        if deleted:
            PolicyChange.objects.create(org_id=agent.org_id, agent=agent, actor=actor,
                                        changes={"source": ["agent", "org"]})
    return bool(deleted)


def edit_org_default(org: Organization, changes: dict[str, Any], actor: str) -> BudgetPolicy:
    """The default for agents without their own policy, from their next call on."""
    with transaction.atomic():
        policy = org_default(_lock_org(org))
        _change(policy, changes, actor)
    return policy


def switch_incident(org: Organization, on: bool, actor: str) -> tuple[BudgetPolicy, bool]:
    """On: every agent of the org is held at 0 irreversible calls from its next call on;
    off: their own limits apply again, untouched. The policy, and whether it changed."""
    with transaction.atomic():
        policy = org_default(_lock_org(org))
        changed = policy.switch_incident(on, actor)
    return policy, changed


def _change(policy: BudgetPolicy, changes: dict[str, Any], actor: str) -> None:
    tracked_before = policy.tracks_day  # of the settings it starts from (a copy: the org default's)
    policy.change(changes, actor)
    if not tracked_before and policy.tracks_day:
        _catch_up(policy)


def _catch_up(policy: BudgetPolicy) -> None:
    """A daily limit starts to apply: today's counters of the agents it governs start from what
    they already did today (the effect log), not from 0."""
    if policy.agent_id is not None:
        agents = [policy.agent_id]
    else:  # the org default governs the agents without a policy of their own
        own = BudgetPolicy.objects.filter(org_id=policy.org_id, agent__isnull=False).values("agent_id")
        agents = list(Agent.objects.filter(org_id=policy.org_id).exclude(pk__in=own).values_list("pk", flat=True))
    day_usage.catch_up(policy.org, agents)


def _lock_agent(agent: Agent) -> None:
    Agent.objects.select_for_update().filter(pk=agent.pk).first()


def _lock_org(org: Organization) -> Organization:
    # Serialises edits of the org default (its first write creates the row).
    return Organization.objects.select_for_update().get(pk=org.pk)
