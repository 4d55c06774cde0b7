"""Typed response bodies of the budgets API: what the code returns and what the OpenAPI
schema documents (`core.schema.shape`)."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class ToolCapUseDict(TypedDict):
    limit: int
    used: int
    remaining: int | None


class BudgetSessionDict(TypedDict):
    id: str
    state: str
    violation: Any


class BudgetDict(TypedDict):
    """Limits, usage and what remains: of a run (or the agent's latest run) and of its day."""

    agent: str
    state: str
    suspend_reason: str | None
    source: str
    mode: str
    on_exceeded: str
    escalation_url: str | None
    incident: bool
    limits: dict[str, Any]
    policy: dict[str, Any] | None
    usage: dict[str, float | None]
    remaining: dict[str, float | None]
    tool_caps: dict[str, ToolCapUseDict]
    session: BudgetSessionDict | None
    day: str
    day_tracked: bool


class SessionBudgetDict(TypedDict):
    """A run's counters with its limits (in a session's detail)."""

    tool_calls: int
    irreversible_calls: int
    cost: float
    tool_counts: dict[str, int]
    violation: Any
    limits: dict[str, Any]
    usage: dict[str, float | None]
    remaining: dict[str, float | None]
    tool_caps: dict[str, ToolCapUseDict]
    mode: str
    on_exceeded: str
    incident: bool


class TodayDict(TypedDict):
    tool_calls: int
    irreversible_calls: int
    cost: float | None


class AgentRowDict(TypedDict):
    """An agent with its state, where its budget comes from, and today's counters."""

    name: str
    state: str
    suspend_reason: str | None
    budget_source: str
    today: TodayDict


class AgentsDict(TypedDict):
    day: str
    incident: bool
    agents: list[AgentRowDict]


class AgentBodyDict(TypedDict):
    agent: AgentRowDict


class IncidentDict(TypedDict):
    """The org's incident switch."""

    on: bool
    changed_at: str | None
    changed_by: str | None
    effect: str | None


class IncidentSwitchDict(IncidentDict):
    changed: bool


class OrgBudgetDict(TypedDict):
    """The org default policy, its incident switch, and how many agents have their own."""

    max_tool_calls_per_run: int | None
    max_irreversible_per_run: int | None
    max_cost_per_run: float | None
    max_tool_calls_per_day: int | None
    max_irreversible_per_day: int | None
    max_cost_per_day: float | None
    tool_caps_per_run: dict[str, int]
    mode: str
    on_exceeded: str
    escalation_url: str | None
    limits: dict[str, Any]
    incident: IncidentDict
    agents_with_own_policy: int


class RefusalDict(TypedDict):
    """A call not let through (observed: let through by observe mode)."""

    id: str
    kind: str
    agent: str
    session: str | None
    effect: str | None
    tool_name: str
    step_index: int | None
    args: Any
    decided_by: str
    limit: str | None
    reason: str
    message: str | None
    observed: bool
    created: str


class EventDict(TypedDict):
    """One row of the org's audit stream."""

    id: str
    kind: str
    agent: str | None
    session: str | None
    data: dict[str, Any]
    created: str


class RefusalPageDict(TypedDict):
    refusals: list[RefusalDict]
    next_cursor: str | None
    next: str | None
    previous: NotRequired[str | None]


class EventPageDict(TypedDict):
    events: list[EventDict]
    next_cursor: str | None
    next: str | None
    previous: NotRequired[str | None]


class SuggestDict(TypedDict):
    """Sizing help: each counter's p50/p95/max over the last 7 days, and a suggested cap."""

    agent: str
    window_days: int
    since: str
    runs: int
    healthy_runs: int
    runs_with_violation: int
    method: str
    irreversible_per_run: dict[str, Any]
    cost_per_run: dict[str, Any]
    tool_calls_per_run: dict[str, Any]


class RefusedDict(TypedDict):
    """429 from the intercept: the budget (or the incident switch) refused the call."""

    decision: str
    kind: str
    limit: str
    message: str
    limit_value: float | None
    current: float | None
    refusal: str
    tool: NotRequired[str]
    incident: NotRequired[bool]
