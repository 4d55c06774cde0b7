"""Resume and suspend an agent by hand, as workflows: the guarded state change, who may make
it, and the event the dashboard and the audit stream show. The API views only call these."""

from __future__ import annotations

from django.db import transaction

from core.errors import Conflict, Forbidden
from orgs.auth import Caller
from orgs.models import Agent, Event


def resume(agent: Agent, by: Caller, note: str = "") -> Agent:
    """Back to active. Its next run starts with fresh run counters; today's counters stay. A
    stopped agent needs an admin."""
    with transaction.atomic():
        agent = _locked(agent)
        before, reason = agent.state, agent.suspend_reason
        if before == Agent.State.STOPPED and not by.has_role("admin"):
            raise Forbidden("A stopped agent can only be resumed by an admin.")
        if not agent.resume():
            raise Conflict(f"The agent {agent.name} is {agent.state}; there is nothing to resume.",
                           code="agent_not_suspended", state=agent.state)
        Event.record(agent.org, "agent.resumed", agent=agent, by=by.label, previous_state=before,
                     previous_reason=reason or None, note=note)
    return agent


def suspend(agent: Agent, by: Caller, note: str = "") -> Agent:
    """Suspended by hand: new sessions and calls answer 423 until someone resumes it."""
    with transaction.atomic():
        agent = _locked(agent)
        if not agent.suspend(Agent.SuspendReason.MANUAL):
            raise Conflict(f"The agent {agent.name} is {agent.state}; only an active agent can be suspended.",
                           code="agent_not_active", state=agent.state)
        Event.record(agent.org, "agent.suspended", agent=agent, reason=Agent.SuspendReason.MANUAL,
                     by=by.label, note=note)
    return agent


def _locked(agent: Agent) -> Agent:
    return Agent.objects.select_for_update(of=("self",)).select_related("org").get(pk=agent.pk)
