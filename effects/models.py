"""Tools, the compensation registry, sessions, the effect log and undo stacks."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, models, transaction
from django.db.models import Sum
from django.db.models.functions import Now
from django.dispatch import Signal
from django.utils import timezone

from core import fanout as events
from core import prepared
from core.errors import Conflict
from core.outbound import check_target
from effects import longpoll, outputs
from effects.templates import (  # noqa: F401  (the names other modules import from here)
    TemplateError,
    needs_result,
    render_template,
    render_text,
    render_with_result,
)
from orgs.models import Agent, Event, Organization

SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


def is_dotted_path(value: str) -> bool:
    parts = (value or "").split(".")
    return len(parts) >= 2 and all(part.isidentifier() for part in parts)


def validate_semver(value: str) -> None:
    if not SEMVER.match(value or ""):
        raise ValidationError(f"{value!r} is not a semantic version (like 1.0.0)")


def canonical_json(value: Any) -> str:
    """The one serialisation that signatures and digests are computed over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# A run is over (completed or failed), sent inside its transaction. budgets connects the
# on_exceeded verdict to it (budgets/apps.py): budgets reads runs, runs do not import budgets.
session_ended = Signal()
# A compensating run has open entries to walk, sent after its transaction commits. lifecycle
# connects the walk's enqueue to it (lifecycle/apps.py): the walk joins apps above effects. The
# walk's own modules send it too (an agent's report, a fleet round handing a run to its own walk),
# so that none of them imports the Celery tasks that import them.
walk_due = Signal()
# A reviewer rejected a flagged call (approvals): undo its entry alone (`entry_id`), after commit.
undo_one_due = Signal()
# Who fails a run that went silent (lifecycle/abandon.py), in its history and events.
ABANDON_ACTOR = "idle"


def announce(instance: models.Model, what: str, from_state: str | None, to: str, *, name: str = "",
             session_id: Any = None, org_id: Any = None, step_index: int | None = None) -> None:
    """After commit, tell the org's open dashboards that a run moved: the one place every
    session, effect and undo entry change goes through to reach `session.updated`.

    No query and no network here or after commit (`core.fanout` coalesces and publishes
    from its own thread), so the intercept and commit paths keep their pinned query counts.
    Values come from what the instance already holds; a deferred org id is not worth a query.
    """
    if org_id is None:
        return
    change = events.SessionChange(what=what, id=str(instance.pk), step_index=step_index, name=name,
                                  **{"from": from_state}, to=to)
    state = to if what == "session" else None
    transaction.on_commit(lambda: events.session_changed(org_id, session_id, change, state=state,
                                                         step_index=step_index))


def _loaded(instance: models.Model, attname: str) -> Any:
    """The field's value if the row was loaded with it, else None (never a query)."""
    return instance.__dict__.get(attname)


def _org_of_entry(entry: UndoEntry) -> Any:
    """An undo entry has no org column: take it from whichever relation is already loaded."""
    for relation in ("effect", "session", "fn"):
        if UndoEntry._meta.get_field(relation).is_cached(entry):
            return _loaded(getattr(entry, relation), "org_id")
    return None


class Tier(models.TextChoices):
    SAFE = "safe"
    COMPENSABLE = "compensable"
    IRREVERSIBLE = "irreversible"


class CompensationFunction(models.Model):
    """A registered undo: `fn_name` + semver `fn_version` and how to run it."""

    class Handler(models.TextChoices):
        WEBHOOK = "webhook"
        PYTHON = "python"
        AGENT = "agent"  # claimed and run by the agent side (the gateway, serve_compensations)

    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="compensation_functions")
    fn_name = models.CharField(max_length=100)
    fn_version = models.CharField(max_length=64, validators=[validate_semver])
    handler = models.CharField(max_length=16, choices=Handler.choices)
    target = models.CharField(max_length=500, blank=True,
                              help_text="HTTPS URL (webhook) or dotted path (python); none for agent.")
    timeout_ms = models.PositiveIntegerField(default=5000)
    claim_timeout_s = models.PositiveIntegerField(
        default=3600, help_text="agent handler: how long an entry waits for a claimer before a person is called.")
    # Agent handler: which upstream runs it (the gateway's identity of one MCP server). Entries of a
    # scoped function are claimed only by a claimer naming that scope, so two gateways of one agent
    # that happen to give two upstreams one name never run each other's undos (issue 37).
    scope = models.CharField(max_length=200, blank=True,
                             help_text="agent handler: the upstream identity a claimer must name; empty: unscoped.")
    description = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org", "fn_name", "fn_version"], name="fn_version_unique")]
        ordering = ["fn_name", "fn_version"]

    def __str__(self) -> str:
        return f"{self.fn_name}@{self.fn_version}"

    def clean(self) -> None:
        if self.handler == self.Handler.WEBHOOK:
            problem = check_target(self.target)
            if problem:
                raise ValidationError({"target": problem})
        elif self.handler == self.Handler.PYTHON and not is_dotted_path(self.target):
            raise ValidationError({"target": "A dotted path to a callable, like pkg.module.undo."})
        elif self.handler == self.Handler.AGENT and self.target:
            raise ValidationError({"target": "An agent handler has no target: the agent side claims its entries."})
        if self.scope and self.handler != self.Handler.AGENT:
            raise ValidationError({"scope": "Only an agent handler has a scope."})

    @classmethod
    def register(cls, org: Organization, fn_name: str, fn_version: str,
                 **fields: Any) -> tuple[CompensationFunction, bool]:
        """Register `fn_name@fn_version` or update it (True: created); a scoped agent function keeps its
        scope (`Conflict`: see `rescoping_error`)."""
        with transaction.atomic():
            # The row lock orders two gateways registering one name at once: the second sees the
            # first's scope and is refused, instead of silently taking its entries over.
            fn = cls.objects.select_for_update().filter(org=org, fn_name=fn_name, fn_version=fn_version).first()
            if fn is None:
                try:
                    with transaction.atomic():
                        return cls.objects.create(org=org, fn_name=fn_name, fn_version=fn_version, **fields), True
                except IntegrityError:  # created meanwhile: check it like any existing one
                    fn = cls.objects.select_for_update().get(org=org, fn_name=fn_name, fn_version=fn_version)
            problem = fn.rescoping_error(fields.get("handler", fn.handler), fields.get("scope", ""))
            if problem:
                raise Conflict(problem, code="compensation_scope_conflict", scope=fn.scope)
            for name, value in fields.items():
                setattr(fn, name, value)
            fn.save()
        return fn, False

    def rescoping_error(self, handler: str, scope: str) -> str | None:
        """Why this function may not be re-registered as an agent function of `scope`, or None.

        Its undo entries (and the undos of calls an upstream already ran) are claimed by whoever
        names its scope: another scope would hand them to a claimer serving another upstream."""
        if self.handler != self.Handler.AGENT or handler != self.Handler.AGENT or not self.scope:
            return None
        if scope == self.scope:
            return None
        return (f"{self} is served by the upstream {self.scope!r}, and this registration names "
                f"{scope or 'no upstream'!r}: two gateways (or processes) of this org give one name to two "
                "upstreams, and each would run the other's undos. Give one of them another server name; if "
                f"it is the same upstream (moved, or reached another way), set identity = {self.scope!r} "
                "in its [servers.<name>] table.")

    def in_use(self) -> bool:
        """Referenced by a tool or an undo entry: deleting it would orphan a compensation."""
        return self.tools.exists() or self.undo_entries.exists()


