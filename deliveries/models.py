"""One retried-delivery mechanism: `Delivery` (one outgoing call that must not be lost) and
`DeliveryAttempt` (each try). See deliveries/README.md."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.db.models import F, Q
from django.dispatch import Signal
from django.utils import timezone

from core import retry
from orgs.models import Agent, Event, Organization

# A delivery row to send now (`delivery_id`, and a short `countdown` for a retry), sent after the
# commit that wrote or rescheduled it: its receiver (deliveries/apps.py) enqueues `tasks.deliver`,
# whose module imports these models. Lost, it loses nothing: the sweep finds rows due and unheld.
delivery_due = Signal()


def _unheld(now) -> Q:
    return Q(claimed_at__isnull=True) | Q(claimed_at__lt=now - Delivery.LEASE)


class DeliveryQuerySet(models.QuerySet):
    def due(self, now=None, *, grace: timedelta = timedelta(0)) -> DeliveryQuerySet:
        """Pending rows whose time has come (by `grace` at least) and that nobody holds."""
        now = now or timezone.now()
        return self.filter(_unheld(now), state=Delivery.State.PENDING, next_attempt_at__lte=now - grace)


class Delivery(models.Model):
    """One outgoing call that must not be lost: an event for an org webhook, an approved call
    for its tool's executor, a budget's escalation webhook, or an event's email to reviewers.

    Written in the transaction that decided it must go out (or by the event fan-out, which
    claims its event in the same transaction). The row is the truth, not the Celery message:
    `next_attempt_at` says when it is due, `claimed_at` who holds it (a lease, so a worker
    that died only delays it), and a beat sweep re-enqueues what is due and unheld.
    """

    class Purpose(models.TextChoices):
        EVENT = "event"
        EXECUTOR = "executor"
        ESCALATION = "escalation"
        EMAIL = "email"

    class State(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"
        CANCELLED = "cancelled"

    TERMINAL = frozenset({State.DELIVERED, State.FAILED, State.CANCELLED})
    # Longer than the longest request (executor timeouts are capped at 120 s).
    LEASE = timedelta(minutes=3)
    # The one backoff doubles from here; escalations page a person's system: no hurry to hammer it.
    ESCALATION_RETRY_BASE_S = 30
    ESCALATION_MAX_ATTEMPTS = 8
    MAX_BACKOFF_S = 3600  # never past the broker's visibility timeout (DESIGN)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", editable=False)
    purpose = models.CharField(max_length=16, choices=Purpose.choices, editable=False)
    # What the row is about, by purpose (string references: deliveries imports no app above orgs).
    webhook = models.ForeignKey("approvals.OrgWebhook", null=True, blank=True, on_delete=models.CASCADE,
                                related_name="deliveries", editable=False)
    event = models.ForeignKey(Event, null=True, blank=True, on_delete=models.CASCADE, related_name="+",
                              editable=False)
    effect = models.ForeignKey("effects.Effect", null=True, blank=True, on_delete=models.CASCADE,
                               related_name="+", editable=False)
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.CASCADE, related_name="+",
                              editable=False)
    session_id = models.UUIDField(null=True, blank=True, editable=False)
    kind = models.CharField(max_length=64, editable=False,
                            help_text="The event kind, 'executor', or 'budget.exceeded' for an escalation.")
    url = models.CharField(max_length=500, editable=False, help_text="Empty for an email.")
    body = models.JSONField(editable=False)
    timeout_ms = models.PositiveIntegerField(default=10_000, editable=False)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    max_attempts = models.PositiveSmallIntegerField(default=6)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    claimed_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(default=timezone.now, editable=False)

    objects = DeliveryQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]
        verbose_name_plural = "deliveries"
        indexes = [
            # The sweep reads pending rows by due time; delivered history is not in this index.
            models.Index(fields=["next_attempt_at"], condition=Q(state="pending"), name="delivery_pending_due"),
        ]
        constraints = [
            # The fan-out run twice (a redelivered task, the sweep) still yields one delivery per
            # hook and event, one email per event, and an approval one execution.
            models.UniqueConstraint(fields=["webhook", "event"], condition=Q(purpose="event"),
                                    name="delivery_once_per_hook_and_event"),
            models.UniqueConstraint(fields=["event"], condition=Q(purpose="email"),
                                    name="delivery_one_email_per_event"),
            models.UniqueConstraint(fields=["effect"], condition=Q(purpose="executor"),
                                    name="delivery_one_execution_per_effect"),
        ]

    def __str__(self) -> str:
        return f"{self.purpose} {self.kind} → {self.url or 'email'} ({self.state})"

    def enqueue_after_commit(self) -> None:
        transaction.on_commit(lambda: delivery_due.send(sender=Delivery, delivery_id=str(self.pk)))

    @property
    def secret(self) -> str | list[str]:
        return self.webhook.secret if self.webhook_id else self.org.signing_secrets()

    def headers(self) -> dict[str, str]:
        # Executors dedupe by effect (one execution per call); every other receiver by delivery.
        key = str(self.effect_id) if self.purpose == self.Purpose.EXECUTOR else str(self.pk)
        return {"Idempotency-Key": key, "Undolog-Event": self.kind, "Undolog-Delivery": str(self.pk)}

    def claim(self) -> int | None:
        """Take the row for one attempt; the attempt's number, or None if it is not ours to take."""
        now = timezone.now()
        # A first attempt is due when its message arrives: the row was written on another host,
        # whose clock may be ahead of ours. A retry waits for its time (a countdown that arrives
        # early on a skewed host is dropped, and the sweep sends the row again once due).
        changed = Delivery.objects.filter(
            _unheld(now), Q(attempts=0) | Q(next_attempt_at__lte=now), pk=self.pk,
            state=Delivery.State.PENDING).update(claimed_at=now, attempts=F("attempts") + 1)
        if changed != 1:
            return None
        self.refresh_from_db(fields=["attempts", "claimed_at", "state"])
        return self.attempts

    def backoff(self, number: int) -> timedelta:
        """The wait after attempt `number` failed: the one backoff (`core.retry`), doubling without
        jitter from the purpose's base (UNDOLOG_WEBHOOK_RETRY_BASE_MS; escalations 30 s) up to an
        hour. No jitter: a receiver's own retry budget is what these fan out over, and the settings
        promise the doubling."""
        if self.purpose == self.Purpose.ESCALATION:
            base = self.ESCALATION_RETRY_BASE_S
        else:
            base = settings.UNDOLOG_WEBHOOK_RETRY_BASE_MS / 1000
        return timedelta(seconds=retry.backoff_s(number, base, self.MAX_BACKOFF_S, spread=0))

    def finish(self, **fields: Any) -> bool:
        """Release our claim with the outcome; False if our lease ran out and someone else holds it."""
        return Delivery.objects.filter(pk=self.pk, claimed_at=self.claimed_at).update(
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

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_log", editable=False)
    number = models.PositiveSmallIntegerField(editable=False)
    started_at = models.DateTimeField(editable=False)
    duration_ms = models.PositiveIntegerField(editable=False)
    ok = models.BooleanField(editable=False)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    error = models.TextField(blank=True, editable=False)

    class Meta:
        ordering = ["delivery", "number"]
        constraints = [models.UniqueConstraint(fields=["delivery", "number"], name="delivery_attempt_once_per_number")]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}"

    def as_dict(self) -> dict[str, Any]:
        return {"number": self.number, "started_at": self.started_at.isoformat(), "duration_ms": self.duration_ms,
                "ok": self.ok, "status_code": self.status_code, "error": self.error or None}
