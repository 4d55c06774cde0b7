"""Tenants, their people and their agents."""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
import uuid
import zoneinfo
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.dispatch import Signal
from django.utils import timezone

from core.errors import Conflict

# Sent after commit with `event=<Event>`; approvals fans events out to webhooks and websockets.
event_recorded = Signal()
# The same for a batch of events committed by several calls (the fast approval path's, gathered
# after its answers: core.fanout.after_answer), with `recorded=[Recorded, ...]`: its receivers
# handle the batch at once (approvals claims them in one statement, one group message per org).
events_recorded = Signal()


@dataclass(frozen=True)
class Recorded:
    """One committed event of a batch, and what its sender already holds, so the fan-out reads
    none of it again: the request the event is about as just written, the org's active webhooks
    (None: read them), and whether a Slack row can be due."""

    event: Event
    approval: object = None
    hooks: list | None = None
    slack: bool = True


def validate_time_zone(value: str) -> None:
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValidationError(f"{value!r} is not a known time zone (e.g. Europe/Berlin)") from None


def new_webhook_secret() -> str:
    return "whsec_" + secrets.token_hex(24)


class Organization(models.Model):
    """A tenant. Reviewers, agents, tools, budgets and settings belong to one; nothing crosses orgs."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)
    time_zone = models.CharField(max_length=64, default="UTC", validators=[validate_time_zone])
    approval_timeout_s = models.PositiveIntegerField(
        default=900, help_text="Default approval deadline in seconds (a tool may override it).")
    auto_approve_on_timeout = models.BooleanField(
        default=False, help_text="Default: approve when the deadline passes without a decision.")
    context_window = models.PositiveSmallIntegerField(
        default=10, help_text="How many of the session's last calls an approval request shows.")
    approvals_by_risk_tag = models.JSONField(
        default=dict, blank=True, help_text='Distinct approvers a risk tag requires: {"payments": 2}.')
    webhook_secret = models.CharField(max_length=100, default=new_webhook_secret)
    # Kept after a rotation until the overlap ends: outgoing webhooks are signed with both secrets
    # meanwhile (two `v1=` signatures), so each receiver can move to the new secret at its own pace.
    previous_webhook_secret = models.CharField(max_length=100, blank=True, default="")
    previous_webhook_secret_expires_at = models.DateTimeField(
        null=True, blank=True, help_text="After a rotation: the old webhook secret still signs until then.")
    email_notifications = models.BooleanField(default=False)
    run_idle_timeout_s = models.PositiveIntegerField(
        default=3600, help_text="A running session silent this long is failed as abandoned (0: never). "
                                "An agent may override it.")
    # API rate limits (core/ratelimit.py), requests per minute; empty: the server's default
    # (UNDOLOG_RATE_LIMIT_PER_KEY / _PER_ORG). A change bumps config_version (a trigger), so the
    # fast path's cached copy is replaced on the next call.
    rate_limit_per_key = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests per minute per API key or person; empty: the server's default.")
    rate_limit_per_org = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests per minute for the whole organization; empty: the server's default.")
    created = models.DateTimeField(auto_now_add=True)
    # Bumped by database triggers (PostgreSQL) in the same transaction as any change to the org's
    # tools, compensation functions, budget policies or approval rules: the intercept caches those
    # in process and checks this number in its one statement, so a change is seen on the next call.
    config_version = models.BigIntegerField(default=0, editable=False)

    def __str__(self) -> str:
        return self.slug

    @property
    def tz(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.time_zone)

    def today(self) -> dt.date:
        """The org's calendar day: daily budgets reset at its midnight, not the server's."""
        return timezone.now().astimezone(self.tz).date()

    def signing_secrets(self) -> list[str]:
        """The secrets outgoing webhooks are signed with: the current one, and during a
        rotation's overlap the previous one too (a receiver holding either verifies)."""
        expires = self.previous_webhook_secret_expires_at
        if self.previous_webhook_secret and expires is not None and expires > timezone.now():
            return [self.webhook_secret, self.previous_webhook_secret]
        return [self.webhook_secret]

    def rotate_webhook_secret(self, overlap: timedelta | None = None) -> str:
        """A new webhook secret; the current one keeps signing beside it for `overlap` (the key
        rotation's grace by default; zero cuts it off at once). A rotation during an overlap
        drops the oldest secret: only two ever sign. Raises Conflict if another admin rotated
        first (two rotations at once would leave a secret that nobody was shown)."""
        old, new = self.webhook_secret, new_webhook_secret()
        expires = timezone.now() + (rotation_grace() if overlap is None else overlap)
        # Guarded on the secret read a moment ago: of two concurrent rotations exactly one lands.
        changed = Organization.objects.filter(pk=self.pk, webhook_secret=old).update(
            webhook_secret=new, previous_webhook_secret=old, previous_webhook_secret_expires_at=expires)
        if not changed:
            raise Conflict("The webhook secret was rotated by someone else a moment ago; read it again.",
                           code="webhook_secret_rotated")
        self.webhook_secret, self.previous_webhook_secret = new, old
        self.previous_webhook_secret_expires_at = expires
        return new