class ToolQuerySet(models.QuerySet):
    def for_org(self, org: Organization) -> ToolQuerySet:
        return self.filter(org=org)


MAX_ASKED, MAX_ASKED_CHARS = 32, 60
ASKED_HELP = (f"A list of at most {MAX_ASKED} short strings (words or phrases of 1 to {MAX_ASKED_CHARS} characters) "
              'a request uses for this action, e.g. ["password"] or ["pay", "send money", "transfer"].')


class Tool(models.Model):
    """A registered tool name with its tier, cost, MCP hints, and undo or approval metadata."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="tools")
    name = models.CharField(max_length=200)
    tier = models.CharField(max_length=16, choices=Tier.choices)
    description = models.TextField(blank=True)
    cost_weight = models.DecimalField(max_digits=12, decimal_places=4, default=Decimal("1"))
    irreversible = models.BooleanField(help_text="Counts toward the irreversible caps.")
    annotations = models.JSONField(default=dict, blank=True, help_text="MCP hints: readOnlyHint, …")
    # Run-aware policy (approvals/rules.py): free strings conditions read as `tool.labels`; a tool
    # labelled "untrusted" returns text others wrote, so its output taints (effects/outputs.py).
    labels = models.JSONField(default=list, blank=True, help_text='e.g. ["untrusted", "external", "private"]')
    untrusted_fields = models.JSONField(
        default=list, blank=True,
        help_text="Keys of the output others wrote (wherever they occur); empty: the whole output of an "
                  "untrusted tool is untrusted.")
    # What a request must say for this tool to be asked for (issue 38): `asked(tool)` in conditions.
    asked = models.JSONField(
        default=list, blank=True,
        help_text='Words or short phrases a request uses for this action, e.g. ["password"], ["pay", "transfer"]; '
                  "empty: no request ever asks for it.")
    # Compensable tools
    compensation_fn = models.ForeignKey(CompensationFunction, null=True, blank=True,
                                        on_delete=models.RESTRICT, related_name="tools")
    compensation_args = models.JSONField(
        default=dict, blank=True,
        help_text='The undo\'s args: "{name}" is a call argument, "{result.a.b}" a path into the committed result '
                  '(rendered at commit; an entry it cannot render goes to a person at once).')
    max_retries = models.PositiveSmallIntegerField(default=3)
    retry_backoff_ms = models.PositiveIntegerField(default=1000)
    # A before read and a restore: the undo of a tool that has none (effects/preimages.py).
    pre_image = models.JSONField(null=True, blank=True,
                                 help_text="before/restore declaration; the agent side reads and restores.")
    # Irreversible tools
    approval_reason = models.TextField(blank=True)
    risk_tags = models.JSONField(default=list, blank=True)
    estimated_impact = models.TextField(blank=True)
    approval_timeout_s = models.PositiveIntegerField(null=True, blank=True)
    auto_approve_on_timeout = models.BooleanField(null=True, blank=True)
    approvals_required = models.PositiveSmallIntegerField(default=1, help_text="Distinct reviewers who must approve.")
    executor_url = models.CharField(max_length=500, blank=True)
    executor_timeout_ms = models.PositiveIntegerField(default=10000)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    objects = ToolQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org", "name"], name="tool_name_unique_in_org")]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.tier})"

    def clean(self) -> None:
        if self.tier == Tier.COMPENSABLE and self.compensation_fn_id is None:
            raise ValidationError({"compensation_fn": "A compensable tool needs a compensation function."})
        if self.compensation_fn_id and self.org_id and self.compensation_fn.org_id != self.org_id:
            raise ValidationError({"compensation_fn": "The compensation function belongs to another organization."})
        if self.tier == Tier.IRREVERSIBLE and not self.approval_reason.strip():
            raise ValidationError({"approval_reason": "An irreversible tool needs a reason."})
        # The registration API's limits (effects/api.py): rules read these as lists of strings.
        if not _strings(self.labels, 16, 40):
            raise ValidationError({"labels": 'A list of at most 16 strings of 1 to 40 characters, e.g. ["untrusted"].'})
        if not _strings(self.untrusted_fields, 100, 200):
            raise ValidationError({"untrusted_fields": 'A list of at most 100 keys, e.g. ["subject", "body"].'})
        if not _strings(self.asked, MAX_ASKED, MAX_ASKED_CHARS):
            raise ValidationError({"asked": ASKED_HELP})

    def save(self, *args, **kwargs) -> None:
        if self.irreversible is None:
            self.irreversible = self.tier == Tier.IRREVERSIBLE
        super().save(*args, **kwargs)


def _strings(value: Any, most: int, longest: int) -> bool:
    return (isinstance(value, list) and len(value) <= most
            and all(isinstance(item, str) and 0 < len(item) <= longest for item in value))


class Session(models.Model):
    """One run of an agent. Counters "per run" live here, on the row the intercept locks."""

    class State(models.TextChoices):
        RUNNING = "running"
        AWAITING_APPROVAL = "awaiting_approval"
        COMPLETED = "completed"
        FAILED = "failed"
        HALTED = "halted"
        COMPENSATING = "compensating"
        COMPENSATED = "compensated"
        COMPENSATION_FAILED = "compensation_failed"

    class OnIdle(models.TextChoices):
        FAIL = "fail"
        COMPLETE = "complete"

    TERMINAL = frozenset({State.COMPLETED, State.HALTED, State.COMPENSATED})
    OPEN = frozenset({State.RUNNING, State.AWAITING_APPROVAL})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed by Meta's (org, -created) and (agent, -created), which lead with them, and state
    # by a plain index of its own (no LIKE query needs db_index's second, pattern-ops one): every
    # session written pays each index once, so none is kept twice.
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="sessions", db_index=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="sessions", db_index=False)
    state = models.CharField(max_length=24, choices=State.choices, default=State.RUNNING)
    metadata = models.JSONField(default=dict, blank=True)
    # What the user asked (the request the agent was given): trusted, its values vouch, `run.inputs`.
    inputs = models.JSONField(null=True, blank=True)
    started_by = models.CharField(max_length=200, blank=True,
                                  help_text="The person who started the run (username or email); they cannot "
                                            "approve its calls.")
    step_index = models.PositiveIntegerField(default=0)
    # Rewind (lifecycle/rewind.py): while a rewind's walk runs, the step the run goes back to (the
    # walk takes only the entries above it, and the run resumes there when they are done); null
    # otherwise. `rewinds` counts the run's rewinds: the epoch of its live calls' signatures.
    rewind_to = models.PositiveIntegerField(null=True, blank=True)
    rewinds = models.PositiveIntegerField(default=0)
    # What the idle sweep makes of this run once it goes quiet (lifecycle/abandon.py): `fail` rolls it
    # back (an SDK agent that died mid-task), `complete` lets its work stand (a conversation through
    # the MCP gateway, whose client may simply have been closed: the stateless protocol says nothing).
    on_idle = models.CharField(max_length=8, choices=OnIdle.choices, default=OnIdle.FAIL)
    error = models.TextField(blank=True)
    # Run counters (budgets): updated under the session row lock.
    tool_calls = models.PositiveIntegerField(default=0)
    irreversible_calls = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=4, default=Decimal("0"))
    tool_counts = models.JSONField(default=dict, blank=True)
    violation = models.JSONField(null=True, blank=True, help_text="The run's first budget violation.")
    # Bytes of the pre-images the run keeps (lifecycle/preimages.py), against its bound
    # (UNDOLOG_PRE_IMAGE_RUN_MAX_BYTES): a counter on the row the keep locks, raised by a guarded
    # update, because a sum over the run's pre-images read in a statement's snapshot misses the
    # one a concurrent call of the run commits meanwhile (both passed the bound).
    pre_image_bytes = models.BigIntegerField(default=0, editable=False,
                                             help_text="Bytes of the pre-images this run keeps.")
    created = models.DateTimeField(default=timezone.now, db_index=True)
    updated = models.DateTimeField(auto_now=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # The fleet rollback that took the run: its `agent.rolled_back` event's id. Not a foreign key:
    # retention deletes old events by the thousand, and a key would make each delete visit the runs.
    rolled_back_in = models.UUIDField(null=True, blank=True, editable=False,
                                      help_text="The fleet rollback (its agent.rolled_back event) that took this run.")

    class Meta:
        indexes = [models.Index(fields=["org", "-created"]), models.Index(fields=["agent", "-created"]),
                   models.Index(fields=["state"], name="session_state"),
                   # Partial: the runs of a rollback are read by it; the others (nearly all) stay out.
                   models.Index(fields=["rolled_back_in", "id"], condition=models.Q(rolled_back_in__isnull=False),
                                name="session_rolled_back_in")]

    def __str__(self) -> str:
        return f"session {self.id} of {self.agent.name} ({self.state})"

    def move(self, allowed_from: set[str] | frozenset[str], to: str, *, actor: str, reason: str = "",
             guard: models.Q | None = None, **fields: Any) -> None:
        """The one place session state changes: a guarded UPDATE plus its history row.
        `guard` adds a condition the row must still meet (abandon: no call since the sweep looked)."""
        now = timezone.now()
        if to in self.TERMINAL or to in (self.State.FAILED, self.State.COMPENSATION_FAILED):
            fields.setdefault("ended_at", now)
        with transaction.atomic(savepoint=False):
            changed = Session.objects.filter(guard or models.Q(), pk=self.pk, state__in=allowed_from).update(
                state=to, updated=now, **fields)
            if changed == 1:
                SessionTransition.objects.create(session=self, from_state=self.state, to_state=to,
                                                 actor=actor, reason=reason[:2000])
                announce(self, "session", self.state, to, session_id=self.pk, org_id=_loaded(self, "org_id"),
                         step_index=_loaded(self, "step_index"))
        if changed != 1:
            current = Session.objects.filter(pk=self.pk).values_list("state", flat=True).first()
            raise Conflict(f"The session is {current}; it cannot become {to}.",
                           code="session_state_conflict", state=current)
        self.state = to
        for name, value in fields.items():
            setattr(self, name, value)

    def complete(self, actor: str) -> None:
        with transaction.atomic():
            self.move({self.State.RUNNING}, self.State.COMPLETED, actor=actor)
            self.run_ended(actor)

    def fail(self, error: str, actor: str, *, allowed_from: frozenset[str] | None = None,
             guard: models.Q | None = None) -> None:
        """Roll the run back: `failed` (its budget verdict applies), then `compensating`, and the
        undo walk after commit."""
        with transaction.atomic():
            self.move(allowed_from or self.OPEN | {self.State.HALTED}, self.State.FAILED, actor=actor, reason=error,
                      guard=guard, error=error)
            # approvals' requests of this run, through their reverse relation (no import of approvals)
            for approval in self.approval_requests.pending():
                approval.withdraw(actor)
            self.run_ended(actor)
            self.move({self.State.FAILED}, self.State.COMPENSATING, actor=actor, reason="rolling back")
            self.begin_walk(actor)

    @staticmethod
    def kept_alive(cutoff) -> models.Q:
        """What keeps a silent run from being abandoned (for a queryset of sessions): an effect
        moved since the cutoff, a call waiting for a reviewer, or an approved call its tool's
        executor runs (the worker's to finish: its retries may be an hour apart)."""
        effects = Effect.objects.filter(session=models.OuterRef("pk"))
        return (models.Q(models.Exists(effects.filter(updated__gte=cutoff)))
                | models.Q(models.Exists(effects.filter(state=Effect.State.PENDING)))
                | models.Q(models.Exists(effects.filter(state__in=[Effect.State.APPROVED, Effect.State.EXECUTING],
                                                        tool__executor_url__gt=""))))

    def abandon(self, timeout_s: int, now) -> None:
        """The run went silent past its idle timeout (lifecycle/abandon.py): end it as abandoned,
        with a `session.abandoned` event, in one transaction: failed and rolled back, or completed
        when the run asked for that (`on_idle`). The guarded UPDATE restates the silence (still
        running, no intercept since the cutoff, nothing `kept_alive`), so a call that lands first
        keeps the run alive (Conflict)."""
        cutoff = now - timedelta(seconds=timeout_s)
        # The sweep's read brings the newest effect's time along (`last_effect`); no query then.
        last_effect = self.__dict__.get("last_effect", models.NOT_PROVIDED)
        if last_effect is models.NOT_PROVIDED:
            last_effect = Effect.objects.filter(session=self).order_by("-updated").values_list(
                "updated", flat=True).first()
        last = max(self.updated, last_effect or self.updated)
        silent_s = int((now - last).total_seconds())
        error = f"abandoned: no call for {silent_s} s (run_idle_timeout_s is {timeout_s} s)"
        guard = models.Q(updated__lt=cutoff) & ~Session.kept_alive(cutoff)
        with transaction.atomic():
            if self.on_idle == self.OnIdle.COMPLETE:
                self.move({self.State.RUNNING}, self.State.COMPLETED, actor=ABANDON_ACTOR, reason=error, guard=guard,
                          error=error)
                self.run_ended(ABANDON_ACTOR)
            else:
                self.fail(error, ABANDON_ACTOR, allowed_from=frozenset({self.State.RUNNING}), guard=guard)
            Event.record(self.org, "session.abandoned", agent=self.agent, session_id=self.pk, error=error,
                         silent_s=silent_s, run_idle_timeout_s=timeout_s, last_call_at=last.isoformat(),
                         outcome=self.state)

    def run_ended(self, actor: str) -> None:
        """The run is over: its first budget violation applies on_exceeded (once, in this
        transaction): budgets receives `session_ended`, so effects need not import budgets."""
        session_ended.send(sender=Session, session=self, actor=actor)

    def undo(self, actor: str) -> None:
        """An admin undoes a completed run: its undo stack is walked back like a failed one's."""
        with transaction.atomic():
            self.move({self.State.COMPLETED}, self.State.COMPENSATING, actor=actor, reason="undo requested")
            self.begin_walk(actor)

    def begin_walk(self, actor: str) -> None:
        """With the session `compensating`: finish at once if nothing is left, else enqueue the walk.

        No intercept can push an entry meanwhile: our guarded UPDATE holds the session row,
        and the intercept locks that row and re-checks the state before it pushes.
        """
        if not UndoEntry.objects.filter(session=self).open().exists():
            self.move({self.State.COMPENSATING}, self.State.COMPENSATED, actor=actor,
                      reason="nothing (left) to compensate")
            return
        session_id = self.pk
        transaction.on_commit(lambda: walk_due.send(sender=Session, session_id=session_id))

    def await_approval(self, actor: str) -> None:
        self.move({self.State.RUNNING}, self.State.AWAITING_APPROVAL, actor=actor)

    def resume_running(self, actor: str, reason: str = "") -> None:
        self.move({self.State.AWAITING_APPROVAL}, self.State.RUNNING, actor=actor, reason=reason)

    def halt(self, actor: str, reason: str = "") -> None:
        with transaction.atomic():
            self.move({self.State.AWAITING_APPROVAL}, self.State.HALTED, actor=actor, reason=reason)
            self.run_ended(actor)


class SessionTransition(models.Model):
    """Append-only history of a session's states."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="transitions", editable=False)
    from_state = models.CharField(max_length=24, editable=False)
    to_state = models.CharField(max_length=24, editable=False)
    actor = models.CharField(max_length=200, editable=False)
    reason = models.TextField(blank=True, editable=False)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["created", "id"]


class Savepoint(models.Model):
    """A named step of a run (`POST /sessions/{id}/savepoints`): `rewind {"to": name}` goes back to it."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="savepoints", editable=False)
    name = models.CharField(max_length=100)
    step_index = models.PositiveIntegerField()
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "name"], name="one_savepoint_per_name")]
        ordering = ["step_index", "created"]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "step_index": self.step_index, "created": self.created.isoformat()}


