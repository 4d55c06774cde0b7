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

from approvals.groups import ReviewerGroup  # noqa: F401 (models of this app, kept in their own modules)
from approvals.rules import Rule, RuleChange  # noqa: F401
from budgets.models import Refusal
from core.errors import Conflict, Forbidden, Invalid
from deliveries.models import Delivery
from effects.models import Effect, Session, Tool, UndoEntry, canonical_json, render_text, sha256, undo_one_due
from orgs.models import Event, Organization

TIMEOUT_LABEL = "timeout"
RULE_PREFIX = "rule:"
GRANT_PREFIX = "grant:"
MAX_EXTEND_MINUTES = 7 * 24 * 60
MAX_EDIT_DEPTH = 32


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
            elif label.startswith(RULE_PREFIX):
                count["by_rule"] += 1  # decided at the intercept: no person waited, no time to decide
            elif label.startswith(GRANT_PREFIX):
                count["granted"] += 1  # decided at once: not a person's time to decide
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
            "decided_by_rule": count["by_rule"],
            "granted": count["granted"],
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
    # `org` leads both indexes below: no index of its own (each index costs every intercept that
    # opens a request a write).
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="approval_requests",
                            db_index=False)
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
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    decided_by_label = models.CharField(max_length=200, blank=True,
                                        help_text="Username, or 'timeout' for a deadline decision.")
    decision_reason = models.TextField(blank=True)
    decided_args_digest = models.CharField(max_length=64, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    rollback = models.BooleanField(default=False, help_text="Rejected and the session rolled back.")
    # Quorum: pending until this many distinct reviewers approved; each approval is {"by", "at"}.
    approvals_required = models.PositiveSmallIntegerField(default=1)
    approvals = models.JSONField(default=list, blank=True)
    rule = models.CharField(max_length=100, blank=True, help_text="The rule that decided or required this.")
    # A require rule's group: only its members may approve. The name stays when the group is
    # deleted (only possible once nothing pending uses it), and a request whose group is gone
    # can only be rejected or expire: it fails closed.
    reviewer_group = models.ForeignKey("approvals.ReviewerGroup", null=True, blank=True, on_delete=models.SET_NULL,
                                       related_name="approval_requests")
    reviewer_group_name = models.CharField(max_length=64, blank=True)
    rule_observations = models.JSONField(default=list, blank=True,
                                         help_text="What observe-mode rules would have decided.")
    # Why a rule holds the call: [{"rule", "message", "tainted": [{"arg", "token", "from_step", "from_tool"}]}].
    flagged = models.BooleanField(
        default=False, help_text="A compensable call a flag rule let run at once: review after; reject undoes it.")
    why = models.JSONField(default=list, blank=True)
    created = models.DateTimeField(default=timezone.now)

    objects = ApprovalRequestQuerySet.as_manager()

    class Meta:
        ordering = ["timeout_at"]
        indexes = [models.Index(fields=["org", "state", "timeout_at"]),
                   models.Index(fields=["org", "decided_at"]),
                   # Every org's pending requests (the metrics' gauges); a plain index, not
                   # `db_index`'s pair (its LIKE twin served no query).
                   models.Index(fields=["state"], name="approval_state")]

    def __str__(self) -> str:
        return f"approval of {self.tool_name} ({self.state})"

    @classmethod
    def open_for(cls, effect: Effect, tool: Tool, session: Session, context: dict[str, Any], *,
                 approvals_required: int = 1, rule: str = "", reviewer_group: Any = None,
                 observations: list[dict[str, Any]] | None = None,
                 why: list[dict[str, Any]] | None = None, flagged: bool = False) -> ApprovalRequest:
        """Create the request in the intercept transaction (deadline: tool, else org)."""
        return cls.objects.create(**cls.values_for(effect, tool, session, context,
                                                   approvals_required=approvals_required, rule=rule,
                                                   reviewer_group=reviewer_group, observations=observations,
                                                   why=why), flagged=flagged)

    @staticmethod
    def values_for(effect: Effect, tool: Tool, session: Session, context: dict[str, Any], *,
                   approvals_required: int = 1, rule: str = "", reviewer_group: Any = None,
                   observations: list[dict[str, Any]] | None = None,
                   why: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The new request's fields (`open_for` saves them; the fast approval path writes them in its
        one statement, lifecycle/intercept/two_statements.py)."""
        org = session.org
        timeout_s = tool.approval_timeout_s or org.approval_timeout_s
        auto = tool.auto_approve_on_timeout
        return {
            "approvals_required": approvals_required, "rule": rule, "rule_observations": observations or [],
            "why": why or [],
            "reviewer_group_id": reviewer_group.id if reviewer_group else None,
            "reviewer_group_name": reviewer_group.name if reviewer_group else "",
            "org": org, "effect": effect, "session": session, "tool_name": tool.name,
            "reason": tool.approval_reason or next((w["message"] for w in why or [] if w.get("message")), ""),
            "risk_tags": tool.risk_tags,
            "estimated_impact": render_text(tool.estimated_impact, effect.args),
            "proposed_args": effect.args, "args_digest": effect.args_digest, "agent_context": context,
            "timeout_at": timezone.now() + timedelta(seconds=timeout_s),
            "auto_approve_on_timeout": org.auto_approve_on_timeout if auto is None else auto,
        }

    # ------------------------------------------------------------ reading

    @property
    def decision(self) -> str | None:
        """What the caller is told: approved, rejected, expired, or None while pending."""
        return None if self.state == self.State.PENDING else self.state

    def summary(self) -> dict[str, Any]:
        return {"id": str(self.id), "state": self.state, "timeout_at": self.timeout_at.isoformat()}

    @property
    def quorum(self) -> str:
        """"1 of 2": how far a request that needs several reviewers has come."""
        return f"{len(self.approvals)} of {self.approvals_required}"

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
                "reason": approval.decision_reason or None, "decision": approval.decision,
                "decided_args_digest": approval.decided_args_digest or None}
        return view, approval.caller_fields()

    def event_data(self) -> dict[str, Any]:
        return {"approval": self.summary(), "tool": self.tool_name, "effect": str(self.effect_id),
                "decision": self.decision, "decided_by": self.decided_by_label or None,
                "reason": self.decision_reason or None, "rollback": self.rollback,
                "approvals": self.approvals, "approvals_required": self.approvals_required,
                "flagged": self.flagged}

    # ------------------------------------------------------------ decisions

    def approve(self, by=None, reason: str = "", args_digest: str | None = None,
                args: dict[str, Any] | None = None) -> None:
        """Approve the exact args shown (by=None: the deadline passed with auto-approve on), or
        the reviewer's edit of them (`args`): the edit is what runs. (A rule or a grant decides
        at the intercept: `approve_at_once`.)

        1. An approval is bound to args: a digest that is not the request's is 409.
        2. A person: not the one who started the run (403), a member of the request's reviewer
           group if it has one (403 `not_in_reviewer_group`), and, with a quorum, counted once;
           the request stays pending until `approvals_required` distinct people approved. An
           edit needs a single approver (409 `edit_needs_single_approver`): the others would
           have approved args they never saw.
        3. Guarded UPDATE pending → approved (the first decision wins), bound to the digest of
           what will run (the edit's, if any).
        4. Effect pending → approved (with `approved_args`); session awaiting_approval → running.
        5. A tool with an executor gets its call queued as a delivery row (the worker runs it).
        6. `approval.decided` is recorded; fan-out happens after commit.
        """
        if args_digest not in (None, "", self.args_digest):
            raise Conflict("The args changed since you looked: the digest you approved is not this "
                           "request's. Reload the request and decide again.",
                           code="args_digest_mismatch", args_digest=self.args_digest)
        edited, digest = self._edit(args)
        if edited is not None and self.approvals_required > 1:
            raise Conflict(f"This request needs {self.approvals_required} approvers, and they must all approve "
                           "the same args: approve it as proposed, or reject it and say what to change.",
                           code="edit_needs_single_approver", approvals_required=self.approvals_required)
        label = _label(by)
        person = by is not None
        if self.flagged:
            return self._keep_flagged(by, label, reason)
        with transaction.atomic():
            approvals = self._count_approval(by, reason) if person else self.approvals
            if approvals is None:
                return  # counted; more reviewers must approve
            # A person approves before the deadline; after it, only the deadline decides.
            self._decide(self.State.APPROVED, by, label, reason, due_only=not person,
                         before_deadline=person, decided_args_digest=digest, approvals=approvals)
            self._release_approved(label, reason, edited)

    def _keep_flagged(self, by, label: str, reason: str) -> None:
        """Approve a flagged call: it ran already, and stays done; the run is not touched."""
        with transaction.atomic():
            if by is not None:
                self._refuse_run_starter(by)
            self._decide(self.State.APPROVED, by, label, reason, decided_args_digest=self.args_digest,
                         before_deadline=by is not None, due_only=by is None)
            session = Session.objects.select_related("agent").get(pk=self.session_id)
            Event.record(self.org, "approval.decided", agent=session.agent, session_id=session.pk,
                         **self.event_data())

    def approve_at_once(self, effect: Effect, label: str, reason: str, **extra: Any) -> None:
        """Decided at the intercept, in its transaction, by a rule (`rule:<name>`) or a live grant
        (`grant:<id>`): the session never waits, so it stays running. Recorded like any approval."""
        with transaction.atomic():
            self._decide(self.State.APPROVED, None, label, reason, decided_args_digest=self.args_digest)
            effect.approve(actor=label, reason=reason)
            self._approved(effect, self.session.agent, **extra)

    def approve_by_grant(self, grant: Grant, effect: Effect) -> None:
        self.approve_at_once(effect, grant.label, grant_reason(grant), grant=str(grant.pk))

    def _edit(self, args: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str]:
        """Edit before approving: the edited args (None if unchanged) and the digest the decision
        binds to. An edit equal to the proposal is no edit."""
        if args is None:
            return None, self.args_digest
        problem = edited_args_problem(args)
        if problem:
            raise Invalid({"args": problem}, f"args: {problem}")
        digest = sha256(canonical_json(args))
        return (None, digest) if digest == self.args_digest else (args, digest)

    def _release_approved(self, label: str, reason: str, edited: dict[str, Any] | None = None) -> None:
        """After the guarded UPDATE to approved (a person's, the deadline's or a rule's decision):
        effect approved, the waiting session running again, then `_approved`."""
        effect, session = self._effect_and_session()
        effect.approve(actor=label, reason=reason, approved_args=edited)
        if not _release(session, session.resume_running, label, reason or "approved"):
            # The run ended (failed, say) while it waited: nothing may run on its behalf.
            raise Conflict(f"The session is {session.state}; this call can no longer run. "
                           "Reject it or let it expire.", code="session_not_awaiting_approval",
                           state=session.state)
        self._approved(effect, session.agent)

    def _approved(self, effect: Effect, agent, **extra: Any) -> None:
        """Every approval ends here: a tool with an executor gets its call queued (the worker runs
        it), and `approval.decided` is recorded."""
        if effect.tool_id and effect.tool and effect.tool.executor_url:
            queue_execution(effect, self)
        Event.record(self.org, "approval.decided", agent=agent, session_id=self.session_id, **extra,
                     **self.event_data())

    def _count_approval(self, by, reason: str) -> list[dict[str, str]] | None:
        """Quorum: one person's approval. The approvals so far with theirs added when that makes
        the quorum (the caller then decides), else None (recorded; still pending).

        The person who started the run may not approve its calls (403 run_starter_cannot_approve),
        and nobody counts twice (409 already_approved_by_you)."""
        self._refuse_run_starter(by)
        self._refuse_outside_group(by)
        entry = {"by": by.get_username(), "at": timezone.now().isoformat()}
        if self.approvals_required <= 1:
            return [entry]
        # FOR UPDATE: two reviewers approving at once must both be counted (each appends to the
        # list the other wrote) and exactly one of them makes the quorum and decides.
        row = ApprovalRequest.objects.select_for_update().get(pk=self.pk)
        if row.state != self.State.PENDING:
            raise _already_decided(row.state)
        if row.timeout_at <= timezone.now():
            raise _deadline_passed(row.timeout_at)
        if any(a["by"] == entry["by"] for a in row.approvals):
            raise Conflict(f"You already approved this request ({len(row.approvals)} of "
                           f"{row.approvals_required}); another reviewer must approve it too.",
                           code="already_approved_by_you", approvals=row.approvals,
                           approvals_required=row.approvals_required)
        approvals = [*row.approvals, entry]
        if len(approvals) >= row.approvals_required:
            return approvals
        ApprovalRequest.objects.filter(pk=self.pk).update(approvals=approvals)
        self.approvals = approvals
        Event.record(self.org, "approval.counted", agent=self.session.agent, session_id=self.session_id,
                     approval=self.summary(), tool=self.tool_name, effect=str(self.effect_id), by=entry["by"],
                     reason=reason or None, approvals=approvals, approvals_required=self.approvals_required)
        return None

    def _refuse_run_starter(self, by) -> None:
        started_by = (self.session.started_by or "").strip().lower()
        if started_by and started_by in {by.get_username().lower(), (by.email or "").lower()}:
            raise Forbidden(f"You started this run ({self.session.started_by}); another reviewer must approve "
                            "its calls.", code="run_starter_cannot_approve")

    def in_group(self, user) -> bool:
        """Whether `user` may approve for the request's reviewer group (True when it has none)."""
        if not self.reviewer_group_name:
            return True
        return self.reviewer_group is not None and self.reviewer_group.has_member(user)

    def _refuse_outside_group(self, by) -> None:
        if not self.in_group(by):
            raise Forbidden(f"Only members of the reviewer group {self.reviewer_group_name!r} may approve this call"
                            + (f" (rule {self.rule})" if self.rule else "") + "; you may still reject it.",
                            code="not_in_reviewer_group", reviewer_group=self.reviewer_group_name)

    def reject(self, by, reason: str, rollback: bool = False) -> None:
        """Reject with a reason: effect rejected, session halted (or failed, so its undo stack
        is walked, with `rollback`), a refusal row and `approval.decided` recorded."""
        reason = (reason or "").strip()
        if not reason:
            raise Invalid({"reason": "A reason is required to reject (the agent is told it)."},
                          "A reason is required to reject.")
        label = _label(by)
        if self.flagged:
            return self._undo_flagged(by, label, reason, rollback)
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

    def _undo_flagged(self, by, label: str, reason: str, rollback: bool) -> None:
        """Reject a flagged call, which ran already: undo that call alone (its undo entry, claimed
        like the walk's, exactly once: lifecycle/flagged.py, after commit), the run going on; or,
        with `rollback`, fail the run (a finished one: undo it) so its whole stack is walked back."""
        with transaction.atomic():
            self._decide(self.State.REJECTED, by, label, reason, rollback=rollback)
            effect, session = self._effect_and_session()
            if rollback and session.state in Session.OPEN | {Session.State.HALTED}:
                session.fail(reason, label)
            elif rollback and session.state == Session.State.COMPLETED:
                session.undo(label)
            elif session.state != Session.State.COMPENSATING:
                entry = UndoEntry.objects.filter(effect_id=effect.pk).values_list("pk", flat=True).first()
                if entry is not None:
                    transaction.on_commit(lambda: undo_one_due.send(sender=ApprovalRequest, entry_id=entry))
            Event.record(self.org, "approval.decided", agent=session.agent, session_id=session.pk,
                         **self.event_data())

    def expire(self) -> None:
        """The deadline passed: auto-approve if configured, else effect expired, session halted.
        A flagged call ran already: nobody rejected it, so it stays done (the request expires)."""
        if self.flagged:
            with transaction.atomic():
                self._decide(self.State.EXPIRED, None, TIMEOUT_LABEL, "Nobody reviewed the flagged call in time; "
                             "it stays done.", due_only=True)
                session = Session.objects.select_related("agent").get(pk=self.session_id)
                Event.record(self.org, "approval.expired", agent=session.agent, session_id=session.pk,
                             **self.event_data())
            return
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

    def withdraw(self, actor: str, reason: str = "Withdrawn: the session failed before a decision.") -> None:
        """The run was failed (or rewound before this call) while this waited: the call will never
        run, so the request leaves the queue (as expired, decided by whoever failed the run)
        instead of lingering there; `reason` says why."""
        with transaction.atomic():
            self._decide(self.State.EXPIRED, None, actor, reason)
            effect, session = self._effect_and_session()
            if not self.flagged:  # a flagged call ran: the run's walk undoes it with the rest
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


# ---------------------------------------------------------------- grants

MAX_GRANT_MINUTES = 7 * 24 * 60


class GrantQuerySet(models.QuerySet):
    def for_org(self, org: Organization) -> GrantQuerySet:
        return self.filter(org=org)

    def live(self) -> GrantQuerySet:
        return self.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()), revoked_at__isnull=True)

    def matching(self, agent_id: Any, tool_name: str, session_id: Any) -> GrantQuerySet:
        """Live grants that decide this call (one indexed query: agent, tool)."""
        return self.live().filter(Q(session__isnull=True) | Q(session_id=session_id),
                                  agent_id=agent_id, tool_name=tool_name).order_by("created")


