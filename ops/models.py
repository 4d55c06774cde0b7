"""The audit chain and each org's retention."""

from __future__ import annotations

from typing import Any

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.utils import timezone

from orgs.models import Event, Organization

GENESIS = "0" * 64


class AuditChain(models.Model):
    """The head of an org's audit chain: the last sealed record, and what the last verify found.

    Sealing locks this row (`ops.audit.seal`), so records of one org are appended one batch at a
    time in order; orgs never wait for each other, and the intercept never waits for either."""

    org = models.OneToOneField(Organization, on_delete=models.CASCADE, primary_key=True, related_name="audit_chain")
    seq = models.BigIntegerField(default=0, help_text="Number of the last sealed record (0: none yet).")
    head = models.CharField(max_length=64, default=GENESIS, help_text="Hash of the last sealed record.")
    sealed_at = models.DateTimeField(null=True, blank=True)
    verified_at = models.DateTimeField(null=True, blank=True)
    verified_ok = models.BooleanField(null=True, help_text="Empty until the first verify.")
    broken_seq = models.BigIntegerField(null=True, blank=True, help_text="The first broken link the last verify found.")
    broken_reason = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"audit chain of {self.org_id} @ {self.seq}"


class AuditRecord(models.Model):
    """One sealed link: an audit-worthy event's canonical JSON (RFC 8785) and
    `hash = sha256(prev_hash + canonical)`. Kept after retention deletes the event itself, so the
    chain verifies for as long as it is kept; while the event exists, verify re-derives the
    canonical JSON from it, so an edited event row breaks its link, and an event gone without
    `event_purged_at` (retention sets it as it deletes) was deleted by hand."""

    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", editable=False)
    seq = models.BigIntegerField(editable=False)
    event_id = models.UUIDField(unique=True, editable=False, help_text="The orgs.Event this record seals.")
    kind = models.CharField(max_length=64, editable=False)
    occurred = models.DateTimeField(editable=False, help_text="The event's time.")
    canonical = models.TextField(editable=False)
    prev_hash = models.CharField(max_length=64, editable=False)
    hash = models.CharField(max_length=64, editable=False)
    sealed_at = models.DateTimeField(default=timezone.now, editable=False)
    event_purged_at = models.DateTimeField(null=True, blank=True, editable=False,
                                           help_text="When retention deleted the event (archived first).")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org", "seq"], name="ops_auditrecord_org_seq")]
        indexes = [models.Index(fields=["org", "occurred"], name="ops_auditrecord_org_occurred")]

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind}"


# At least a day (nothing is deleted the hour it happened), at most a century.
DAYS = [MinValueValidator(1), MaxValueValidator(36500)]


class Retention(models.Model):
    """How long an org keeps what piles up (days); an org without a row keeps the defaults."""

    DEFAULTS = {"safe_call_days": 30, "transition_days": 90, "event_days": 365, "session_days": 90}

    org = models.OneToOneField(Organization, on_delete=models.CASCADE, primary_key=True, related_name="retention")
    safe_call_days = models.PositiveIntegerField(default=DEFAULTS["safe_call_days"], validators=DAYS,
                                                 help_text="SAFE calls the agent reported.")
    transition_days = models.PositiveIntegerField(default=DEFAULTS["transition_days"], validators=DAYS,
                                                  help_text="State history of closed sessions and their effects.")
    event_days = models.PositiveIntegerField(default=DEFAULTS["event_days"], validators=DAYS,
                                             help_text="Events (audit-worthy ones only once sealed).")
    session_days = models.PositiveIntegerField(default=DEFAULTS["session_days"], validators=DAYS,
                                               help_text="Closed sessions, with their effects and undo entries.")
    # Pre-images (issue 42, lifecycle/preimages.py) are kept while a run can still be undone: until
    # this long after it ended (completed, halted, compensated); then they are dropped, digests kept.
    undo_window_hours = models.PositiveIntegerField(
        default=72, validators=[MinValueValidator(1), MaxValueValidator(24 * 366)],
        help_text="How long after a run ended its pre-images are kept (an admin may still undo it).")

    def __str__(self) -> str:
        return f"retention of {self.org_id}"

    @classmethod
    def of(cls, org: Organization) -> Retention:
        return cls.objects.filter(org=org).first() or cls(org=org)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.DEFAULTS}

    def change(self, changes: dict[str, Any], actor: str) -> None:
        """Save the new periods and record who changed what (`policy.retention_changed`, audited)."""
        before = self.as_dict()
        for name, value in changes.items():
            setattr(self, name, value)
        diff = {name: [before[name], value] for name, value in self.as_dict().items() if before[name] != value}
        with transaction.atomic():
            self.save()
            if diff:
                Event.record(self.org, "policy.retention_changed", by=actor, changes=diff)