class Rewind(models.Model):
    """One rewind of a run (lifecycle/rewind.py): who, why, to which step, what it undid, what it
    left done (irreversible calls the caller accepted to keep), and the SAFE calls it took off the
    run (kept here: the run's steps after `to_step` are run again, and their SAFE calls charged again)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="rewind_log", editable=False)
    epoch = models.PositiveIntegerField(editable=False)
    to_step = models.PositiveIntegerField(editable=False)
    from_step = models.PositiveIntegerField(editable=False)
    savepoint = models.CharField(max_length=100, blank=True, editable=False)
    reason = models.TextField(blank=True, editable=False)
    by = models.CharField(max_length=200, editable=False)
    undone = models.JSONField(default=list, editable=False)
    left_done = models.JSONField(default=list, editable=False)
    withdrawn = models.JSONField(default=list, editable=False)
    safe_calls = models.JSONField(default=list, editable=False)
    created = models.DateTimeField(default=timezone.now, editable=False)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created"]
        constraints = [models.UniqueConstraint(fields=["session", "epoch"], name="one_rewind_per_epoch")]

    def as_dict(self) -> dict[str, Any]:
        return {"id": str(self.id), "epoch": self.epoch, "to_step": self.to_step, "from_step": self.from_step,
                "savepoint": self.savepoint or None, "reason": self.reason, "by": self.by,
                "undone": self.undone, "left_done": self.left_done, "withdrawn": self.withdrawn,
                "safe_calls": self.safe_calls, "created": self.created.isoformat(),
                "finished_at": self.finished_at.isoformat() if self.finished_at else None}


class SafeCall(models.Model):
    """A SAFE call the SDK ran at once and reported with a later request."""

    # No index of its own: safe_call_step below leads with it (a second one cost every report
    # an index write, and the planner sometimes picked it, filtering the run's every SAFE call).
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="safe_calls", editable=False,
                                db_index=False)
    tool_name = models.CharField(max_length=200, editable=False)
    step_index = models.PositiveIntegerField(editable=False)
    args = models.JSONField(default=dict, editable=False)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["step_index", "id"]
        # A report is checked against the steps already recorded (a retry reports them again):
        # by (session, step), not by scanning every SAFE call of a long run.
        indexes = [models.Index(fields=["session", "step_index"], name="safe_call_step")]


class RunFingerprint(models.Model):
    """What `tainted()` needs of one output of a run: keyed fingerprints of its tokens and whole
    values, never the text (effects/outputs.py). `tainted` came from text others wrote, `vouched`
    from trusted text (the run's inputs, a read not labelled untrusted). Deleted with its run."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="fingerprints", editable=False,
                                db_index=False)
    step_index = models.PositiveIntegerField(editable=False)
    tool_name = models.CharField(max_length=200, editable=False)
    tainted = models.JSONField(default=list, editable=False)
    vouched = models.JSONField(default=list, editable=False)
    size = models.PositiveIntegerField(default=0, editable=False)  # len(tainted) + len(vouched): the run's bound
    # Whether the call that read this output named an address the user gave (its args and the run's
    # inputs share one: `requested()`), decided when it was reported so the intercept need not read
    # the call's args again. None: written before it was kept (the args are read then).
    named = models.BooleanField(null=True, editable=False)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["step_index", "id"]
        indexes = [models.Index(fields=["session", "step_index"], name="run_fingerprint_step")]

    def __str__(self) -> str:
        return f"fingerprints of {self.tool_name}#{self.step_index}"

    @classmethod
    def record(cls, session_id: Any, step_index: int, tool_name: str, output: Any, **how: Any) -> None:
        """Keep the fingerprints of one output of the run (in the caller's transaction), within the
        run's bound (`outputs.prints_of_output` says what `how` may say)."""
        found = outputs.prints_of_output(step_index, tool_name, output, **how)
        if found is not None:
            cls.keep(session_id, found)

    @classmethod
    def keep(cls, session_id: Any, found: outputs.Prints) -> None:
        """Write one output's fingerprints, or the run's full marker past its bound (once)."""
        kept = outputs.Bound(cls.kept(session_id)).admit(found)
        if kept.tool_name == outputs.FULL and cls.objects.filter(session_id=session_id,
                                                                 tool_name=outputs.FULL).exists():
            return
        cls.objects.create(session_id=session_id, step_index=kept.step_index, tool_name=kept.tool_name,
                           tainted=kept.tainted, vouched=kept.vouched, size=kept.size, named=kept.named)

    @classmethod
    def kept(cls, session_id: Any) -> int:
        return cls.objects.filter(session_id=session_id).aggregate(n=Sum("size"))["n"] or 0

    @classmethod
    def rows(cls, session_id: Any, before_step: int | None = None) -> list[tuple[int, str, Any, Any, bool | None]]:
        """(step, tool, tainted, vouched, named) of a run's fingerprint rows before `before_step`, in
        order, as `outputs.RunTaint.of` reads them: one statement, written out once per backend (on
        the intercept, the ORM's compilation cost ~0.7 ms of CPU: bench/run_aware.py). JSON is left
        as read (text on both backends)."""
        db = connections[DEFAULT_DB_ALIAS]  # the proxy's every attribute is a context-local lookup
        session = cls._meta.get_field("session").target_field.get_db_prep_value(session_id, db)
        key = (db.vendor, before_step is not None)
        sql = _FINGERPRINT_SQL.get(key)
        if sql is None:
            sql = _FINGERPRINT_SQL[key] = _fingerprint_rows_sql(before_step is not None)
        params: list[Any] = [session] if before_step is None else [session, before_step]
        if db.vendor == "postgresql":
            return prepared.rows(db, sql, params)
        with db.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()