class Grant(models.Model):
    """A reviewer's standing approval of one tool for one agent: for the rest of one run
    (`session`), or for `minutes` (`expires_at`). While it is live, an irreversible call it
    matches is decided at once, as `grant:<id>`, after the budget check (a grant never lifts a cap).

    Revoking is a guarded UPDATE (`revoked_at IS NULL`); the row stays, so past decisions keep
    naming a grant one can read."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", editable=False)
    agent = models.ForeignKey("orgs.Agent", on_delete=models.CASCADE, related_name="grants", editable=False)
    tool_name = models.CharField(max_length=200, editable=False)
    session = models.ForeignKey(Session, null=True, blank=True, on_delete=models.CASCADE, related_name="+",
                                editable=False, help_text="Only this run; empty: every run until it expires.")
    expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+", editable=False)
    created_by_label = models.CharField(max_length=200, editable=False)
    reason = models.TextField(blank=True, editable=False)
    created = models.DateTimeField(default=timezone.now, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by_label = models.CharField(max_length=200, blank=True)

    objects = GrantQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]
        # The intercept's one lookup (slow path only): agent and tool, then liveness.
        indexes = [models.Index(fields=["agent", "tool_name"], name="grant_agent_tool")]

    def __str__(self) -> str:
        return f"grant of {self.tool_name} to {self.agent_id}"

    @property
    def label(self) -> str:
        return f"grant:{self.pk}"

    @property
    def live(self) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > timezone.now())

    @classmethod
    def issue(cls, org: Organization, agent, tool_name: str, by, *, session: Session | None = None,
              minutes: int | None = None, reason: str = "") -> Grant:
        """A reviewer issues a grant: for `session` (the rest of that run) or for `minutes`."""
        if (session is None) == (minutes is None):
            raise Invalid({"session": "Give a session or minutes, not both."},
                          "A grant is for the rest of one run (session) or for some minutes, not both.")
        if minutes is not None and not 1 <= minutes <= MAX_GRANT_MINUTES:
            raise Invalid({"minutes": f"Must be a whole number from 1 to {MAX_GRANT_MINUTES}."},
                          f"minutes must be from 1 to {MAX_GRANT_MINUTES}.")
        expires = timezone.now() + timedelta(minutes=minutes) if minutes is not None else None
        with transaction.atomic():
            grant = cls.objects.create(org=org, agent=agent, tool_name=tool_name, session=session,
                                       expires_at=expires, created_by=by, created_by_label=_label(by),
                                       reason=reason)
            Event.record(org, "grant.issued", agent=agent, session_id=session.pk if session else None,
                         **grant.event_data())
        return grant

    def revoke(self, by) -> None:
        with transaction.atomic():
            now = timezone.now()
            if Grant.objects.filter(pk=self.pk, revoked_at__isnull=True).update(
                    revoked_at=now, revoked_by_label=_label(by)) != 1:
                raise Conflict("This grant was already revoked.", code="grant_revoked")
            self.revoked_at, self.revoked_by_label = now, _label(by)
            Event.record(self.org, "grant.revoked", agent=self.agent, session_id=self.session_id,
                         **self.event_data())

    def event_data(self) -> dict[str, Any]:
        return {"grant": self.as_dict()}

    def as_dict(self) -> dict[str, Any]:
        return {"id": str(self.id), "agent": self.agent.name, "tool": self.tool_name,
                "session": str(self.session_id) if self.session_id else None,
                "expires_at": self.expires_at.isoformat() if self.expires_at else None,
                "created_by": self.created_by_label, "reason": self.reason or None,
                "created": self.created.isoformat(),
                "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
                "revoked_by": self.revoked_by_label or None, "live": self.live}


def edited_args_problem(args: Any) -> str | None:
    """What is wrong with a reviewer's edit of a call's args, or None: the same limits as an
    intercepted call's args (an object, UNDOLOG_MAX_ARGS_BYTES), and a nesting limit so no
    edit can make the agent's JSON parser recurse without end."""
    if not isinstance(args, dict):
        return "Must be a JSON object of the call's arguments."
    if len(canonical_json(args).encode()) > settings.UNDOLOG_MAX_ARGS_BYTES:
        return f"Must be at most {settings.UNDOLOG_MAX_ARGS_BYTES // 1024} KiB of JSON."
    if _depth(args) > MAX_EDIT_DEPTH:
        return f"Must be nested at most {MAX_EDIT_DEPTH} levels deep."
    return None


