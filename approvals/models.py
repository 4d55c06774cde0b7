"""Approval requests and their decisions; org webhooks and every outgoing POST with its attempts."""

from __future__ import annotations

import secrets
import statistics
import uuid
from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from budgets.models import Refusal
from core import retry
from core.enqueue import enqueue
from effects.models import Effect, Session, Tool, render_text
from orgs.models import Event, Organization
from undolog_site.errors import Conflict, Invalid

TIMEOUT_LABEL = "timeout"
MAX_EXTEND_MINUTES = 7 * 24 * 60


class ApprovalRequestQuerySet(models.QuerySet):
    def for_org(self, org: Organization) -> ApprovalRequestQuerySet:
        return self.filter(org=org)

    def pending(self) -> ApprovalRequestQuerySet:
        return self.filter(state=ApprovalRequest.State.PENDING)

    def due(self) -> ApprovalRequestQuerySet:
        return self.pending().filter(timeout_at__lte=timezone.now())

    def decided_since(self, since) -> ApprovalRequestQuerySet:
        return self.exclude(state=ApprovalRequest.State.PENDING).filter(decided_at__gte=since)

    def stats(self, org: Organization, days: int = 7) -> dict[str, Any]:
        """Of these (an org's) requests: pending now; over the last `days`: decisions, approval
        rate, median time to decide (people's decisions only: a deadline is not a decision
        time), expiries, and the same per calendar day in the org's time zone. Two queries.
        `GET /api/v1/approvals/stats` and the dashboard's queue both read this."""
        now = timezone.now()
        since = now - timedelta(days=days)
        # Both counts in one pass over the pending rows (the dashboard's queue renders these too).
        pending = self.pending().aggregate(pending=Count("id"), overdue=Count("id", filter=Q(timeout_at__lte=now)))
        rows = list(self.decided_since(since).values_list("state", "decided_by_label", "created", "decided_at"))
        count: dict[str, int] = defaultdict(int)
        per_day = {_day(now - timedelta(days=n), org): {"approved": 0, "rejected": 0, "expired": 0, "waits": []}
                   for n in range(days, -1, -1)}
        waits = []
        for state, label, created, decided_at in rows:
            day = per_day.get(_day(decided_at, org)) or {"approved": 0, "rejected": 0, "expired": 0, "waits": []}
            count[state] += 1
            day[state] += 1
            if label == TIMEOUT_LABEL:
                count["auto_approved"] += state == ApprovalRequest.State.APPROVED
            else:
                waits.append((decided_at - created).total_seconds())
                day["waits"].append(waits[-1])
        decided = len(rows)
        return {
            "pending": pending["pending"],
            "overdue": pending["overdue"],
            "window_days": days,
            "since": since.isoformat(),
            "decided": decided,
            "approved": count["approved"],
            "auto_approved": count["auto_approved"],
            "rejected": count["rejected"],
            "expired": count["expired"],
            "approval_rate": round(count["approved"] / decided, 4) if decided else None,
            "median_time_to_decide_s": _median(waits),
            "per_day": [{"date": date, "approved": day["approved"], "rejected": day["rejected"],
                         "expired": day["expired"], "median_time_to_decide_s": _median(day["waits"])}
                        for date, day in per_day.items()],
        }


def _day(moment, org: Organization) -> str:
    return moment.astimezone(org.tz).date().isoformat()


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


