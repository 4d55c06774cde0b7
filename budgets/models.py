"""Budget policies, day counters, refusals and run outcomes (see budgets/README.md).
Escalations are `deliveries.Delivery` rows (purpose `escalation`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from core.errors import Invalid
from orgs.models import Agent, Event, Organization

# (policy field, counter field on Session and DayCounter, key in `usage` and `remaining`).
RUN_LIMITS = (
    ("max_tool_calls_per_run", "tool_calls", "tool_calls_run"),
    ("max_irreversible_per_run", "irreversible_calls", "irreversible_run"),
    ("max_cost_per_run", "cost", "cost_run"),
)
DAY_LIMITS = (
    ("max_tool_calls_per_day", "tool_calls", "tool_calls_day"),
    ("max_irreversible_per_day", "irreversible_calls", "irreversible_day"),
    ("max_cost_per_day", "cost", "cost_day"),
)
LIMIT_FIELDS = tuple(name for name, _, _ in RUN_LIMITS + DAY_LIMITS)
TOOL_CAPS = "tool_caps_per_run"
COUNTERS = ("tool_calls", "irreversible_calls", "cost")


@dataclass
class Usage:
    """An amount charged to counters: calls, irreversible calls, cost weight."""

    tool_calls: int = 0
    irreversible_calls: int = 0
    cost: Decimal = field(default_factory=Decimal)

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.tool_calls + other.tool_calls, self.irreversible_calls + other.irreversible_calls,
                     self.cost + other.cost)

    def __bool__(self) -> bool:
        return bool(self.tool_calls or self.irreversible_calls or self.cost)

    def get(self, counter: str) -> int | Decimal:
        return getattr(self, counter)


def number(value: int | Decimal | None) -> int | float | None:
    """Counters and limits as JSON numbers: counts stay ints, costs become floats."""
    if value is None or isinstance(value, int):
        return value
    return float(round(value, 4))


def text(value: int | Decimal) -> str:
    """16.0000 → "16", 20.0200 → "20.02": the numbers in reasons and messages."""
    if isinstance(value, Decimal):
        return format(value.normalize(), "f")
    return str(value)


# ---------------------------------------------------------------- policies


class BudgetPolicyQuerySet(models.QuerySet):
    def for_agent(self, org_id: Any, agent_id: Any) -> BudgetPolicyQuerySet:
        """The agent's own policy and the org default, in one query (with the org)."""
        return self.select_related("org").filter(Q(agent_id=agent_id) | Q(agent__isnull=True), org_id=org_id)

    def org_default(self, org: Organization) -> BudgetPolicyQuerySet:
        return self.filter(org=org, agent__isnull=True)


