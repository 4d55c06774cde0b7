"""Budget policies, day counters and refusals (see budgets/README.md)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models
from django.utils import timezone

from orgs.models import Agent, Event, Organization


class RefusalQuerySet(models.QuerySet):
    def for_org(self, org: Organization) -> RefusalQuerySet:
        return self.filter(org=org)


class Refusal(models.Model):
    """A call the server did not let through (budget, approval denied, policy). Never executed."""

    class Kind(models.TextChoices):
        BUDGET = "budget"
        APPROVAL = "approval"
        POLICY = "policy"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="refusals", editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="refusals", editable=False)
    session_id = models.UUIDField(null=True, blank=True, db_index=True, editable=False)
    effect_id = models.UUIDField(null=True, blank=True, editable=False)
    kind = models.CharField(max_length=16, choices=Kind.choices, editable=False)
    tool_name = models.CharField(max_length=200, editable=False)
    step_index = models.PositiveIntegerField(null=True, blank=True, editable=False)
    args = models.JSONField(default=dict, editable=False)
    decided_by = models.CharField(max_length=200, editable=False)
    limit = models.CharField(max_length=64, blank=True, editable=False)
    reason = models.TextField(editable=False)
    message = models.TextField(blank=True, editable=False, help_text="What the agent was told.")
    observed = models.BooleanField(default=False, editable=False,
                                   help_text="Observe mode: would have been refused, was let through.")
    created = models.DateTimeField(default=timezone.now, db_index=True, editable=False)

    objects = RefusalQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]
        indexes = [models.Index(fields=["org", "-created"])]

    def __str__(self) -> str:
        return f"{self.kind} refusal of {self.tool_name}"

    @classmethod
    def record(cls, *, agent: Agent, kind: str, tool_name: str, decided_by: str, reason: str,
               session_id: uuid.UUID | None = None, effect_id: uuid.UUID | None = None,
               step_index: int | None = None, args: dict | None = None, limit: str = "",
               message: str = "", observed: bool = False) -> Refusal:
        """Write the refusal row and its `permission_denied` event (the guide's hook data)."""
        refusal = cls.objects.create(
            org_id=agent.org_id, agent=agent, session_id=session_id, effect_id=effect_id, kind=kind,
            tool_name=tool_name, step_index=step_index, args=args or {}, decided_by=decided_by,
            limit=limit, reason=reason, message=message, observed=observed)
        Event.record(agent.org, "permission_denied", agent=agent, session_id=session_id, **refusal.event_data())
        return refusal

    def event_data(self) -> dict[str, Any]:
        return {"kind": self.kind, "tool_name": self.tool_name, "decided_by": self.decided_by,
                "reason": self.reason, "limit": self.limit or None, "observed": self.observed,
                "refusal": str(self.id)}
