"""Typed response bodies of the reviewer API: what the code returns and what the OpenAPI
schema documents (`core.schema.shape`). The websocket's approval payload is
`approvals.events.ApprovalPayload`; a queue row is that without the agent context."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from approvals.events import AgentContext, ApprovalByDict, RuleObservationDict, WhyDict
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
    approved_args: dict[str, Any] | None
    timeout_at: str
    auto_approve_on_timeout: bool
    executor: bool
    created: str
    decided_by: str | None
    decided_at: str | None
    decision_reason: str | None
    rollback: bool
    approvals_required: int
    approvals: list[ApprovalByDict]
    quorum: str
    rule: str | None
    rule_observations: list[RuleObservationDict]
    why: list[WhyDict]
    reviewer_group: str | None
    flagged: bool
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
    decided_by_rule: int
    granted: int
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
    approvals_by_risk_tag: dict[str, int]
    run_idle_timeout_s: int
    rate_limit_per_key: int | None  # requests per minute; None: the server's default
    rate_limit_per_org: int | None


class WebhookSecretDict(TypedDict):
    """The org's webhook signing secret; during a rotation's overlap the old one signs too."""

    secret: str
    signing_secrets: int  # 2 during a rotation's overlap (the old secret signs beside the new)
    previous_secret_expires_at: str | None


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


# ---------------------------------------------------------------- rules


class RuleDict(TypedDict):
    """An approval rule: a CEL condition and what happens to a call it matches."""

    id: str
    name: str
    position: int
    condition: str
    outcome: str
    approvals_required: int
    reviewer_group: str | None
    message: str
    mode: str
    agent: str | None
    tool: str | None
    created: str
    updated: str
    updated_by: str | None


class ReviewerGroupDict(TypedDict):
    """A named set of the org's members that require rules hand calls to."""

    id: str
    name: str
    description: str
    members: list[str]
    created: str
    updated: str
    updated_by: str | None


class ReviewerGroupListDict(TypedDict):
    reviewer_groups: list[ReviewerGroupDict]


class RuleChangeDict(TypedDict):
    """One audited edit: who, when, and each setting from → to."""

    rule: str
    name: str
    action: str
    by: str
    changes: dict[str, list[Any]]
    at: str


class RuleDetailDict(RuleDict):
    changes: list[RuleChangeDict]


class RuleListDict(TypedDict):
    rules: list[RuleDict]


class TrialCountsDict(TypedDict):
    requests: int
    matched: int
    errors: int
    approved: int
    denied: int
    left_to_people: int
    approved_but_people_rejected: int
    denied_but_people_approved: int


class TrialExampleDict(TypedDict):
    approval: str
    tool: str
    agent: str
    args: dict[str, Any]
    created: str
    matched: bool
    state: str
    decided_by: str | None


class TrialExamplesDict(TypedDict):
    approved: list[TrialExampleDict]
    denied: list[TrialExampleDict]
    left_to_people: list[TrialExampleDict]


class RuleTrialDict(TypedDict):
    """What a rule would have done to the last N days of real approval requests."""

    condition: str
    outcome: str
    days: int
    since: str
    truncated: bool
    counts: TrialCountsDict
    examples: TrialExamplesDict
    note: str
class BatchRowDict(TypedDict):
    """One request's outcome in a batch: decided, or why not (the error code of its own decision)."""

    id: str
    ok: bool
    state: NotRequired[str]
    decided_args_digest: NotRequired[str | None]
    error: NotRequired[str]
    message: NotRequired[str]


class BatchResultDict(TypedDict):
    decision: str
    results: list[BatchRowDict]
    decided: int
    failed: int


class GrantDict(TypedDict):
    id: str
    agent: str
    tool: str
    session: str | None
    expires_at: str | None
    created_by: str
    reason: str | None
    created: str
    revoked_at: str | None
    revoked_by: str | None
    live: bool


class GrantBodyDict(TypedDict):
    grant: GrantDict


class GrantListDict(TypedDict):
    grants: list[GrantDict]


class SlackDict(TypedDict):
    """The org's Slack connection as anyone may read it: never the token or the secret."""

    connected: bool
    channel: str | None
    active: bool
    bot_token_hint: str | None
    interactions_url: str | None