_FINGERPRINT_SQL: dict[tuple[str, bool], str] = {}


def _fingerprint_rows_sql(bounded: bool) -> str:
    quote = connection.ops.quote_name
    fp = {f.name: quote(f.column) for f in RunFingerprint._meta.concrete_fields}
    before = f" AND {fp['step_index']} < %s" if bounded else ""
    return (f"SELECT {fp['step_index']}, {fp['tool_name']}, {fp['tainted']}, {fp['vouched']}, "
            f"{fp['named']} FROM {quote(RunFingerprint._meta.db_table)} WHERE {fp['session']} = %s{before} "
            f"ORDER BY {fp['step_index']}, {fp['id']}")


class EffectQuerySet(models.QuerySet):
    def for_org(self, org: Organization) -> EffectQuerySet:
        return self.filter(org=org)

    def for_session(self, session: Session) -> EffectQuerySet:
        return self.filter(session=session)

    def pending(self) -> EffectQuerySet:
        return self.filter(state=Effect.State.PENDING)


class Effect(models.Model):
    """One intercepted call of a compensable or irreversible tool: the effect log's row."""

    class State(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        EXECUTING = "executing"
        COMMITTED = "committed"
        FAILED = "failed"
        REJECTED = "rejected"
        EXPIRED = "expired"
        COMPENSATING = "compensating"
        COMPENSATED = "compensated"
        COMPENSATION_FAILED = "compensation_failed"

    TERMINAL = frozenset({State.COMMITTED, State.FAILED, State.REJECTED, State.EXPIRED,
                          State.COMPENSATED, State.COMPENSATION_FAILED})
    # States in which the tool may have acted, so a rollback must compensate.
    STARTED = frozenset({State.EXECUTING, State.COMMITTED, State.FAILED})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index: effects are read by id or by session; only deleting an org (rare) scans them by org.
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", editable=False,
                            db_index=False)
    # No index of its own: the unique (session, call_signature) below serves every lookup by session.
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="effects", editable=False,
                                db_index=False)
    # No index: only deleting a tool (rare, by hand) looks effects up by it, and every intercept would
    # pay for one.
    tool = models.ForeignKey(Tool, null=True, on_delete=models.SET_NULL, related_name="effects", editable=False,
                             db_index=False)
    tool_name = models.CharField(max_length=200, editable=False)
    tier = models.CharField(max_length=16, choices=Tier.choices, editable=False)
    step_index = models.PositiveIntegerField(editable=False)
    call_signature = models.CharField(max_length=64, editable=False)
    idempotency_key = models.CharField(max_length=200, blank=True, editable=False)
    args = models.JSONField(default=dict, editable=False)
    args_digest = models.CharField(max_length=64, editable=False)
    # A reviewer who edited the args before approving: what the agent must run (`args` stays
    # what it proposed). Null: run `args`.
    approved_args = models.JSONField(null=True, blank=True, editable=False)
    reasoning = models.TextField(blank=True, editable=False)
    state = models.CharField(max_length=24, choices=State.choices)  # indexed in Meta (no LIKE index)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    # Its undo entry's args read the result ({result.number}): rendered when the effect commits.
    undo_needs_result = models.BooleanField(default=False, editable=False)
    created = models.DateTimeField(default=timezone.now, editable=False)
    updated = models.DateTimeField(default=timezone.now)

    objects = EffectQuerySet.as_manager()

    class Meta:
        constraints = [
            # Exactly-once rests on this, not on a SELECT first.
            models.UniqueConstraint(fields=["session", "call_signature"], name="one_effect_per_signature"),
        ]
        # No index on state: no query looks effects up by it across sessions, and without one a
        # commit (which changes only state, result and updated) is a HOT update on PostgreSQL that
        # writes no index entry at all.
        ordering = ["step_index", "created"]

    def __str__(self) -> str:
        return f"{self.tool_name}#{self.step_index} ({self.state})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "session": str(self.session_id),
            "tool": self.tool_name,
            "tier": self.tier,
            "state": self.state,
            "step_index": self.step_index,
            "call_signature": self.call_signature,
            "args": self.args,
            "approved_args": self.approved_args,
            "result": self.result,
            "error": self.error or None,
            "created": self.created.isoformat(),
            "updated": self.updated.isoformat(),
        }

    def move(self, allowed_from: set[str] | frozenset[str], to: str, *, actor: str, reason: str = "",
             **fields: Any) -> None:
        """The one place effect state changes: guarded UPDATE, history row, wake-up after commit."""
        now = timezone.now()
        with transaction.atomic(savepoint=False):
            changed = Effect.objects.filter(pk=self.pk, state__in=allowed_from).update(
                state=to, updated=now, **fields)
            if changed == 1:
                EffectTransition.objects.create(effect_id=self.pk, from_state=self.state, to_state=to,
                                                actor=actor, reason=reason[:2000], created=now)
                transaction.on_commit(lambda: longpoll.publish(self.pk))
                self.announce(self.state, to)
        if changed != 1:
            # Another worker, reviewer or retry got there first.
            current = Effect.objects.filter(pk=self.pk).values_list("state", flat=True).first()
            raise Conflict(f"The effect is {current}; it cannot become {to}.",
                           code="effect_state_conflict", state=current)
        self.state, self.updated = to, now
        for name, value in fields.items():
            setattr(self, name, value)

    def announce(self, from_state: str | None, to: str) -> None:
        announce(self, "effect", from_state, to, name=_loaded(self, "tool_name") or "", session_id=self.session_id,
                 org_id=_loaded(self, "org_id"), step_index=_loaded(self, "step_index"))

    def commit(self, result: Any, actor: str) -> None:
        """Committed with its result; an undo entry that reads the result is rendered now (one
        transaction, so no walk ever sees a committed effect with an unrendered entry)."""
        with transaction.atomic():
            self.move({self.State.EXECUTING, self.State.APPROVED}, self.State.COMMITTED, actor=actor,
                      result=result)
            if self.undo_needs_result:
                UndoEntry.objects.get(effect_id=self.pk).render(self)
            tool = self.tool if Effect.tool.is_cached(self) else None
            if tool is not None and "untrusted" in (tool.labels or []):
                # A committed result is an output too: its fingerprints.
                RunFingerprint.record(self.session_id, self.step_index, self.tool_name, result, labels=tool.labels,
                                      untrusted_fields=tool.untrusted_fields)

    def fail(self, error: str, actor: str) -> None:
        self.move({self.State.EXECUTING, self.State.APPROVED}, self.State.FAILED, actor=actor,
                  reason=error, error=error)

    def start_executing(self, actor: str) -> None:
        self.move({self.State.APPROVED}, self.State.EXECUTING, actor=actor)

    def approve(self, actor: str, reason: str = "", approved_args: dict | None = None) -> None:
        """Approved as proposed, or (`approved_args`) with the reviewer's edit, which is what runs."""
        self.move({self.State.PENDING}, self.State.APPROVED, actor=actor, reason=reason,
                  **({"approved_args": approved_args} if approved_args is not None else {}))

    @property
    def args_to_run(self) -> dict:
        return self.args if self.approved_args is None else self.approved_args

    def reject(self, actor: str, reason: str) -> None:
        self.move({self.State.PENDING}, self.State.REJECTED, actor=actor, reason=reason, error=reason)

    def expire(self, actor: str = "timeout") -> None:
        self.move({self.State.PENDING}, self.State.EXPIRED, actor=actor, reason="deadline passed")

    def start_compensating(self, actor: str) -> None:
        self.move(self.STARTED, self.State.COMPENSATING, actor=actor)

    def give_up_compensating(self, actor: str, reason: str) -> None:
        """No compensation will run (its entry went to a person before any attempt)."""
        self.move(self.STARTED | {self.State.COMPENSATING}, self.State.COMPENSATION_FAILED, actor=actor,
                  reason=reason)

    def mark_compensated(self, actor: str, reason: str = "") -> None:
        self.move({self.State.COMPENSATING, self.State.COMPENSATION_FAILED}, self.State.COMPENSATED,
                  actor=actor, reason=reason)

    def mark_compensation_failed(self, actor: str, reason: str) -> None:
        self.move({self.State.COMPENSATING}, self.State.COMPENSATION_FAILED, actor=actor, reason=reason)

    def retry_compensation(self, actor: str) -> None:
        self.move({self.State.COMPENSATION_FAILED}, self.State.COMPENSATING, actor=actor, reason="retry by hand")