def _depth(value: Any, level: int = 1) -> int:
    if level > MAX_EDIT_DEPTH:
        return level  # deep enough to refuse; stop walking
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return max((_depth(child, level + 1) for child in children if isinstance(child, (dict, list))), default=level)


def grant_reason(grant: Any) -> str:
    """The decision reason of a call a grant approved (`grant` a Grant, or a row read like one)."""
    return f"Granted by {grant.created_by_label}" + (f": {grant.reason}" if grant.reason else "")


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
    "approval.requested", "approval.decided", "approval.expired", "approval.extended", "approval.counted",
    "rule.changed", "rule.observed", "reviewer_group.changed",
    "compensation.failed", "permission_denied", "budget.exceeded", "agent.suspended", "agent.resumed",
    "incident.changed", "session.updated", "session.abandoned", "grant.issued", "grant.revoked",
    # For the audit chain (ops/audit.py): budget and retention changes, hand resolutions, undone runs.
    "policy.changed", "policy.retention_changed", "undo_entry.resolved", "session.compensated",
    "agent.rolled_back", "session.rewound",
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


def queue_execution(effect: Effect, approval: ApprovalRequest) -> Delivery:
    """Queue the approved call for the tool's executor, in the approving transaction: an
    `executor` delivery (one per effect), run by the worker once this commits."""
    tool = effect.tool
    delivery = Delivery.objects.create(
        org_id=effect.org_id, purpose=Delivery.Purpose.EXECUTOR, effect=effect, kind="executor",
        url=tool.executor_url, timeout_ms=tool.executor_timeout_ms,
        max_attempts=settings.UNDOLOG_EXECUTOR_MAX_ATTEMPTS,
        body={"effect_id": str(effect.id), "session_id": str(effect.session_id), "tool": effect.tool_name,
              # What the reviewer approved runs: their edit if they made one (the digest is the
              # decision's); the agent's proposal is kept beside it.
              "args": effect.args_to_run, "args_digest": approval.decided_args_digest or effect.args_digest,
              "proposed_args": effect.args, "step_index": effect.step_index,
              "approval": {"id": str(approval.id), "decided_by": approval.decided_by_label,
                           "reason": approval.decision_reason or None}},
    )
    delivery.enqueue_after_commit()
    return delivery