class BudgetPolicy(models.Model):
    """An agent's autonomy budget, or (agent empty) the org default for agents without one.

    A limit left empty (null) is no limit. The org default row also carries the org's
    incident switch: while it is on, every agent of the org is held at 0 irreversible calls,
    whatever its own limits say, so switching it off restores them untouched.
    """

    class Mode(models.TextChoices):
        ENFORCE = "enforce"
        OBSERVE = "observe"

    class OnExceeded(models.TextChoices):
        PAUSE = "pause"
        STOP = "stop"
        ESCALATE = "escalate"

    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="budget_policies")
    agent = models.OneToOneField(Agent, null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="budget_policy", help_text="Empty: the org default.")
    max_tool_calls_per_run = models.PositiveIntegerField(null=True, blank=True)
    max_irreversible_per_run = models.PositiveIntegerField(null=True, blank=True)
    max_cost_per_run = models.DecimalField(max_digits=14, decimal_places=4, null=True, blank=True)
    max_tool_calls_per_day = models.PositiveIntegerField(null=True, blank=True)
    max_irreversible_per_day = models.PositiveIntegerField(null=True, blank=True)
    max_cost_per_day = models.DecimalField(max_digits=14, decimal_places=4, null=True, blank=True)
    tool_caps_per_run = models.JSONField(default=dict, blank=True,
                                         help_text='Calls of one tool per run: {"delete_account": 3}.')
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.ENFORCE)
    on_exceeded = models.CharField(max_length=16, choices=OnExceeded.choices, default=OnExceeded.PAUSE)
    escalation_url = models.CharField(max_length=500, blank=True)
    incident = models.BooleanField(default=False, help_text="Org default row only: the org's incident switch.")
    incident_changed_at = models.DateTimeField(null=True, blank=True)
    incident_changed_by = models.CharField(max_length=200, blank=True)
    updated = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=200, blank=True)

    objects = BudgetPolicyQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "budget policies"
        constraints = [
            models.UniqueConstraint(fields=["org"], condition=Q(agent__isnull=True), name="one_org_default_budget"),
        ]

    def __str__(self) -> str:
        return f"budget of {self.agent.name if self.agent_id else 'the org (default)'}"

    SETTINGS = (*LIMIT_FIELDS, TOOL_CAPS, "mode", "on_exceeded", "escalation_url")

    def settings(self) -> dict[str, Any]:
        """The stored policy as JSON (no incident override)."""
        body: dict[str, Any] = {name: number(getattr(self, name)) for name in LIMIT_FIELDS}
        body.update({TOOL_CAPS: dict(self.tool_caps_per_run), "mode": self.mode, "on_exceeded": self.on_exceeded,
                     "escalation_url": self.escalation_url or None})
        return body

    @property
    def tracks_day(self) -> bool:
        """A daily limit is set: its counters are kept on the intercept path."""
        return any(getattr(self, name) is not None for name, _, _ in DAY_LIMITS)

    def copy_for(self, agent: Agent) -> BudgetPolicy:
        """A new agent policy starting from this (org default) one's settings."""
        return BudgetPolicy(org_id=self.org_id, agent=agent,
                            **{name: getattr(self, name) for name in self.SETTINGS})

    def change(self, changes: dict[str, Any], actor: str) -> None:
        """Save the changed settings and their history row (who, each setting from → to).
        Escalate needs somewhere to escalate to."""
        if not changes:
            raise Invalid({"non_field_errors": "Send at least one setting to change."},
                          "Send at least one setting to change.")
        before = self.settings()
        for name, value in changes.items():
            setattr(self, name, value)
        if self.on_exceeded == self.OnExceeded.ESCALATE and not self.escalation_url:
            raise Invalid({"escalation_url": "Required while on_exceeded is escalate."},
                          "escalation_url: required while on_exceeded is escalate.")
        self.updated_by = actor
        self.save()
        after = self.settings()
        diff = {name: [before[name], after[name]] for name in after if before[name] != after[name]}
        PolicyChange.objects.create(org_id=self.org_id, agent_id=self.agent_id, actor=actor, changes=diff)
        # For the audit chain (ops/audit.py) and the org's event stream.
        Event.record(self.org, "policy.changed", agent=self.agent, by=actor, changes=diff)

    def switch_incident(self, on: bool, actor: str) -> bool:
        """The org default row's incident switch, with its history row and event. Whether it
        changed (switching to where it already is changes nothing and records nothing)."""
        if self.incident == on:
            return False
        self.incident, self.incident_changed_at, self.incident_changed_by = on, timezone.now(), actor
        self.save()
        PolicyChange.objects.create(org_id=self.org_id, actor=actor, changes={"incident": [not on, on]})
        Event.record(self.org, "incident.changed", on=on, by=actor, agents=Agent.objects.for_org(self.org).count())
        return True


@dataclass(frozen=True)
class Limits:
    """The policy the guard applies to one agent: its own, else the org default, else none."""

    source: str  # "agent", "org" or "none"
    values: dict[str, Any]
    tool_caps: dict[str, int]
    mode: str = BudgetPolicy.Mode.ENFORCE
    on_exceeded: str = BudgetPolicy.OnExceeded.PAUSE
    escalation_url: str = ""
    incident: bool = False
    org: Organization | None = None
    policy: BudgetPolicy | None = None

    @classmethod
    def for_agent(cls, org_id: Any, agent_id: Any) -> Limits:
        """One query: the agent's row and the org default row."""
        rows = list(BudgetPolicy.objects.for_agent(org_id, agent_id))
        own = next((row for row in rows if row.agent_id is not None), None)
        default = next((row for row in rows if row.agent_id is None), None)
        policy = own or default
        incident = bool(default and default.incident)
        if policy is None:
            return cls(source="none", values=dict.fromkeys(LIMIT_FIELDS), tool_caps={})
        values = {name: getattr(policy, name) for name in LIMIT_FIELDS}
        if incident:
            values["max_irreversible_per_run"] = 0
        return cls(source="agent" if own else "org", values=values, tool_caps=dict(policy.tool_caps_per_run),
                   mode=policy.mode, on_exceeded=policy.on_exceeded, escalation_url=policy.escalation_url,
                   incident=incident, org=policy.org, policy=policy)

    @property
    def observe(self) -> bool:
        return self.mode == BudgetPolicy.Mode.OBSERVE

    @property
    def tracks_day(self) -> bool:
        """Day counters cost a write on a row all the agent's runs share: kept only while capped."""
        return any(self.values[name] is not None for name, _, _ in DAY_LIMITS)

    def day_caps(self) -> dict[str, tuple[str, Any]]:
        return {counter: (name, self.values[name]) for name, counter, _ in DAY_LIMITS
                if self.values[name] is not None}

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {name: number(value) for name, value in self.values.items()}
        body[TOOL_CAPS] = dict(self.tool_caps)
        return body


