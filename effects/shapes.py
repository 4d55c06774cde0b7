"""Typed response bodies of the effects API (registry, sessions, effects, undo entries): what
the code returns and what the OpenAPI schema documents (`core.schema.shape`)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict


class CompensationDict(TypedDict):
    """A compensation function of the registry."""

    id: int
    fn_name: str
    fn_version: str
    handler: Literal["webhook", "python", "agent"]
    target: str
    timeout_ms: int
    claim_timeout_s: int
    description: str
    scope: str  # agent handler: the upstream identity a claim must name ("": unscoped)


class CompensationListDict(TypedDict):
    compensations: list[CompensationDict]


class ToolCompensationDict(TypedDict):
    fn_name: str
    fn_version: str
    args: dict[str, Any]
    max_retries: int
    retry_backoff_ms: int


class ToolApprovalDict(TypedDict):
    reason: str
    risk_tags: list[str]
    estimated_impact: str
    timeout_s: int | None
    auto_approve_on_timeout: bool | None
    approvals_required: int


class ToolExecutorDict(TypedDict):
    url: str
    timeout_ms: int


class ToolDict(TypedDict):
    """A registered tool: its tier and, by tier, its compensation or approval settings."""

    id: str
    name: str
    tier: Literal["safe", "compensable", "irreversible"]
    description: str
    cost_weight: float
    irreversible: bool
    annotations: dict[str, Any]
    compensation: NotRequired[ToolCompensationDict]
    pre_image: NotRequired[dict[str, Any]]
    approval: NotRequired[ToolApprovalDict]
    executor: NotRequired[ToolExecutorDict]


class ToolListDict(TypedDict):
    tools: list[ToolDict]


class EffectDict(TypedDict):
    """One call that changes something, with its state (DESIGN.md's effect)."""

    id: str
    session: str
    tool: str
    tier: str
    state: str
    step_index: int
    call_signature: str
    args: dict[str, Any]
    approved_args: dict[str, Any] | None
    result: Any
    error: str | None
    created: str
    updated: str
    executor: NotRequired[bool]
    decision: NotRequired[str | None]
    reason: NotRequired[str | None]


class ApprovalSummaryDict(TypedDict):
    """An approval request as its agent sees it."""

    id: str
    state: str
    timeout_at: str
    decided_by: NotRequired[str | None]
    reason: NotRequired[str | None]
    decision: NotRequired[str | None]
    decided_args_digest: NotRequired[str | None]


class EffectWithApprovalDict(EffectDict):
    approval: NotRequired[ApprovalSummaryDict]


class EffectBodyDict(TypedDict):
    effect: EffectDict


class EffectReadDict(TypedDict):
    """An effect; a decided irreversible call has its decision at the top too."""

    effect: EffectWithApprovalDict
    decision: NotRequired[str | None]
    reason: NotRequired[str | None]


# One state change ("from" is a keyword: the functional form).
TransitionDict = TypedDict("TransitionDict", {"from": "str | None", "to": str, "actor": str, "reason": str, "at": str})


class UndoAttemptDict(TypedDict):
    number: int
    started_at: str
    duration_ms: int | None
    outcome: str
    status_code: int | None
    error: str | None
    retry_delay_ms: int | None


class UndoEntryDict(TypedDict):
    """One compensation on a run's undo stack."""

    id: str
    session: str
    effect: str
    step_index: int
    fn_name: str
    fn_version: str
    args: dict[str, Any]
    state: str
    attempts: int
    max_retries: int
    retry_backoff_ms: int
    next_attempt_at: str | None
    last_error: str | None
    last_status_code: int | None
    resolution_note: str | None
    resolved_by: str | None
    resolved_at: str | None
    updated: str | None
    args_template: dict[str, Any] | None
    claim_deadline: str | None
    attempt_log: NotRequired[list[UndoAttemptDict]]


class UndoEntryListedDict(UndoEntryDict):
    """An undo entry in the org's list, with its tool, agent and run state."""

    tool: str
    agent: str
    session_state: str
    handler: str
    waiting_for: str | None


class ClaimedEntryDict(TypedDict):
    """An agent-side undo entry handed to its claimer, under a lease."""

    id: str
    fn_name: str
    fn_version: str
    args: dict[str, Any]
    attempt: int
    lease_expires_at: str
    session: str
    effect: str
    tool: str
    step_index: int
    scope: str  # the upstream its function is scoped to ("": unscoped)


class ClaimedListDict(TypedDict):
    entries: list[ClaimedEntryDict]


class SessionDict(TypedDict):
    """A run of an agent."""

    id: str
    agent: str
    state: str
    step_index: int
    metadata: dict[str, Any]
    error: str | None
    started_by: str | None
    on_idle: str
    created: str
    updated: str
    ended_at: str | None
    rewinding_to: NotRequired[int]  # while a rewind's walk runs (lifecycle/rewind.py): the step it goes back to


class SessionBodyDict(TypedDict):
    session: SessionDict


class SessionListDict(TypedDict):
    sessions: list[SessionDict]


class InterceptDict(TypedDict):
    """The intercept's answer: execute (201), await_approval (202), approved (201: a reviewer's grant
    decided it at once; claim it with /start, then run it), replay (200) or refused (429)."""

    decision: Literal["execute", "await_approval", "approved", "replay", "refused"]
    effect: NotRequired[EffectDict]
    undo_entry: NotRequired[UndoEntryDict]
    approval: NotRequired[ApprovalSummaryDict]
    reason: NotRequired[str | None]
    kind: NotRequired[str]
    limit: NotRequired[str]
    message: NotRequired[str]
    limit_value: NotRequired[float | None]
    current: NotRequired[float | None]
    refusal: NotRequired[str]
    tool: NotRequired[str]
    incident: NotRequired[bool]


class UndoEntryBodyDict(TypedDict):
    undo_entry: UndoEntryListedDict


class UndoEntryAnswerDict(TypedDict):
    undo_entry: UndoEntryListedDict
    session: SessionDict


class UndoEntryListDict(TypedDict):
    undo_entries: list[UndoEntryListedDict]


class RollbackProgressDict(TypedDict):
    """An agent's runs being walked back now, and the undo entries they have left."""

    runs: int
    entries_left: int


class RollbackDict(TypedDict):
    """A fleet rollback: the runs it takes (open and halted ones failed, completed ones undone)
    and the open undo entries on their stacks."""

    id: NotRequired[str]  # a rollback made: its `agent.rolled_back` event's id
    runs: int
    entries: int
    running: int
    ended: int
    since: str
    in_progress: NotRequired[RollbackProgressDict]


class RollbackRecordDict(TypedDict):
    """A fleet rollback made: its `agent.rolled_back` event (id, when, who, why, since when, the
    counts as it started) and what its runs have left to walk back now."""

    id: str
    created: str
    by: str
    reason: str
    since: str
    runs: int
    entries: int
    running: int
    ended: int
    in_progress: RollbackProgressDict


class RollbackListDict(TypedDict):
    rollbacks: list[RollbackRecordDict]


class RollbackRunDict(TypedDict):
    id: str
    state: str


class RollbackDetailDict(RollbackRecordDict):
    """One rollback with its runs, a page at a time in id order (`next`: the `after` of the next
    page, null on the last)."""

    sessions: list[RollbackRunDict]
    next: str | None


class RollbackPreviewDict(TypedDict):
    """What a rollback since `since` would take now (with `since`), and what is being walked back."""

    runs: NotRequired[int]
    entries: NotRequired[int]
    running: NotRequired[int]
    ended: NotRequired[int]
    since: NotRequired[str]
    in_progress: RollbackProgressDict