# ---------------------------------------------------------------- Slack


def _fernet():
    """The key that seals Slack secrets at rest: derived from SECRET_KEY (rotating SECRET_KEY
    means connecting Slack again; the secrets are never shown, so nothing else is lost)."""
    import base64
    import hashlib

    from cryptography.fernet import Fernet

    digest = hashlib.sha256(f"undolog.slack:{settings.SECRET_KEY}".encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def seal(value: str) -> str:
    return _fernet().encrypt(value.encode()).decode()


def unseal(value: str) -> str:
    return _fernet().decrypt(value.encode()).decode() if value else ""


class SlackConnection(models.Model):
    """An org's Slack app: its bot token and signing secret (sealed, write-only: never shown
    again, only their last four characters), and the channel new approval requests go to."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    org = models.OneToOneField(Organization, on_delete=models.CASCADE, related_name="slack")
    sealed_bot_token = models.TextField(editable=False)
    sealed_signing_secret = models.TextField(editable=False)
    bot_token_hint = models.CharField(max_length=8, editable=False)
    channel = models.CharField(max_length=100, help_text="The channel's ID (C0123…) or name.")
    active = models.BooleanField(default=True)
    created = models.DateTimeField(default=timezone.now, editable=False)
    updated = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "Slack connection"

    def __str__(self) -> str:
        return f"Slack of {self.org} → {self.channel}"

    def set_secrets(self, bot_token: str | None = None, signing_secret: str | None = None) -> None:
        if bot_token:
            self.sealed_bot_token, self.bot_token_hint = seal(bot_token), "…" + bot_token[-4:]
        if signing_secret:
            self.sealed_signing_secret = seal(signing_secret)

    @property
    def bot_token(self) -> str:
        return unseal(self.sealed_bot_token)

    @property
    def signing_secret(self) -> str:
        return unseal(self.sealed_signing_secret)


class SlackUserLink(models.Model):
    """Who a Slack user is here: set by an admin, or learned from a verified email the first
    time that user pressed a button (users.info), so the next press needs no call to Slack."""

    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    slack_user = models.CharField(max_length=32)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    learned = models.BooleanField(default=False, help_text="Learned from the Slack user's verified email.")
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org", "slack_user"], name="one_link_per_slack_user")]

    def __str__(self) -> str:
        return f"{self.slack_user} → {self.user}"


class SlackMessageQuerySet(models.QuerySet):
    def unsynced(self) -> SlackMessageQuerySet:
        """Not yet posted, or showing a state the request has left; attempts left."""
        return self.filter(~Q(shown_state=F("approval__state")) | Q(ts=""),
                           attempts__lt=settings.UNDOLOG_SLACK_MAX_ATTEMPTS)


class SlackMessage(models.Model):
    """The Slack message of one approval request. The row is the truth: the worker posts it
    (`ts` empty) and updates it whenever the request's state is not what it shows
    (`shown_state`); a lost task only delays it (the sweep sends it again)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    approval = models.OneToOneField(ApprovalRequest, on_delete=models.CASCADE, related_name="slack_message")
    connection = models.ForeignKey(SlackConnection, on_delete=models.CASCADE, related_name="messages")
    channel = models.CharField(max_length=100, blank=True, help_text="As Slack answered (an ID).")
    ts = models.CharField(max_length=32, blank=True, help_text="Slack's id of the message; empty: not posted.")
    shown_state = models.CharField(max_length=16, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(default=timezone.now, editable=False)

    objects = SlackMessageQuerySet.as_manager()

    LEASE = timedelta(seconds=60)

    def __str__(self) -> str:
        return f"Slack message of {self.approval_id} ({self.ts or 'not posted'})"

    def claim(self) -> bool:
        """Hold the row for one sync (two tasks for one message never post it twice)."""
        now = timezone.now()
        return SlackMessage.objects.filter(Q(claimed_at__isnull=True) | Q(claimed_at__lt=now - self.LEASE),
                                           pk=self.pk).update(claimed_at=now) == 1
