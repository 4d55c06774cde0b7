"""Approval requests: a reviewer's view of one irreversible effect, and its decision."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from effects.models import Effect, Session, Tool, render_text
from orgs.models import Organization


class ApprovalRequestQuerySet(models.QuerySet):
    def for_org(self, org: Organization) -> ApprovalRequestQuerySet:
        return self.filter(org=org)

    def pending(self) -> ApprovalRequestQuerySet:
        return self.filter(state=ApprovalRequest.State.PENDING)

    def due(self) -> ApprovalRequestQuerySet:
        return self.pending().filter(timeout_at__lte=timezone.now())


class ApprovalRequest(models.Model):
    """What a reviewer sees before an irreversible call may run, and what they decided."""

    class State(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        EXPIRED = "expired"

    TERMINAL = frozenset({State.APPROVED, State.REJECTED, State.EXPIRED})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="approval_requests")
    effect = models.OneToOneField(Effect, on_delete=models.CASCADE, related_name="approval")
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="approval_requests")
    tool_name = models.CharField(max_length=200)
    reason = models.TextField()
    risk_tags = models.JSONField(default=list)
    estimated_impact = models.TextField(blank=True)
    proposed_args = models.JSONField(default=dict)
    args_digest = models.CharField(max_length=64)
    agent_context = models.JSONField(default=dict)
    timeout_at = models.DateTimeField(db_index=True)
    auto_approve_on_timeout = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING, db_index=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    decided_by_label = models.CharField(max_length=200, blank=True,
                                        help_text="Username, or 'timeout' for a deadline decision.")
    decision_reason = models.TextField(blank=True)
    decided_args_digest = models.CharField(max_length=64, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(default=timezone.now)

    objects = ApprovalRequestQuerySet.as_manager()

    class Meta:
        ordering = ["timeout_at"]
        indexes = [models.Index(fields=["org", "state", "timeout_at"])]

    def __str__(self) -> str:
        return f"approval of {self.tool_name} ({self.state})"

    @classmethod
    def open_for(cls, effect: Effect, tool: Tool, session: Session, context: dict[str, Any]) -> ApprovalRequest:
        """Create the request in the intercept transaction (deadline: tool, else org)."""
        org = session.org
        timeout_s = tool.approval_timeout_s or org.approval_timeout_s
        auto = tool.auto_approve_on_timeout
        return cls.objects.create(
            org=org, effect=effect, session=session, tool_name=tool.name,
            reason=tool.approval_reason, risk_tags=tool.risk_tags,
            estimated_impact=render_text(tool.estimated_impact, effect.args),
            proposed_args=effect.args, args_digest=effect.args_digest, agent_context=context,
            timeout_at=timezone.now() + timedelta(seconds=timeout_s),
            auto_approve_on_timeout=org.auto_approve_on_timeout if auto is None else auto,
        )

    def summary(self) -> dict[str, Any]:
        return {"id": str(self.id), "state": self.state, "timeout_at": self.timeout_at.isoformat()}
