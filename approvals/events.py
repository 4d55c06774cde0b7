"""Approval event payloads (typed), and the words people read about events (Slack, email).

The fan-out itself (`publish` to an org's Channels group, the coalesced `session.updated`)
lives in `core.fanout`, below every app; its names stay importable from here. Webhooks get
the same `{"type", "payload"}` body as the websocket (or a Slack rendering of it).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from django.conf import settings

from approvals.models import ApprovalRequest
from core.fanout import (  # the fan-out moved below the apps; these names stay importable from here
    MAX_SESSION_CHANGES,
    EventPayload,
    Message,
    SessionChange,
    SessionUpdatedPayload,
    SessionUpdates,
    group_name,
    publish,
    publish_many,
    session_changed,
    session_updates,
)
from orgs.models import Event

__all__ = ["MAX_SESSION_CHANGES", "EventPayload", "Message", "SessionChange", "SessionUpdatedPayload",
           "SessionUpdates", "group_name", "publish", "publish_many", "session_changed", "session_updates", "settings"]

APPROVAL_KINDS = frozenset({"approval.requested", "approval.decided", "approval.expired", "approval.extended",
                            "approval.counted"})


class CallInContext(TypedDict):
    step_index: int
    tool: str
    tier: str
    args: dict[str, Any]
    state: str
    result: str | None
    error: str | None


class ReasoningStep(TypedDict):
    step_index: int
    text: str


class AgentContext(TypedDict):
    calls: list[CallInContext]
    reasoning: list[ReasoningStep]


class ApprovalByDict(TypedDict):
    by: str
    at: str


class TaintedDict(TypedDict):
    """An argument that carried a token from untrusted output: which, and from which earlier call."""

    arg: str
    token: str
    from_step: int
    from_tool: str


class WhyDict(TypedDict):
    """Why a rule holds a call: the rule, its message, what `tainted()` found, and, when
    `requested()` said no on the way, `requested: false` with the reason."""

    rule: str
    message: str
    tainted: list[TaintedDict]
    requested: NotRequired[bool]
    requested_reason: NotRequired[str]
    # What `asked()` and `read_untrusted()` found on the way (issue 38), and both in one sentence.
    asked: NotRequired[bool]
    asked_reason: NotRequired[str]
    read_untrusted: NotRequired[dict[str, Any]]
    because: NotRequired[str]


NOT_REQUESTED = "and was not named in the user's request"


def why_text(why: list[dict]) -> str:
    """One line for the queue card and Slack: 'rule x: to came from read_inbox at step 2' (and,
    when `requested()` said no, 'and was not named in the user's request')."""
    parts = []
    for item in why or []:
        unrequested = item.get("requested") is False
        suffix = f" {NOT_REQUESTED}" if unrequested else ""
        found = "; ".join(f"{t['arg']} came from {t['from_tool']} at step {t['from_step']}{suffix}"
                          for t in item.get("tainted") or [])
        if not found and unrequested:
            found = f"not what the user asked for: {item.get('requested_reason') or 'not named in the request'}"
        # What `asked()` and `read_untrusted()` found ("the request never asked for …; the run read …").
        parts.append(f"rule {item.get('rule')}: {found or item.get('because') or item.get('message') or 'matched'}")
    return " · ".join(parts)


class RuleObservationDict(TypedDict):
    """An observe-mode rule that matched: what it would have decided."""

    rule: str
    outcome: str
    approvals_required: int


class ApprovalPayload(TypedDict):
    """An approval request as a reviewer sees it, full context included."""

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
    agent_context: AgentContext
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


class ApprovalEventPayload(EventPayload):
    """approval.requested / .decided / .expired / .extended: the request as it is now."""

    approval: ApprovalPayload


def approval_payload(approval) -> ApprovalPayload:
    """`approval` with `effect`, `session__agent` and `effect__tool` loaded (one query)."""
    effect = approval.effect
    return ApprovalPayload(
        id=str(approval.id), state=approval.state, decision=approval.decision, tool=approval.tool_name,
        agent=approval.session.agent.name, session=str(approval.session_id), effect=str(approval.effect_id),
        step_index=effect.step_index, reason=approval.reason, risk_tags=approval.risk_tags,
        estimated_impact=approval.estimated_impact, proposed_args=approval.proposed_args,
        args_digest=approval.args_digest, approved_args=effect.approved_args, agent_context=approval.agent_context,
        timeout_at=approval.timeout_at.isoformat(), auto_approve_on_timeout=approval.auto_approve_on_timeout,
        executor=bool(effect.tool_id and effect.tool and effect.tool.executor_url),
        created=approval.created.isoformat(), decided_by=approval.decided_by_label or None,
        decided_at=approval.decided_at.isoformat() if approval.decided_at else None,
        decision_reason=approval.decision_reason or None, rollback=approval.rollback,
        approvals_required=approval.approvals_required, approvals=approval.approvals, quorum=approval.quorum,
        rule=approval.rule or None, rule_observations=approval.rule_observations, why=approval.why or [],
        reviewer_group=approval.reviewer_group_name or None, flagged=approval.flagged,
    )


def payload_for(event: Event, approval: Any = None) -> EventPayload | ApprovalEventPayload:
    """The event's payload, its approval re-read as it is now; or, given `approval` (the fast
    approval path's request, written in the event's own statement, with its effect, session,
    agent and tool in memory), built from it without a query (~3 ms of ORM compilation less)."""
    base = EventPayload(
        id=str(event.id), kind=event.kind, org=str(event.org_id),
        agent=event.agent.name if event.agent_id and event.agent else None,
        session=str(event.session_id) if event.session_id else None,
        created=event.created.isoformat(), data=event.data,
    )
    approval_id = (event.data.get("approval") or {}).get("id") if event.kind in APPROVAL_KINDS else None
    if approval is not None and approval_id == str(approval.id):
        return ApprovalEventPayload(**base, approval=approval_payload(approval))
    if approval_id:
        approval = (ApprovalRequest.objects.select_related("effect__tool", "session__agent")
                    .filter(pk=approval_id, org_id=event.org_id).first())
        if approval is not None:
            return ApprovalEventPayload(**base, approval=approval_payload(approval))
    return base


# ---------------------------------------------------------------- words for people


def describe(payload: EventPayload) -> str:
    """One line a person reads in Slack or an email subject."""
    kind, data = payload["kind"], payload["data"]
    approval = payload.get("approval")
    agent = payload["agent"] or "an agent"
    if approval is not None:
        tool = approval["tool"]
        if kind == "approval.requested":
            impact = f": {approval['estimated_impact']}" if approval["estimated_impact"] else ""
            return f"{agent} asks to run {tool}{impact} (decide by {approval['timeout_at'][:19]}Z)."
        if kind == "approval.decided":
            why = f": {approval['decision_reason']}" if approval["decision_reason"] else ""
            return f"{approval['decided_by']} {approval['decision']} {agent}'s call to {tool}{why}."
        if kind == "approval.expired":
            return f"{agent}'s call to {tool} expired without a decision; the run was halted."
        if kind == "approval.counted":
            return (f"{data.get('by')} approved {agent}'s call to {tool} ({approval['quorum']}); "
                    "another reviewer must approve it too.")
        if kind == "approval.extended":
            return f"{data.get('extended_by')} extended the deadline for {agent}'s call to {tool}."
    if kind == "compensation.failed":
        return f"A compensation of {agent}'s run failed and needs a person: {data.get('error') or data}."
    if kind == "permission_denied":
        return f"{agent}'s call to {data.get('tool_name')} was refused ({data.get('kind')}): {data.get('reason')}."
    return f"{kind} ({agent}): {data}"


def slack_body(payload: EventPayload, link: str = "") -> dict[str, Any]:
    """A Slack incoming-webhook body: `text` (notifications, fallbacks) and `blocks`."""
    text = describe(payload)
    fields = [f"*Event*\n{payload['kind']}", f"*Agent*\n{payload['agent'] or '-'}"]
    approval = payload.get("approval")
    if approval is not None:
        fields += [f"*Tool*\n{approval['tool']}", f"*Risk*\n{', '.join(approval['risk_tags']) or '-'}"]
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": text}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in fields]},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": f"undolog · {payload['created'][:19]}Z"
                                          + (f" · <{link}|open>" if link else "")}]},
    ]
    return {"text": text, "blocks": blocks}