class Membership(models.Model):
    """A Django user's role in one org."""

    class Role(models.TextChoices):
        VIEWER = "viewer"
        REVIEWER = "reviewer"
        ADMIN = "admin"

    RANK = {Role.VIEWER: 0, Role.REVIEWER: 1, Role.ADMIN: 2}

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.REVIEWER)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "org"], name="one_membership_per_org")]

    def __str__(self) -> str:
        return f"{self.user} in {self.org} ({self.role})"

    def has_role(self, role: str) -> bool:
        return self.RANK[self.role] >= self.RANK[role]


class AgentQuerySet(models.QuerySet):
    def for_org(self, org: Organization) -> AgentQuerySet:
        return self.filter(org=org)


class Agent(models.Model):
    """A named process of an org (e.g. `cleanup`) with API keys, a budget and a state."""

    class State(models.TextChoices):
        ACTIVE = "active"
        SUSPENDED = "suspended"
        STOPPED = "stopped"

    class SuspendReason(models.TextChoices):
        NONE = ""
        BUDGET = "budget"
        MANUAL = "manual"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="agents")
    name = models.SlugField(max_length=100)
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE)
    suspend_reason = models.CharField(max_length=16, choices=SuspendReason.choices, default="", blank=True)
    run_idle_timeout_s = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="This agent's runs: overrides the org's run_idle_timeout_s (0: never; empty: the org's).")
    created = models.DateTimeField(auto_now_add=True)

    objects = AgentQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org", "name"], name="agent_name_unique_in_org")]

    def __str__(self) -> str:
        return f"{self.org.slug}/{self.name}"

    @property
    def is_active(self) -> bool:
        return self.state == self.State.ACTIVE

    @property
    def idle_timeout_s(self) -> int:
        """How long this agent's runs may stay silent before they are abandoned (0: never)."""
        if self.run_idle_timeout_s is not None:
            return self.run_idle_timeout_s
        return self.org.run_idle_timeout_s

    def _move(self, allowed_from: set[str], state: str, reason: str) -> bool:
        # Guarded: two runs ending at once must not both apply on_exceeded.
        changed = Agent.objects.filter(pk=self.pk, state__in=allowed_from).update(
            state=state, suspend_reason=reason)
        if changed:
            self.state, self.suspend_reason = state, reason
        return bool(changed)

    def suspend(self, reason: str) -> bool:
        return self._move({self.State.ACTIVE}, self.State.SUSPENDED, reason)

    def stop(self) -> bool:
        return self._move({self.State.ACTIVE, self.State.SUSPENDED}, self.State.STOPPED, "")

    def resume(self) -> bool:
        return self._move({self.State.SUSPENDED, self.State.STOPPED}, self.State.ACTIVE, "")


KEY_PREFIX_LEN = 12


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass
class RememberedKey:
    """A key this process has seen valid: what the intercept's fast path needs to skip the lookup."""

    id: int
    prefix: str
    digest: str
    agent_id: uuid.UUID
    agent_name: str
    org_id: uuid.UUID
    last_used_at: dt.datetime | None


# prefix -> the key as a lookup found it. Never trusted alone: a fast path that uses an entry
# re-checks in its own statement that the key is live and its agent active (no revocation slips by).
_REMEMBERED: dict[str, RememberedKey] = {}
_REMEMBER_AT_MOST = 10_000


