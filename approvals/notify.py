"""Telling people: events for new and decided approval requests."""

from __future__ import annotations

from approvals.models import ApprovalRequest
from orgs.models import Event


def approval_requested(approval: ApprovalRequest) -> None:
    Event.record(approval.org, "approval.requested", agent=approval.session.agent,
                 session_id=approval.session_id, approval=approval.summary(),
                 tool=approval.tool_name, effect=str(approval.effect_id))