class PolicyChange(models.Model):
    """Append-only history of budget edits: who changed which setting from what to what."""

    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", editable=False)
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.CASCADE, related_name="+",
                              editable=False, help_text="Empty: the org default.")
    actor = models.CharField(max_length=200, editable=False)
    changes = models.JSONField(default=dict, editable=False, help_text='{"setting": [old, new]}')
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"budget change by {self.actor} @ {self.created:%Y-%m-%d %H:%M}"


# ---------------------------------------------------------------- day counters


class DayCounter(models.Model):
    """What one agent used on one day of its org's calendar. Survives every restart.

    Only ever changed by single UPDATE statements (`used = used + x WHERE used + x <= cap`),
    so parallel runs of the agent never overshoot a cap: the database re-checks the WHERE
    on the latest row version after waiting for the row lock.
    """

    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="day_counters")
    day = models.DateField()
    tool_calls = models.PositiveIntegerField(default=0)
    irreversible_calls = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=16, decimal_places=4, default=Decimal("0"))
    updated = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["agent", "day"], name="one_day_counter_per_agent_day")]
        ordering = ["-day"]

    def __str__(self) -> str:
        return f"{self.agent_id} on {self.day}"

    def usage(self) -> Usage:
        return Usage(self.tool_calls, self.irreversible_calls, self.cost)

    @classmethod
    def add(cls, org_id: Any, agent_id: Any, day: Any, amount: Usage,
            caps: dict[str, tuple[str, Any]] | None = None) -> DayCounter | None:
        """Add `amount` if every cap still holds after it. None when added; else the row that
        stopped it (read after the guarded UPDATE changed nothing)."""
        caps = caps or {}
        for _ in range(4):
            if cls._guarded_update(agent_id, day, amount, caps) == 1:
                return None
            row = cls.objects.filter(agent_id=agent_id, day=day).first()
            if row is None:
                # First charge of the day: make the row (a racing twin's insert wins, ours is ignored).
                cls.objects.bulk_create([cls(org_id=org_id, agent_id=agent_id, day=day)], ignore_conflicts=True)
            elif any(row.usage().get(counter) + amount.get(counter) > cap for counter, (_, cap) in caps.items()):
                return row
            # Else the row was committed by a twin's first charge after our UPDATE looked: again.
        raise RuntimeError(f"day counter of agent {agent_id} on {day}: no charge and no cap in the way")

    @classmethod
    def _guarded_update(cls, agent_id: Any, day: Any, amount: Usage, caps: dict[str, tuple[str, Any]]) -> int:
        rows = cls.objects.filter(agent_id=agent_id, day=day)
        for counter, (_, cap) in caps.items():
            # used + x <= cap, written as used <= cap - x so it reads as a plain column bound.
            rows = rows.filter(**{f"{counter}__lte": cap - amount.get(counter)})
        return rows.update(tool_calls=F("tool_calls") + amount.tool_calls,
                           irreversible_calls=F("irreversible_calls") + amount.irreversible_calls,
                           cost=F("cost") + amount.cost, updated=timezone.now())


# ---------------------------------------------------------------- refusals


class RefusalQuerySet(models.QuerySet):
    def for_org(self, org: Organization) -> RefusalQuerySet:
        return self.filter(org=org)


class Refusal(models.Model):
    """A call the server did not let through (budget, approval denied, policy). Never executed."""

    class Kind(models.TextChoices):
        BUDGET = "budget"
        APPROVAL = "approval"
        POLICY = "policy"
        RULE = "rule"

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

    def as_dict(self) -> dict[str, Any]:
        return {"id": str(self.id), "kind": self.kind, "agent": self.agent.name,
                "session": str(self.session_id) if self.session_id else None,
                "effect": str(self.effect_id) if self.effect_id else None, "tool_name": self.tool_name,
                "step_index": self.step_index, "args": self.args, "decided_by": self.decided_by,
                "limit": self.limit or None, "reason": self.reason, "message": self.message or None,
                "observed": self.observed, "created": self.created.isoformat()}


# ---------------------------------------------------------------- after the run


class RunOutcome(models.Model):
    """on_exceeded applied to one ended run. The unique session makes it happen once."""

    session = models.OneToOneField("effects.Session", on_delete=models.CASCADE, related_name="budget_outcome",
                                   editable=False)
    action = models.CharField(max_length=16, editable=False, help_text="pause, stop, escalate, or none (observe).")
    violation = models.JSONField(default=dict, editable=False)
    created = models.DateTimeField(default=timezone.now, editable=False)

    def __str__(self) -> str:
        return f"{self.action} after session {self.session_id}"