class EffectTransition(models.Model):
    """Append-only history of an effect: from, to, when, who, why (NetBox's ObjectChange spirit)."""

    effect = models.ForeignKey(Effect, on_delete=models.CASCADE, related_name="transitions", editable=False)
    from_state = models.CharField(max_length=24, editable=False)
    to_state = models.CharField(max_length=24, editable=False)
    actor = models.CharField(max_length=200, editable=False)
    reason = models.TextField(blank=True, editable=False)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["created", "id"]

    def as_dict(self) -> dict[str, Any]:
        return {"from": self.from_state, "to": self.to_state, "actor": self.actor,
                "reason": self.reason, "at": self.created.isoformat()}


class UndoEntryQuerySet(models.QuerySet):
    def lifo(self) -> UndoEntryQuerySet:
        return self.order_by("-step_index", "-created")

    def open(self) -> UndoEntryQuerySet:
        """Not yet done: pending, running or waiting for a person."""
        return self.filter(state__in=UndoEntry.OPEN)

    def for_org(self, org: Organization) -> UndoEntryQuerySet:
        return self.filter(session__org=org)


class UndoEntry(models.Model):
    """The compensation of one effect, pushed on its session's stack before the effect runs.

    The row, not a Celery message, is the truth: `attempts` doubles as the claim's fencing
    token, `lease_until` says when a claim counts as stalled, `next_attempt_at` when a
    retry is due. `round_start` is the attempt count when a person last asked for a retry,
    so each round gets `max_retries + 1` attempts while attempt numbers keep growing.
    """

    class State(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        COMPENSATED = "compensated"
        SKIPPED = "skipped"
        COMPENSATION_FAILED = "compensation_failed"
        RESOLVED = "resolved"

    TERMINAL = frozenset({State.COMPENSATED, State.SKIPPED, State.RESOLVED})
    OPEN = frozenset({State.PENDING, State.RUNNING, State.COMPENSATION_FAILED})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="undo_entries", editable=False)
    effect = models.OneToOneField(Effect, on_delete=models.CASCADE, related_name="undo_entry", editable=False)
    step_index = models.PositiveIntegerField(editable=False)
    fn = models.ForeignKey(CompensationFunction, on_delete=models.RESTRICT, related_name="undo_entries",
                           editable=False, db_index=False)  # only a (rare) delete of a function reads it
    fn_name = models.CharField(max_length=100, editable=False)
    fn_version = models.CharField(max_length=64, editable=False)
    args = models.JSONField(default=dict, editable=False)
    args_template = models.JSONField(
        null=True, blank=True, editable=False,
        help_text="The tool's template when it reads the result ({result.id}); args are rendered at commit.")
    max_retries = models.PositiveSmallIntegerField(default=3)
    retry_backoff_ms = models.PositiveIntegerField(default=1000)
    state = models.CharField(max_length=24, choices=State.choices, default=State.PENDING)  # indexed in Meta
    attempts = models.PositiveSmallIntegerField(default=0)
    round_start = models.PositiveSmallIntegerField(
        default=0, help_text="Attempts made before the last retry by hand.")
    next_attempt_at = models.DateTimeField(null=True, blank=True)  # indexed in Meta, where set
    claimed_at = models.DateTimeField(null=True, blank=True)
    lease_until = models.DateTimeField(
        null=True, blank=True,  # indexed in Meta, where set
        help_text="A running claim not finished by then is stalled (its worker died); the sweep takes over.")
    claim_deadline = models.DateTimeField(
        null=True, blank=True,
        help_text="agent handler: set when the walk reaches the entry; unclaimed by then, a person is called.")
    last_error = models.TextField(blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    resolution_note = models.TextField(blank=True)
    resolved_by = models.CharField(max_length=200, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(default=timezone.now, editable=False)
    updated = models.DateTimeField(auto_now=True)

    objects = UndoEntryQuerySet.as_manager()

    class Meta:
        ordering = ["-step_index", "-created"]
        verbose_name_plural = "undo entries"
        # The walk asks for the top open entry of a session at every step: this index hands the
        # stack over in LIFO order instead of sorting all of it each time.
        # Only the open entries: the walk looks for the top open entry at every step, and a full index
        # would make it step over every entry already compensated (quadratic in the stack's size).
        indexes = [models.Index(fields=["session", "-step_index", "-created"], name="undo_stack_open_lifo",
                                condition=models.Q(state__in=["pending", "running", "compensation_failed"])),
                   # What people and sweeps look up by state (running claims, failures waiting for a
                   # person): not the pending entries every intercept writes, nor the compensated ones
                   # every walk step leaves.
                   models.Index(fields=["state"], name="undo_entry_state_active",
                                condition=models.Q(state__in=["running", "compensation_failed"])),
                   # Only where set: a new entry has neither, so the intercept writes no entry to them.
                   models.Index(fields=["next_attempt_at"], name="undo_entry_due",
                                condition=models.Q(next_attempt_at__isnull=False)),
                   models.Index(fields=["lease_until"], name="undo_entry_leased",
                                condition=models.Q(lease_until__isnull=False))]

    def __str__(self) -> str:
        return f"undo {self.fn_name}@{self.fn_version} for step {self.step_index} ({self.state})"

    @property
    def attempts_in_round(self) -> int:
        return self.attempts - self.round_start

    @property
    def retries_left(self) -> bool:
        return self.attempts_in_round < self.max_retries + 1

    def waiting_note(self, fn: CompensationFunction) -> str | None:
        """What an open agent-side entry waits for, in words, for the dashboard and the API."""
        if fn.handler != CompensationFunction.Handler.AGENT or self.state not in UndoEntry.OPEN:
            return None
        if self.state == UndoEntry.State.RUNNING:
            return f"claimed by the agent side (attempt {self.attempts}); its lease ends {self.lease_until:%H:%M:%S}"
        if self.state == UndoEntry.State.PENDING and self.claim_deadline:
            return (f"waiting for the agent side to claim it (gateway or serve_compensations); "
                    f"a person is called at {self.claim_deadline:%H:%M:%S}")
        if self.state == UndoEntry.State.PENDING:
            return "run by the agent side once the walk reaches it"
        return None

    def move(self, allowed_from: set[str] | frozenset[str], to: str, *, attempt: int | None = None,
             **fields: Any) -> bool:
        """Guarded UPDATE of the entry's state. With `attempt`, only the holder of that claim
        may write: a worker whose stalled claim was taken over finds nothing to change."""
        rows = UndoEntry.objects.filter(pk=self.pk, state__in=allowed_from)
        if attempt is not None:
            rows = rows.filter(attempts=attempt)
        now = timezone.now()
        if rows.update(state=to, updated=now, **fields) != 1:
            return False
        self.announce(self.state, to)
        self.state, self.updated = to, now
        for name, value in fields.items():
            setattr(self, name, value)
        return True

    def announce(self, from_state: str | None, to: str) -> None:
        announce(self, "undo_entry", from_state, to, name=_loaded(self, "fn_name") or "",
                 session_id=self.session_id, org_id=_org_of_entry(self), step_index=_loaded(self, "step_index"))

    def claim(self, lease: timedelta) -> bool:
        """Take the next attempt, held for `lease`. Guarded on the state and attempt count read a
        moment ago (and on the entry being due, or its lease having run out), so of two workers that
        read the same row only one changes it: no entry is ever run twice at once.

        Timed by the database's clock, never the claimer's: a worker whose clock runs ahead would
        take over a claim that is still live, and one running behind would hand out a lease that
        has already run out for everyone else (the nemesis's clock fault)."""
        rows = UndoEntry.objects.filter(pk=self.pk, state=self.state, attempts=self.attempts)
        if self.state == self.State.RUNNING:
            rows = rows.filter(models.Q(lease_until__isnull=True) | models.Q(lease_until__lte=Now()))
        else:
            rows = rows.filter(models.Q(next_attempt_at__isnull=True) | models.Q(next_attempt_at__lte=Now()))
        number = self.attempts + 1
        lease_until = models.ExpressionWrapper(Now() + lease, output_field=models.DateTimeField())
        if rows.update(state=self.State.RUNNING, attempts=number, claimed_at=Now(), lease_until=lease_until,
                       next_attempt_at=None, updated=Now()) != 1:
            return False
        self.announce(self.state, self.State.RUNNING)
        self.state, self.attempts, self.next_attempt_at = self.State.RUNNING, number, None
        self.claimed_at, self.lease_until, self.updated = (
            UndoEntry.objects.filter(pk=self.pk).values_list("claimed_at", "lease_until", "updated").get())
        return True

    def render(self, effect: Effect) -> None:
        """At commit: the args from the template and the result, or `compensation_failed` with
        the reason when the template names something the result does not have."""
        try:
            args = render_with_result(self.args_template, effect.args, effect.result)
        except TemplateError as exc:
            return self.flag(f"compensation args cannot be rendered: {exc}")
        self.move({self.State.PENDING}, self.State.PENDING, args=args)
        return None

    def flag(self, reason: str) -> bool:
        """Sent to a person before any attempt: the compensation cannot run as registered."""
        with transaction.atomic():
            if not self.move({self.State.PENDING}, self.State.COMPENSATION_FAILED, last_error=reason[:10_000]):
                return False
            session = Session.objects.select_related("org", "agent").get(pk=self.session_id)
            Event.record(session.org, "compensation.failed", agent=session.agent, session_id=session.id,
                         undo_entry=str(self.id), effect=str(self.effect_id), step_index=self.step_index,
                         fn_name=self.fn_name, fn_version=self.fn_version, attempts=self.attempts,
                         error=reason[:2000], status_code=None)
        return True

    def _move_or_conflict(self, allowed_from: set[str], to: str, **fields: Any) -> None:
        if not self.move(allowed_from, to, **fields):
            current = UndoEntry.objects.filter(pk=self.pk).values_list("state", flat=True).first()
            raise Conflict(f"The undo entry is {current}; only a compensation_failed entry can be retried "
                           "or resolved.", code="undo_entry_state_conflict", state=current)

    def retry(self, actor: str) -> None:
        """A person asks for another round of attempts; the walk resumes from this entry."""
        with transaction.atomic():
            self._move_or_conflict({self.State.COMPENSATION_FAILED}, self.State.PENDING,
                                   round_start=models.F("attempts"), next_attempt_at=None, lease_until=None)
            self.refresh_from_db(fields=["round_start", "attempts"])
            Effect.objects.get(pk=self.effect_id).retry_compensation(actor)
            session = Session.objects.get(pk=self.session_id)
            session.move({Session.State.COMPENSATION_FAILED}, Session.State.COMPENSATING, actor=actor,
                         reason=f"retry of {self.fn_name} for step {self.step_index}")
            session.begin_walk(actor)

    def resolve(self, actor: str, note: str) -> None:
        """A person undid the effect by hand; the walk resumes below this entry."""
        with transaction.atomic():
            self._move_or_conflict({self.State.COMPENSATION_FAILED}, self.State.RESOLVED, resolution_note=note,
                                   resolved_by=actor, resolved_at=timezone.now(), lease_until=None)
            Effect.objects.get(pk=self.effect_id).mark_compensated(actor, reason=f"resolved by hand: {note}")
            session = Session.objects.get(pk=self.session_id)
            session.move({Session.State.COMPENSATION_FAILED}, Session.State.COMPENSATING, actor=actor,
                         reason=f"step {self.step_index} resolved by hand")
            Event.record(session.org, "undo_entry.resolved", agent=session.agent, session_id=session.id,
                         undo_entry=str(self.id), effect=str(self.effect_id), step_index=self.step_index,
                         fn_name=self.fn_name, by=actor, note=note[:2000])
            session.begin_walk(actor)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "session": str(self.session_id),
            "effect": str(self.effect_id),
            "step_index": self.step_index,
            "fn_name": self.fn_name,
            "fn_version": self.fn_version,
            "args": self.args,
            "state": self.state,
            "attempts": self.attempts,
            "max_retries": self.max_retries,
            "retry_backoff_ms": self.retry_backoff_ms,
            "next_attempt_at": _iso(self.next_attempt_at),
            "args_template": self.args_template,
            "claim_deadline": _iso(self.claim_deadline),
            "lease_until": _iso(self.lease_until),
            "last_error": self.last_error or None,
            "last_status_code": self.last_status_code,
            "resolution_note": self.resolution_note or None,
            "resolved_by": self.resolved_by or None,
            "resolved_at": _iso(self.resolved_at),
            "updated": _iso(self.updated),
        }


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


class UndoAttempt(models.Model):
    """One try at running a compensation: when, how long, what came back. Append-only."""

    class Outcome(models.TextChoices):
        SUCCESS = "success"
        RETRY = "retry"
        PERMANENT = "permanent"
        LOST = "lost"  # the worker died mid-attempt; the sweep found the stalled claim

    entry = models.ForeignKey(UndoEntry, on_delete=models.CASCADE, related_name="attempt_log", editable=False)
    number = models.PositiveSmallIntegerField(editable=False)
    started_at = models.DateTimeField(editable=False)
    duration_ms = models.PositiveIntegerField(editable=False)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, editable=False)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    error = models.TextField(blank=True, editable=False)
    retry_delay_ms = models.PositiveIntegerField(
        null=True, blank=True, editable=False, help_text="The backoff drawn before the next attempt.")

    class Meta:
        ordering = ["entry", "number"]
        constraints = [models.UniqueConstraint(fields=["entry", "number"], name="one_attempt_per_number")]
        indexes = [models.Index(fields=["started_at"])]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.entry_id} ({self.outcome})"

    def as_dict(self) -> dict[str, Any]:
        return {"number": self.number, "started_at": self.started_at.isoformat(),
                "duration_ms": self.duration_ms, "outcome": self.outcome,
                "status_code": self.status_code, "error": self.error or None,
                "retry_delay_ms": self.retry_delay_ms}