class ApprovalRequest(models.Model):
    """What a reviewer sees before an irreversible call may run, and what they decided.

    The decision verbs (`approve`, `reject`, `expire`, `extend`) are the only writers of
    `state`; each starts with a guarded UPDATE of this row (`... WHERE state = 'pending'`),
    so of any number of concurrent deciders exactly one changes the row and the others get
    409 `already_decided`. Only the winner goes on to move the effect and the session, in
    the same transaction, always in the order request → effect → session (no deadlocks
    between deciders, the deadline sweep and the intercept, which locks only the session).
    """

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
    rollback = models.BooleanField(default=False, help_text="Rejected and the session rolled back.")
    created = models.DateTimeField(default=timezone.now)

    objects = ApprovalRequestQuerySet.as_manager()

    class Meta:
        ordering = ["timeout_at"]
        indexes = [models.Index(fields=["org", "state", "timeout_at"]),
                   models.Index(fields=["org", "decided_at"])]

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

    # ------------------------------------------------------------ reading

    @property
    def decision(self) -> str | None:
        """What the caller is told: approved, rejected, expired, or None while pending."""
        return None if self.state == self.State.PENDING else self.state

    def summary(self) -> dict[str, Any]:
        return {"id": str(self.id), "state": self.state, "timeout_at": self.timeout_at.isoformat()}

    def outcome(self) -> dict[str, Any]:
        """The decision as the waiting caller sees it: `{"decision": "rejected", "reason": ...}`."""
        return {"decision": self.decision, "reason": self.decision_reason or None,
                "decided_by": self.decided_by_label or None}

    @property
    def has_executor(self) -> bool:
        tool = self.effect.tool if self.effect.tool_id else None
        return bool(tool and tool.executor_url)

    def caller_fields(self) -> dict[str, Any]:
        """Added to the effect body (long poll, replay), so the waiting caller reads it where it
        reads the effect: whether the worker runs the call (`executor`), and once decided,
        `{"decision": "rejected", "reason": ...}`. Load with `select_related("effect__tool")`."""
        fields: dict[str, Any] = {"executor": self.has_executor}
        if self.state != self.State.PENDING:
            fields.update(decision=self.decision, reason=self.decision_reason or None)
        return fields

    @classmethod
    def for_caller(cls, effect: Effect) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """What a waiting caller reads about an irreversible effect's request: the request
        (with its decision once made) and the fields added to the effect body. None if none."""
        approval = cls.objects.select_related("effect__tool").filter(effect=effect).first()
        if approval is None:
            return None
        view = {**approval.summary(), "decided_by": approval.decided_by_label or None,
                "reason": approval.decision_reason or None, "decision": approval.decision}
        return view, approval.caller_fields()

    def event_data(self) -> dict[str, Any]:
        return {"approval": self.summary(), "tool": self.tool_name, "effect": str(self.effect_id),
                "decision": self.decision, "decided_by": self.decided_by_label or None,
                "reason": self.decision_reason or None, "rollback": self.rollback}

    # ------------------------------------------------------------ decisions

    def approve(self, by=None, reason: str = "", args_digest: str | None = None) -> None:
        """Approve the exact args shown (by=None: the deadline passed with auto-approve on).

        1. An approval is bound to args: a digest that is not the request's is 409.
        2. Guarded UPDATE pending → approved (the first decision wins).
        3. Effect pending → approved; session awaiting_approval → running.
        4. A tool with an executor gets its call queued as a delivery row (the worker runs it).
        5. `approval.decided` is recorded; fan-out happens after commit.
        """
        if args_digest not in (None, "", self.args_digest):
            raise Conflict("The args changed since you looked: the digest you approved is not this "
                           "request's. Reload the request and decide again.",
                           code="args_digest_mismatch", args_digest=self.args_digest)
        label = _label(by)
        with transaction.atomic():
            # A person approves before the deadline; after it, only the deadline decides.
            self._decide(self.State.APPROVED, by, label, reason, due_only=by is None,
                         before_deadline=by is not None, decided_args_digest=self.args_digest)
            effect, session = self._effect_and_session()
            effect.approve(actor=label, reason=reason)
            if not _release(session, session.resume_running, label, reason or "approved"):
                # The run ended (failed, say) while it waited: nothing may run on its behalf.
                raise Conflict(f"The session is {session.state}; this call can no longer run. "
                               "Reject it or let it expire.", code="session_not_awaiting_approval",
                               state=session.state)
            if effect.tool_id and effect.tool and effect.tool.executor_url:
                WebhookDelivery.for_executor(effect, self)
            Event.record(self.org, "approval.decided", agent=session.agent, session_id=session.pk,
                         **self.event_data())

    def reject(self, by, reason: str, rollback: bool = False) -> None:
        """Reject with a reason: effect rejected, session halted (or failed, so its undo stack
        is walked, with `rollback`), a refusal row and `approval.decided` recorded."""
        reason = (reason or "").strip()
        if not reason:
            raise Invalid({"reason": "A reason is required to reject (the agent is told it)."},
                          "A reason is required to reject.")
        label = _label(by)
        with transaction.atomic():
            self._decide(self.State.REJECTED, by, label, reason, rollback=rollback)
            effect, session = self._effect_and_session()
            effect.reject(actor=label, reason=reason)
            if rollback:
                _release(session, lambda actor, why: session.fail(why, actor), label, reason)
            else:
                _release(session, session.halt, label, reason)
            self._refuse(session, effect, label)
            Event.record(self.org, "approval.decided", agent=session.agent, session_id=session.pk,
                         **self.event_data())

    def expire(self) -> None:
        """The deadline passed: auto-approve if configured, else effect expired, session halted."""
        if self.auto_approve_on_timeout and Session.objects.filter(
                pk=self.session_id, state=Session.State.AWAITING_APPROVAL).exists():
            self.approve(by=None, reason="Approved automatically: the deadline passed without a decision.")
            return
        with transaction.atomic():
            self._decide(self.State.EXPIRED, None, TIMEOUT_LABEL, "The deadline passed without a decision.",
                         due_only=True)
            effect, session = self._effect_and_session()
            effect.expire(actor=TIMEOUT_LABEL)
            _release(session, session.halt, TIMEOUT_LABEL, "approval deadline passed")
            self._refuse(session, effect, TIMEOUT_LABEL)
            Event.record(self.org, "approval.expired", agent=session.agent, session_id=session.pk,
                         **self.event_data())

    def withdraw(self, actor: str) -> None:
        """The run was failed while this waited: the call will never run, so the request leaves
        the queue (as expired, decided by whoever failed the run) instead of lingering there."""
        with transaction.atomic():
            self._decide(self.State.EXPIRED, None, actor, "Withdrawn: the session failed before a decision.")
            effect, session = self._effect_and_session()
            effect.expire(actor=actor)
            Event.record(self.org, "approval.expired", agent=session.agent, session_id=session.pk,
                         withdrawn=True, **self.event_data())

    def extend(self, minutes: int, by=None) -> None:
        """Push a deadline that has not passed yet `minutes` further."""
        if not isinstance(minutes, int) or isinstance(minutes, bool) or not 1 <= minutes <= MAX_EXTEND_MINUTES:
            raise Invalid({"minutes": f"Must be a whole number from 1 to {MAX_EXTEND_MINUTES}."},
                          f"minutes must be a whole number from 1 to {MAX_EXTEND_MINUTES}.")
        with transaction.atomic():
            # FOR UPDATE: two reviewers extending at once must both count, and the sweep must
            # not expire the request between our read of the deadline and our write.
            row = ApprovalRequest.objects.select_for_update().get(pk=self.pk)
            if row.state != self.State.PENDING:
                raise _already_decided(row.state)
            if row.timeout_at <= timezone.now():
                raise _deadline_passed(row.timeout_at)
            self.timeout_at = row.timeout_at + timedelta(minutes=minutes)
            ApprovalRequest.objects.filter(pk=self.pk).update(timeout_at=self.timeout_at)
            Event.record(self.org, "approval.extended", agent=self.session.agent, session_id=self.session_id,
                         approval=self.summary(), tool=self.tool_name, effect=str(self.effect_id),
                         minutes=minutes, extended_by=_label(by))

    def _decide(self, to: str, by, label: str, reason: str, *, due_only: bool = False,
                before_deadline: bool = False, **fields: Any) -> None:
        """The guarded UPDATE every decision starts with: of concurrent deciders, one wins."""
        now = timezone.now()
        rows = ApprovalRequest.objects.filter(pk=self.pk, state=self.State.PENDING)
        if due_only:
            rows = rows.filter(timeout_at__lte=now)  # an extension that landed first wins
        if before_deadline:
            rows = rows.filter(timeout_at__gt=now)
        changed = rows.update(state=to, decided_by=by, decided_by_label=label, decision_reason=reason,
                              decided_at=now, **fields)
        if changed != 1:
            current = ApprovalRequest.objects.filter(pk=self.pk).values_list("state", "timeout_at").first()
            if current is None or current[0] != self.State.PENDING:
                raise _already_decided(current[0] if current else None)
            if before_deadline:
                raise _deadline_passed(current[1])
            raise Conflict("The deadline was extended; the request is not due.", code="not_due", state=current[0])
        self.state, self.decided_by, self.decided_by_label = to, by, label
        self.decision_reason, self.decided_at = reason, now
        for name, value in fields.items():
            setattr(self, name, value)

    def _effect_and_session(self) -> tuple[Effect, Session]:
        # Fresh rows: their history records the state they really moved from.
        effect = Effect.objects.select_related("tool").get(pk=self.effect_id)
        session = Session.objects.select_related("agent").get(pk=self.session_id)
        return effect, session

    def _refuse(self, session: Session, effect: Effect, label: str) -> None:
        Refusal.record(agent=session.agent, kind=Refusal.Kind.APPROVAL, tool_name=self.tool_name,
                       decided_by=label, reason=self.decision_reason, session_id=session.pk,
                       effect_id=effect.pk, step_index=effect.step_index, args=effect.args,
                       message=f"DENIED: {self.decision_reason}")