# How long a rotated key keeps working beside its successor: long enough to roll the new key
# out to every process of the agent (a deploy, a nightly job's next run), short enough that a
# key rotated because it leaked stops working the same day. Revoke instead of rotating to cut
# a key off at once. The default of UNDOLOG_KEY_ROTATION_GRACE_S (settings).
ROTATION_GRACE = timedelta(hours=24)


def rotation_grace() -> timedelta:
    return timedelta(seconds=getattr(settings, "UNDOLOG_KEY_ROTATION_GRACE_S", ROTATION_GRACE.total_seconds()))


def _stamp_use(key_id: int, last_used_at: dt.datetime | None) -> dt.datetime | None:
    """A key's last use, written at most once a minute so the hot path stays a single read."""
    now = timezone.now()
    if last_used_at is not None and now - last_used_at <= timedelta(minutes=1):
        return last_used_at
    AgentKey.objects.filter(pk=key_id).update(last_used_at=now)
    return now


class AgentKeyQuerySet(models.QuerySet):
    def live(self, now: dt.datetime | None = None) -> AgentKeyQuerySet:
        """Keys that authenticate: not revoked, and not past the end of a rotation's grace period."""
        now = now or timezone.now()
        return self.filter(revoked_at__isnull=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now))


class AgentKey(models.Model):
    """An agent's API key, stored as a lookup prefix and a SHA-256 digest, never the key.

    The secret has 256 bits of entropy, so a fast hash is enough: a slow password hasher
    would only add latency to every intercept.
    """

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="keys")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=KEY_PREFIX_LEN, unique=True, editable=False)
    digest = models.CharField(max_length=64, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="Set when the key is rotated: it works until then, beside its successor.")

    objects = AgentKeyQuerySet.as_manager()

    class State(models.TextChoices):
        ACTIVE = "active"
        ROTATING = "rotating"  # rotated, still valid until expires_at
        EXPIRED = "expired"
        REVOKED = "revoked"

    def __str__(self) -> str:
        return f"ul_{self.prefix}_… ({self.agent})"

    @classmethod
    def issue(cls, agent: Agent, name: str = "") -> tuple[AgentKey, str]:
        """Create a key; the returned plaintext is shown once and never stored."""
        prefix = secrets.token_hex(KEY_PREFIX_LEN // 2)
        secret = secrets.token_urlsafe(32)
        key = cls.objects.create(agent=agent, name=name, prefix=prefix, digest=_digest(secret))
        return key, f"ul_{prefix}_{secret}"

    @classmethod
    def authenticate(cls, raw: str) -> AgentKey | None:
        """One indexed lookup by prefix, then a constant-time digest compare."""
        parts = raw.split("_", 2)
        if len(parts) != 3 or parts[0] != "ul" or len(parts[1]) != KEY_PREFIX_LEN:
            return None
        key = cls.objects.live().select_related("agent__org").filter(prefix=parts[1]).first()
        if key is None or not secrets.compare_digest(key.digest, _digest(parts[2])):
            _REMEMBERED.pop(parts[1], None)
            return None
        key.touch()
        if len(_REMEMBERED) >= _REMEMBER_AT_MOST:
            _REMEMBERED.clear()
        _REMEMBERED[key.prefix] = RememberedKey(key.pk, key.prefix, key.digest, key.agent_id, key.agent.name,
                                                key.agent.org_id, key.last_used_at)
        return key

    @staticmethod
    def remembered(raw: str) -> RememberedKey | None:
        """The key if this process verified it before (no query), with the secret checked again.
        Only for a caller that re-checks liveness in its own statement (see `RememberedKey`)."""
        parts = raw.split("_", 2)
        found = _REMEMBERED.get(parts[1]) if len(parts) == 3 and parts[0] == "ul" else None
        if found is None or not secrets.compare_digest(found.digest, _digest(parts[2])):
            return None
        return found

    @staticmethod
    def touch_remembered(found: RememberedKey) -> None:
        """`touch()` for a remembered key: the same once-a-minute stamp."""
        found.last_used_at = _stamp_use(found.id, found.last_used_at)

    def touch(self) -> None:
        self.last_used_at = _stamp_use(self.pk, self.last_used_at)

    @property
    def state(self) -> str:
        if self.revoked_at is not None:
            return self.State.REVOKED
        if self.expires_at is None:
            return self.State.ACTIVE
        return self.State.ROTATING if self.expires_at > timezone.now() else self.State.EXPIRED

    @property
    def display(self) -> str:
        """How people recognise the key: its prefix (the secret is never stored)."""
        return f"ul_{self.prefix}_…"

    def revoke(self) -> bool:
        """Stop the key at once (its next request is a 401). False if it was already revoked."""
        now = timezone.now()
        # Guarded: two admins revoking at once record one revocation time, the first.
        changed = AgentKey.objects.filter(pk=self.pk, revoked_at__isnull=True).update(revoked_at=now)
        if changed:
            self.revoked_at = now
        return bool(changed)

    def rotate(self, grace: timedelta | None = None) -> tuple[AgentKey, str]:
        """Issue the key's successor and let this key work until the grace period ends, so the
        agent's processes can move to the new key without a failed call. Raises Conflict if the
        key was already rotated or revoked (rotating twice would leave two successors)."""
        expires = timezone.now() + (rotation_grace() if grace is None else grace)
        with transaction.atomic():
            # Guarded: of two concurrent rotations exactly one issues a successor.
            changed = AgentKey.objects.filter(pk=self.pk, revoked_at__isnull=True, expires_at__isnull=True).update(
                expires_at=expires)
            if not changed:
                raise Conflict(f"The key {self.display} was already rotated or revoked; rotate its successor instead.",
                               code="key_not_active", state=AgentKey.objects.get(pk=self.pk).state)
            self.expires_at = expires
            return AgentKey.issue(self.agent, name=self.name)


class EventQuerySet(models.QuerySet):
    def for_org(self, org: Organization) -> EventQuerySet:
        return self.filter(org=org)

    def undispatched(self, recorded_before) -> EventQuerySet:
        """The outbox's backlog: recorded before `recorded_before` and not fanned out yet, oldest first."""
        return self.filter(fanned_out_at__isnull=True, created__lt=recorded_before).order_by("created")


class Event(models.Model):
    """The org's append-only audit stream: refusals, decisions, failures, switches.

    Recorded inside the transaction that made the change, and so the outbox: fanned out
    (dashboards, webhook and email deliveries) only after it commits, through `event_recorded`,
    by whoever claims it first (`fanned_out_at`, set once): the recording process right after
    its commit, or the beat's sweep if that process died first (approvals/notify.py).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of their own (each index is written again by the outbox's claim, which cannot be a
    # HOT update): `org` leads the (org, -created) index below, and the kind is only ever a filter
    # over an org's or a period's rows.
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="events", editable=False,
                            db_index=False)
    kind = models.CharField(max_length=64, editable=False)
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.SET_NULL, editable=False)
    session_id = models.UUIDField(null=True, blank=True, db_index=True, editable=False)
    data = models.JSONField(default=dict, editable=False)
    created = models.DateTimeField(default=timezone.now, db_index=True, editable=False)
    fanned_out_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]
        indexes = [
            models.Index(fields=["org", "-created"]),
            # The outbox sweep reads only what is not fanned out yet, never the history.
            models.Index(fields=["created"], condition=models.Q(fanned_out_at__isnull=True),
                         name="event_undispatched"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} @ {self.created:%Y-%m-%d %H:%M:%S}"

    @classmethod
    def record(cls, org: Organization, kind: str, /, *, agent: Agent | None = None,
               session_id: uuid.UUID | None = None, **data) -> Event:
        # org and kind are positional-only, so the data may have keys named "kind" or "org"
        # (a refusal's data does: {"kind": "budget", ...}).
        event = cls.objects.create(org=org, kind=kind, agent=agent, session_id=session_id, data=data)
        transaction.on_commit(lambda: event_recorded.send(sender=cls, event=event))
        return event

    def as_dict(self) -> dict:
        return {
            "id": str(self.id),
            "kind": self.kind,
            "agent": self.agent.name if self.agent_id and self.agent else None,
            "session": str(self.session_id) if self.session_id else None,
            "data": self.data,
            "created": self.created.isoformat(),
        }