class PreImageQuerySet(models.QuerySet):
    def kept(self) -> PreImageQuerySet:
        return self.filter(dropped_at__isnull=True)

    def sealed(self) -> PreImageQuerySet:
        """Kept with a value (an over-bound refusal keeps none)."""
        return self.kept().exclude(sealed=b"")


class PreImage(models.Model):
    """What was there before one call of a tool that declares a before read (effects/preimages.py):
    sealed at rest with the server's key (core/seal.py), kept with the call's undo entry only while
    its run can still be undone, then dropped (`sealed` emptied, the digests stay). Never in an
    event, a webhook or an export: only its digests are.

    `before_digest` is the target's state before the call; `after_digest` what the call left (from
    the declaration's `after`, or a read after the call), so that a restore puts the pre-image back
    only over what this run wrote (a compare-and-restore). `held`: over its bound, a person decided."""

    entry = models.OneToOneField(UndoEntry, on_delete=models.CASCADE, related_name="pre_image", editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="pre_images", editable=False,
                                db_index=False)  # pre_image_run below leads with it
    sealed = models.BinaryField(editable=False)
    size = models.PositiveIntegerField(editable=False, help_text="Bytes of the value's canonical JSON.")
    absent = models.BooleanField(default=False, editable=False)
    before_digest = models.CharField(max_length=71, editable=False)
    after_digest = models.CharField(max_length=71, blank=True)
    held = models.BooleanField(default=False, editable=False)
    created = models.DateTimeField(default=timezone.now, editable=False)
    dropped_at = models.DateTimeField(null=True, blank=True)

    objects = PreImageQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["session"], name="pre_image_run", condition=models.Q(dropped_at__isnull=True))]

    def __str__(self) -> str:
        return f"pre-image of {self.entry_id} ({self.size} bytes{', dropped' if self.dropped_at else ''})"

    def value(self) -> Any:
        """The pre-image (None when absent); raises when it was dropped."""
        from core.seal import unseal

        if self.dropped_at is not None:
            raise Conflict("This pre-image was dropped (its run can no longer be undone).", code="pre_image_dropped")
        return json.loads(unseal(self.sealed))["value"]

    def reseal(self) -> bool:
        """Seal the value again under the current key (after a rotation, so that the old key can
        leave UNDOLOG_SEAL_KEYS_OLD); False when it is sealed with it already. Raises SealError
        when no configured key opens it. Guarded: a pre-image dropped meanwhile stays dropped."""
        from core import seal

        token = bytes(self.sealed)
        if self.dropped_at is not None or not token or seal.is_current(token):
            return False
        self.sealed = seal.reseal(token)
        return PreImage.objects.filter(pk=self.pk, dropped_at__isnull=True).update(sealed=self.sealed) == 1

    def digests(self) -> dict[str, Any]:
        """What events, webhooks, the audit chain and exports may carry of a pre-image."""
        return {"before_digest": self.before_digest, "after_digest": self.after_digest or None,
                "size": self.size, "absent": self.absent, "dropped": self.dropped_at is not None}