def _label(by) -> str:
    return by.get_username() if by is not None else TIMEOUT_LABEL


def _already_decided(state: str | None) -> Conflict:
    return Conflict(f"This request was already decided ({state}); a decision is final.",
                    code="already_decided", state=state)


def _deadline_passed(timeout_at) -> Conflict:
    return Conflict(f"The deadline passed at {timeout_at.isoformat()}; the request is being decided by its "
                    "deadline (auto-approved or expired). It can still be rejected.",
                    code="deadline_passed", timeout_at=timeout_at.isoformat())


def _release(session: Session, verb, actor: str, reason: str) -> bool:
    """Move the session out of awaiting_approval; False if it had already left (the agent
    failed the run while it waited), in which case a rejection or expiry leaves it alone."""
    if session.state != Session.State.AWAITING_APPROVAL:
        return False
    try:
        verb(actor, reason)
    except Conflict:
        return False  # the guarded UPDATE saw another state; no row was changed
    return True


# ---------------------------------------------------------------- notifications

EVENT_KINDS = [
    "approval.requested", "approval.decided", "approval.expired", "approval.extended",
    "compensation.failed", "permission_denied", "budget.exceeded", "agent.suspended", "agent.resumed",
    "incident.changed", "session.updated",
]


def new_secret() -> str:
    return "whsec_" + secrets.token_hex(24)


