"""Typed response bodies of the reviewer API: what the code returns and what the OpenAPI
schema documents (`core.schema.shape`). The websocket's approval payload is
`approvals.events.ApprovalPayload`; a queue row is that without the agent context."""

from __future__ import annotations

from typing import Any, TypedDict

from approvals.events import AgentContext
from effects.shapes import TransitionDict


class ApprovalItemDict(TypedDict):
    """A queue row: the request, without the (possibly large) agent context."""

    id: str
    state: str
    decision: str | None
    tool: str
    agent: str
    session: str
    effect: str
    step_index: int
    reason: str
    risk_tags: list[str]
    estimated_impact: str
    proposed_args: dict[str, Any]
    args_digest: str
    timeout_at: str
    auto_approve_on_timeout: bool
    executor: bool
    created: str
    decided_by: str | None
    decided_at: str | None
    decision_reason: str | None
    rollback: bool
    reasoning: str
    seconds_left: int | None


class ApprovalDetailDict(ApprovalItemDict):
    """The request with its full context, the effect and session as they are now, and history."""

    agent_context: AgentContext
    decided_args_digest: str | None
    effect_state: str
    session_state: str
    session_step_index: int
    history: list[TransitionDict]


class ApprovalListDict(TypedDict):
    approvals: list[ApprovalItemDict]


class ApprovalBodyDict(TypedDict):
    approval: ApprovalDetailDict


class DayStatsDict(TypedDict):
    date: str
    approved: int
    rejected: int
    expired: int
    median_time_to_decide_s: float | None


class ApprovalStatsDict(TypedDict):
    """Pending now; over the last 7 days: decisions, approval rate, median time to decide."""

    pending: int
    overdue: int
    window_days: int
    since: str
    decided: int
    approved: int
    auto_approved: int
    rejected: int
    expired: int
    approval_rate: float | None
    median_time_to_decide_s: float | None
    per_day: list[DayStatsDict]


class OrgSettingsDict(TypedDict):
    """The org's approval defaults and notification switches."""

    org: str
    name: str
    approval_timeout_s: int
    auto_approve_on_timeout: bool
    context_window: int
    email_notifications: bool
    time_zone: str
    rate_limit_per_key: int | None  # requests per minute; None: the server's default
    rate_limit_per_org: int | None


class WebhookDict(TypedDict):
    """Where some of an org's events go (the secret only once, when it is created)."""

    id: str
    url: str
    event_types: list[str]
    slack: bool
    description: str
    active: bool
    created: str
    secret_hint: str


class WebhookCreatedDict(WebhookDict):
    secret: str


class DeliveryAttemptDict(TypedDict):
    number: int
    started_at: str
    duration_ms: int | None
    ok: bool
    status_code: int | None
    error: str | None


class DeliveryDict(TypedDict):
    id: str
    kind: str
    purpose: str
    url: str
    state: str
    attempts: int
    max_attempts: int
    next_attempt_at: str | None
    last_status_code: int | None
    last_error: str | None
    delivered_at: str | None
    created: str
    attempt_log: list[DeliveryAttemptDict]


class WebhookDetailDict(WebhookDict):
    """A webhook with its last 50 deliveries."""

    deliveries: list[DeliveryDict]


class WebhookListDict(TypedDict):
    webhooks: list[WebhookDict]