class OrgWebhookQuerySet(models.QuerySet):
    def for_org(self, org: Organization) -> OrgWebhookQuerySet:
        return self.filter(org=org)

    def active(self) -> OrgWebhookQuerySet:
        return self.filter(active=True)


class OrgWebhook(models.Model):
    """An org's outgoing webhook: where its events go, signed with this hook's secret.

    `event_types` empty means every event. `slack` sends a Slack incoming-webhook body
    (`text` + `blocks`) instead of undolog's JSON.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="webhooks")
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=200, default=new_secret)
    event_types = models.JSONField(default=list, blank=True, help_text="Event kinds; empty: all.")
    slack = models.BooleanField(default=False, help_text="Send a Slack-compatible body (text + blocks).")
    description = models.CharField(max_length=200, blank=True)
    active = models.BooleanField(default=True)
    created = models.DateTimeField(default=timezone.now)

    objects = OrgWebhookQuerySet.as_manager()

    class Meta:
        ordering = ["created"]

    def __str__(self) -> str:
        return f"{self.url} ({self.org})"

    def wants(self, kind: str) -> bool:
        return not self.event_types or kind in self.event_types


def _unheld(now) -> Q:
    return Q(claimed_at__isnull=True) | Q(claimed_at__lt=now - WebhookDelivery.LEASE)


class WebhookDeliveryQuerySet(models.QuerySet):
    def due(self, now=None, *, grace: timedelta = timedelta(0)) -> WebhookDeliveryQuerySet:
        """Pending rows whose time has come (by `grace` at least) and that nobody holds."""
        now = now or timezone.now()
        return self.filter(_unheld(now), state=WebhookDelivery.State.PENDING, next_attempt_at__lte=now - grace)


class WebhookDelivery(models.Model):
    """One outgoing signed POST that must not be lost: an event for an org webhook, or the
    execution of an approved call by its tool's executor webhook.

    The row is the truth, not the Celery message: `next_attempt_at` says when it is due,
    `claimed_at` who holds it (a lease, so a worker that died only delays it), and a beat
    sweep re-enqueues what is due and unheld. Every try is a `DeliveryAttempt`.
    """

    class Purpose(models.TextChoices):
        EVENT = "event"
        EXECUTOR = "executor"

    class State(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"
        CANCELLED = "cancelled"

    TERMINAL = frozenset({State.DELIVERED, State.FAILED, State.CANCELLED})
    # Longer than the longest request (executor timeouts are capped at 120 s).
    LEASE = timedelta(minutes=3)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", editable=False)
    purpose = models.CharField(max_length=16, choices=Purpose.choices, editable=False)
    webhook = models.ForeignKey(OrgWebhook, null=True, blank=True, on_delete=models.CASCADE,
                                related_name="deliveries", editable=False)
    event = models.ForeignKey(Event, null=True, blank=True, on_delete=models.CASCADE, related_name="+",
                              editable=False)
    effect = models.ForeignKey(Effect, null=True, blank=True, on_delete=models.CASCADE, related_name="+",
                               editable=False)
    kind = models.CharField(max_length=64, editable=False, help_text="The event kind, or 'executor'.")
    url = models.CharField(max_length=500, editable=False)
    body = models.JSONField(editable=False)
    timeout_ms = models.PositiveIntegerField(default=10_000, editable=False)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING, db_index=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    max_attempts = models.PositiveSmallIntegerField(default=6)
    next_attempt_at = models.DateTimeField(default=timezone.now, db_index=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(default=timezone.now, editable=False)

    objects = WebhookDeliveryQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]
        verbose_name_plural = "webhook deliveries"
        indexes = [models.Index(fields=["state", "next_attempt_at"])]
        constraints = [
            # Fan-out twice (a retried receiver) still yields one delivery per hook and event,
            # and an approval one execution.
            models.UniqueConstraint(fields=["webhook", "event"], condition=Q(purpose="event"),
                                    name="one_delivery_per_hook_and_event"),
            models.UniqueConstraint(fields=["effect"], condition=Q(purpose="executor"),
                                    name="one_execution_per_effect"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} → {self.url} ({self.state})"

    @classmethod
    def for_executor(cls, effect: Effect, approval: ApprovalRequest) -> WebhookDelivery:
        """Queue the approved call for the tool's executor, in the approving transaction."""
        tool = effect.tool
        delivery = cls.objects.create(
            org_id=effect.org_id, purpose=cls.Purpose.EXECUTOR, effect=effect, kind="executor",
            url=tool.executor_url, timeout_ms=tool.executor_timeout_ms,
            max_attempts=settings.UNDOLOG_EXECUTOR_MAX_ATTEMPTS,
            body={"effect_id": str(effect.id), "session_id": str(effect.session_id), "tool": effect.tool_name,
                  "args": effect.args, "args_digest": effect.args_digest, "step_index": effect.step_index,
                  "approval": {"id": str(approval.id), "decided_by": approval.decided_by_label,
                               "reason": approval.decision_reason or None}},
        )
        delivery.enqueue_after_commit()
        return delivery

    def enqueue_after_commit(self) -> None:
        from approvals import tasks

        transaction.on_commit(lambda: enqueue(tasks.deliver, str(self.pk)))

    @property
    def secret(self) -> str:
        return self.webhook.secret if self.webhook_id else self.org.webhook_secret

    def headers(self) -> dict[str, str]:
        # Executors dedupe by effect (one execution per call); receivers of events by delivery.
        key = str(self.effect_id) if self.purpose == self.Purpose.EXECUTOR else str(self.pk)
        return {"Idempotency-Key": key, "Undolog-Event": self.kind, "Undolog-Delivery": str(self.pk)}

    def claim(self) -> int | None:
        """Take the row for one attempt; the attempt's number, or None if it is not ours to take."""
        now = timezone.now()
        # A first attempt is due when its message arrives: the row was written on another host,
        # whose clock may be ahead of ours. A retry waits for its time (a countdown that arrives
        # early on a skewed host is dropped, and the sweep sends the row again once due).
        changed = WebhookDelivery.objects.filter(
            _unheld(now), Q(attempts=0) | Q(next_attempt_at__lte=now), pk=self.pk,
            state=WebhookDelivery.State.PENDING).update(claimed_at=now, attempts=F("attempts") + 1)
        if changed != 1:
            return None
        self.refresh_from_db(fields=["attempts", "claimed_at", "state"])
        return self.attempts

    def backoff(self, number: int) -> timedelta:
        """The wait after attempt `number` failed: the one backoff (`core.retry`), doubling from
        UNDOLOG_WEBHOOK_RETRY_BASE_MS up to an hour, without jitter (a receiver's own retry
        budget is what these fan out over; the settings promise the doubling)."""
        base = settings.UNDOLOG_WEBHOOK_RETRY_BASE_MS / 1000
        return timedelta(seconds=retry.backoff_s(number, base, 3600, spread=0))

    def finish(self, **fields: Any) -> bool:
        """Release our claim with the outcome; False if our lease ran out and someone else holds it."""
        return WebhookDelivery.objects.filter(pk=self.pk, claimed_at=self.claimed_at).update(
            claimed_at=None, **fields) == 1

    def as_dict(self) -> dict[str, Any]:
        return {"id": str(self.id), "kind": self.kind, "purpose": self.purpose, "url": self.url,
                "state": self.state, "attempts": self.attempts, "max_attempts": self.max_attempts,
                "next_attempt_at": self.next_attempt_at.isoformat() if self.state == self.State.PENDING else None,
                "last_status_code": self.last_status_code, "last_error": self.last_error or None,
                "delivered_at": self.delivered_at.isoformat() if self.delivered_at else None,
                "created": self.created.isoformat()}


class DeliveryAttempt(models.Model):
    """One try of a delivery: when, how long, what came back."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log",
                                 editable=False)
    number = models.PositiveSmallIntegerField(editable=False)
    started_at = models.DateTimeField(editable=False)
    duration_ms = models.PositiveIntegerField(editable=False)
    ok = models.BooleanField(editable=False)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    error = models.TextField(blank=True, editable=False)

    class Meta:
        ordering = ["delivery", "number"]
        constraints = [models.UniqueConstraint(fields=["delivery", "number"], name="one_delivery_attempt_per_number")]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}"

    def as_dict(self) -> dict[str, Any]:
        return {"number": self.number, "started_at": self.started_at.isoformat(), "duration_ms": self.duration_ms,
                "ok": self.ok, "status_code": self.status_code, "error": self.error or None}
