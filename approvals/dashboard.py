"""What each dashboard page shows: the reads, scoped to one org, in a fixed number of queries.

Every function here takes the org (never a user's id or a URL's slug), so tenancy is decided
once, in the view's membership lookup. Query counts are pinned in tests/dashboard: no page
runs a query per row.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import zoneinfo
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from html import escape
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.db.models import Count, Max, OuterRef, Q, QuerySet, Subquery, TextField
from django.db.models.functions import Cast, Coalesce, Substr, TruncDate
from django.http import QueryDict
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.safestring import SafeString, mark_safe

from approvals.events import why_text
from approvals.models import EVENT_KINDS, ApprovalRequest, Grant, OrgWebhook, SlackConnection
from budgets import day_usage, sizing
from budgets.models import BudgetPolicy, Limits, PolicyChange, Refusal
from effects.models import (
    Effect,
    EffectTransition,
    SafeCall,
    Session,
    SessionTransition,
    Tier,
    Tool,
    UndoAttempt,
    UndoEntry,
)
from orgs.models import Agent, AgentKey, Event, Membership, Organization

QUEUE_LIMIT = 200  # pending requests a page
DECIDED_PAGE = 50
SESSIONS_PAGE = 50
TIMELINE_LIMIT = 1000
CHART_DAYS = 7

# Risk tags are free text; a tag containing one of these words gets that colour. The table is
# also handed to the page's script (json_script), so rows added live colour the same way.
RISK_CLASSES = [
    ("risk-loss", ["loss", "delete", "destroy", "drop", "wipe", "irreversible"]),
    ("risk-money", ["money", "payment", "financial", "finance", "billing", "refund", "charge", "cost"]),
    ("risk-people", ["pii", "privacy", "personal", "security", "credential", "secret", "access"]),
    ("risk-comms", ["email", "message", "external", "customer", "public", "notify", "send", "post"]),
]


def risk_class(tag: str) -> str:
    lowered = tag.lower()
    for css, words in RISK_CLASSES:
        if any(word in lowered for word in words):
            return css
    return "risk-other"


# ---------------------------------------------------------------- every page


def roles(membership: Membership) -> dict[str, Any]:
    return {"role": membership.role, "org_tz": membership.org.time_zone,
            "can_decide": membership.has_role(Membership.Role.REVIEWER),
            "is_admin": membership.has_role(Membership.Role.ADMIN)}


def frame(membership: Membership, nav_pending: int | None = None) -> dict[str, Any]:
    """The header, nav badges (pending requests, compensation failures) and incident banner: two
    queries (the same when the page already counted the pending requests: then the failures)."""
    org = membership.org
    flags = roles(membership)
    config = {"org": org.slug, **flags, "ws": f"/ws/dashboard/?org={org.slug}", "risk_classes": RISK_CLASSES,
              "time_zone": str(org.time_zone)}
    if nav_pending is None:
        nav_pending, nav_failures = nav_counts(org)
    else:
        nav_failures = UndoEntry.objects.for_org(org).filter(state=UndoEntry.State.COMPENSATION_FAILED).count()
    return {"org": org, "membership": membership, **flags, "dashboard_config": config,
            "nav_pending": nav_pending, "nav_failures": nav_failures, "incident": incident(org)}


def nav_counts(org: Organization) -> tuple[int, int]:
    """Pending requests and compensations waiting for a person, in one query (two subqueries)."""
    pending = (ApprovalRequest.objects.filter(org=OuterRef("pk"), state=ApprovalRequest.State.PENDING)
               .order_by().values("org").annotate(n=Count("pk")).values("n"))
    failures = (UndoEntry.objects.filter(session__org=OuterRef("pk"), state=UndoEntry.State.COMPENSATION_FAILED)
                .order_by().values("session__org").annotate(n=Count("pk")).values("n"))
    row = (Organization.objects.filter(pk=org.pk)
           .values_list(Coalesce(Subquery(pending), 0), Coalesce(Subquery(failures), 0)).get())
    return row[0], row[1]


def incident(org: Organization) -> dict[str, Any] | None:
    """The org's incident switch while it is on (who turned it on, when), else None. One query."""
    row = (BudgetPolicy.objects.org_default(org).filter(incident=True)
           .values("incident_changed_at", "incident_changed_by").first())
    if row is None:
        return None
    return {"on": True, "changed_at": row["incident_changed_at"], "changed_by": row["incident_changed_by"]}


# ---------------------------------------------------------------- the queue


# The queue's row, in one place: the server renders each pending request with it, and the page's
# <template> (an empty row) is what its script clones for requests that arrive live. Made with
# the standard library's html.escape rather than a template loop: Django's template engine takes
# ~100 ms for 500 rows of a dozen variables each (format_html ~40 ms), html.escape a few.
QUEUE_ROW = ('<tr class="queue-row" data-id="{id}" data-deadline="{deadline}">'
             '<td class="pick"><input type="checkbox" class="pick-row" value="{id}" aria-label="Select {tool}"></td>'
             '<td class="deadline"><time class="countdown" datetime="{deadline}">{left}</time> '
             '<small class="auto"{auto}>then auto-approved</small></td>'
             '<td class="tool"><a class="row-link" href="{url}">{tool}</a> '
             '<small class="quorum" title="distinct approvers so far"{quorum_hidden}>{quorum}</small> '
             '<small class="group" title="only this reviewer group may approve"{group_hidden}>{group}</small> '
             '<small class="why" title="why a rule holds it"{why_hidden}>{why}</small></td>'
             '<td class="agent" data-label="agent">{agent}</td><td class="tags">{tags}</td>'
             '<td class="impact">{impact}</td><td class="reasoning">{reasoning}</td></tr>')
HIDDEN = mark_safe(" hidden")


def empty_queue_row() -> SafeString:
    return mark_safe(QUEUE_ROW.format(id="", deadline="", left="", auto=HIDDEN, url="", tool="", agent="", tags="",
                                      impact="", reasoning="", quorum="", quorum_hidden=HIDDEN, group="",
                                      group_hidden=HIDDEN, why="", why_hidden=HIDDEN))


@dataclass
class QueueRow:
    """One pending request as the queue shows it."""

    id: str
    tool: str
    agent: str
    session: str
    risk_tags: list[tuple[str, str]]
    estimated_impact: str
    timeout_at: dt.datetime
    reasoning: str
    auto_approve_on_timeout: bool
    approvals: int = 0
    approvals_required: int = 1
    reviewer_group: str = ""
    why: str = ""

    @property
    def quorum(self) -> str:
        """"1 of 2" while a request needs several approvers (empty when one will do)."""
        return f"{self.approvals} of {self.approvals_required}" if self.approvals_required > 1 else ""

    @property
    def url(self) -> str:
        return f"/approvals/{self.id}/"

    @property
    def deadline_iso(self) -> str:
        return self.timeout_at.isoformat()

    @property
    def time_left(self) -> str:
        """What the countdown shows before the page's script takes over."""
        seconds = int((self.timeout_at - timezone.now()).total_seconds())
        if seconds < 0:
            return "overdue"
        if seconds < 60:
            return f"{seconds} s"
        if seconds < 3600:
            return f"{seconds // 60} min {seconds % 60:02d} s"
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"

    def html(self) -> SafeString:
        """Every value escaped (quotes too: some land in attributes)."""
        tags = "".join(f'<span class="tag {css}">{escape(tag)}</span>' for tag, css in self.risk_tags)
        return mark_safe(QUEUE_ROW.format(
            id=escape(self.id), deadline=escape(self.deadline_iso), left=escape(self.time_left),
            auto="" if self.auto_approve_on_timeout else HIDDEN, url=escape(self.url), tool=escape(self.tool),
            agent=escape(self.agent), tags=tags, impact=escape(self.estimated_impact),
            reasoning=escape(self.reasoning), quorum=escape(self.quorum),
            quorum_hidden="" if self.quorum else HIDDEN,
            group=escape(f"needs {self.reviewer_group}" if self.reviewer_group else ""),
            group_hidden="" if self.reviewer_group else HIDDEN, why=escape(self.why),
            why_hidden="" if self.why else HIDDEN))


def first_line(text: str | None, limit: int = 200) -> str:
    line = (text or "").strip().splitlines()[0].strip() if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def pending_queue(org: Organization, limit: int = QUEUE_LIMIT, *, filters: dict[str, str] | None = None,
                  after: tuple[dt.datetime, str] | None = None) -> list[QueueRow]:
    """Pending requests, most urgent deadline first (then by id, the keyset `after` pages on),
    filtered as the queue's filters say. One query: no JSON context, and only the start of the
    reasoning (it may be 20 000 characters; the row shows one line).

    The deadline comes back as text: Django's psycopg loader for timestamptz runs in Python
    (~20 µs a value, a fifth of this page's time at 500 rows); `fromisoformat` is C."""
    rows = _filtered(ApprovalRequest.objects.for_org(org).pending(), filters or {})
    if after:
        rows = rows.filter(Q(timeout_at__gt=after[0]) | Q(timeout_at=after[0], id__gt=after[1]))
    rows = (rows.order_by("timeout_at", "id")
            .annotate(reasoning_head=Substr("effect__reasoning", 1, 400),
                      deadline=Cast("timeout_at", output_field=TextField()))
            .values_list("id", "tool_name", "session_id", "session__agent__name", "risk_tags", "estimated_impact",
                         "deadline", "reasoning_head", "auto_approve_on_timeout", "approvals",
                         "approvals_required", "reviewer_group_name", "why")[:limit])
    return [QueueRow(id=str(pk), tool=tool, agent=agent, session=str(session),
                     risk_tags=[(tag, risk_class(tag)) for tag in tags or []], estimated_impact=impact,
                     timeout_at=_moment(deadline), reasoning=first_line(reasoning), auto_approve_on_timeout=auto,
                     approvals=len(approvals or []), approvals_required=required, reviewer_group=group,
                     why=why_text(why))
            for pk, tool, session, agent, tags, impact, deadline, reasoning, auto, approvals, required, group, why
            in rows]


# Filters of the queue. Age is how long a request has waited ("older than").
AGE_CHOICES = {"5m": timedelta(minutes=5), "1h": timedelta(hours=1), "1d": timedelta(days=1)}
QUEUE_FILTERS = ("agent", "tool", "tag", "age")


def _filtered(rows: QuerySet[ApprovalRequest], filters: dict[str, str]) -> QuerySet[ApprovalRequest]:
    if filters.get("agent"):
        rows = rows.filter(session__agent__name=filters["agent"])
    if filters.get("tool"):
        rows = rows.filter(tool_name=filters["tool"])
    if filters.get("tag"):
        # JSON containment is not portable (SQLite has no `contains` on JSON): match the quoted
        # tag in the list's JSON text, which both databases write as ["tag", ...] (non-ASCII
        # escaped as \uXXXX on SQLite, raw in PostgreSQL's jsonb).
        tag = filters["tag"]
        rows = rows.annotate(tags_text=Cast("risk_tags", output_field=TextField())).filter(
            Q(tags_text__contains=json.dumps(tag)) | Q(tags_text__contains=json.dumps(tag, ensure_ascii=False)))
    if filters.get("age") in AGE_CHOICES:
        rows = rows.filter(created__lte=timezone.now() - AGE_CHOICES[filters["age"]])
    return rows


@dataclass
class DecidedRow:
    """One decided request as the Decided tab shows it: the decision, who and when."""

    id: str
    tool: str
    agent: str
    state: str
    decided_by: str
    decided_at: dt.datetime | None
    reason: str
    rollback: bool
    risk_tags: list[tuple[str, str]]


@dataclass
class QueueListing:
    tab: str  # pending | decided
    pending: list[QueueRow]
    decided: list[DecidedRow]
    filters: dict[str, str]
    agents: list[str]
    tools: list[str]
    tags: list[str]
    age_choices: list[str]
    next_query: str | None
    errors: list[str] = field(default_factory=list)

    @property
    def filtered(self) -> bool:
        return any(self.filters.get(name) for name in QUEUE_FILTERS)

    @property
    def pending_query(self) -> str:
        """The Pending tab's link: same filters, first page."""
        return urlencode({name: value for name, value in self.filters.items() if value})

    @property
    def decided_query(self) -> str:
        return urlencode({"tab": "decided", **{name: value for name, value in self.filters.items() if value}})


def queue_listing(org: Organization, params: QueryDict) -> QueueListing:
    """The queue's tab (pending: most urgent first, QUEUE_LIMIT a page; decided: newest decision
    first, DECIDED_PAGE a page), filtered by agent, tool, risk tag and age, paged by keyset
    (`after`). Three queries: the agents and the irreversible tools (with their risk tags) for
    the filters, and the page."""
    tab = "decided" if params.get("tab") == "decided" else "pending"
    filters = {name: params.get(name, "").strip() for name in QUEUE_FILTERS}
    errors = []
    if filters["age"] and filters["age"] not in AGE_CHOICES:
        errors.append(f"Unknown age {filters['age']!r}; showing every age.")
        filters["age"] = ""
    agents = list(Agent.objects.for_org(org).order_by("name").values_list("name", flat=True))
    tools, tags = [], set()
    for name, risk_tags in (Tool.objects.for_org(org).filter(tier=Tier.IRREVERSIBLE).order_by("name")
                            .values_list("name", "risk_tags")):
        tools.append(name)
        tags.update(tag for tag in risk_tags or [] if isinstance(tag, str))
    cursor = _cursor(params.get("after", ""))
    pending, decided, last = [], [], None
    if tab == "pending":
        pending = pending_queue(org, QUEUE_LIMIT + 1, filters=filters, after=cursor)
        if len(pending) > QUEUE_LIMIT:
            pending = pending[:QUEUE_LIMIT]
            last = f"{pending[-1].deadline_iso}|{pending[-1].id}"
    else:
        decided = decided_rows(org, filters, cursor)
        if len(decided) > DECIDED_PAGE:
            decided = decided[:DECIDED_PAGE]
            last = f"{decided[-1].decided_at.isoformat()}|{decided[-1].id}"
    next_query = None
    if last:
        query = params.copy()
        query["after"] = last
        next_query = query.urlencode()
    return QueueListing(tab=tab, pending=pending, decided=decided, filters=filters, agents=agents, tools=tools,
                        tags=sorted(tags), age_choices=list(AGE_CHOICES), next_query=next_query, errors=errors)


def decided_rows(org: Organization, filters: dict[str, str],
                 before: tuple[dt.datetime, str] | None = None) -> list[DecidedRow]:
    """Decided requests, newest decision first, one more than a page (so the caller knows if
    there is a next one). One query."""
    rows = _filtered(ApprovalRequest.objects.for_org(org).exclude(state=ApprovalRequest.State.PENDING)
                     .filter(decided_at__isnull=False), filters)
    if before:
        rows = rows.filter(Q(decided_at__lt=before[0]) | Q(decided_at=before[0], id__lt=before[1]))
    rows = rows.order_by("-decided_at", "-id").values_list(
        "id", "tool_name", "session__agent__name", "state", "decided_by_label", "decided_at", "decision_reason",
        "rollback", "risk_tags")[: DECIDED_PAGE + 1]
    return [DecidedRow(id=str(pk), tool=tool, agent=agent, state=state, decided_by=by, decided_at=at,
                       reason=reason, rollback=rollback, risk_tags=[(tag, risk_class(tag)) for tag in tags or []])
            for pk, tool, agent, state, by, at, reason, rollback, tags in rows]


def _moment(text: str) -> dt.datetime:
    # PostgreSQL: "2026-11-30 05:55:41.520968+00"; SQLite: "2026-11-30 05:55:41.520968" (UTC).
    moment = dt.datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def queue_stats(org: Organization) -> dict[str, Any]:
    """The queue's 7 days: approvals' own numbers (`GET /api/v1/approvals/stats`, one
    calculation for the API and the page), with each day as a date for the chart. Two queries."""
    stats = ApprovalRequest.objects.for_org(org).stats(org)
    stats["per_day"] = [{**day, "date": dt.date.fromisoformat(day["date"])} for day in stats["per_day"]]
    return stats


# ---------------------------------------------------------------- one approval


def approvals_of(org: Organization) -> QuerySet[ApprovalRequest]:
    return ApprovalRequest.objects.for_org(org).select_related("session__agent", "effect")


def tool_labels(org_id: Any, names: set[str]) -> dict[str, list[str]]:
    """The labels of the org's tools by name (as registered now: a tool registered again with
    other labels shows those). One query, none for no names."""
    if not names:
        return {}
    rows = Tool.objects.filter(org_id=org_id, name__in=names).values_list("name", "labels")
    return {name: list(labels) for name, labels in rows if labels}


def approval_context(approval: ApprovalRequest) -> dict[str, Any]:
    """The request, its args as readable JSON, the agent's context as a timeline (each call's
    tier with its tool's labels), the effect's history. Two queries beyond the request itself
    (three once it is decided: the next pending one)."""
    context = approval.agent_context or {}
    reasoning = {step["step_index"]: step["text"] for step in context.get("reasoning", [])}
    labels = tool_labels(approval.org_id, {call["tool"] for call in context.get("calls", [])} | {approval.tool_name})
    calls = [{**call, "reasoning": reasoning.pop(call["step_index"], ""), "labels": labels.get(call["tool"], []),
              "args_json": json.dumps(call.get("args") or {}, sort_keys=True, ensure_ascii=False)}
             for call in context.get("calls", [])]
    current = approval.effect.step_index
    current_reasoning = reasoning.pop(current, "") or approval.effect.reasoning
    earlier = [{"step_index": step, "text": text} for step, text in sorted(reasoning.items())]
    return {
        "approval": approval,
        "session": approval.session,
        "risk_tags": [(tag, risk_class(tag)) for tag in approval.risk_tags or []],
        "args_json": json.dumps(approval.proposed_args, indent=2, sort_keys=True, ensure_ascii=False),
        "approved_args_json": None if approval.effect.approved_args is None else
        json.dumps(approval.effect.approved_args, indent=2, sort_keys=True, ensure_ascii=False),
        "calls": calls,
        "tool_labels": labels.get(approval.tool_name, []),
        "earlier_reasoning": earlier,
        "current_reasoning": current_reasoning,
        "history": list(EffectTransition.objects.filter(effect_id=approval.effect_id)),
        "is_pending": approval.state == ApprovalRequest.State.PENDING,
        "next_pending": None if approval.state == ApprovalRequest.State.PENDING else next_pending(approval),
    }


def grants_of(org: Organization, limit: int = 200) -> list[Grant]:
    """The org's grants, newest first (live, expired and revoked: past decisions name them)."""
    return list(Grant.objects.for_org(org).select_related("agent")[:limit])


def next_pending(approval: ApprovalRequest) -> dict[str, Any] | None:
    """Once this request is decided: the most urgent other request still waiting in its org, so
    the reviewer goes on without the queue. One query, only on a decided request's page."""
    return (ApprovalRequest.objects.for_org(approval.org_id).pending().exclude(pk=approval.pk)
            .order_by("timeout_at", "id").values("id", "tool_name", "session__agent__name").first())


# ---------------------------------------------------------------- sessions


def sessions_of(org: Organization) -> QuerySet[Session]:
    return Session.objects.filter(org=org).select_related("agent")


SINCE_CHOICES = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7),
                 "30d": timedelta(days=30)}


@dataclass
class SessionListing:
    sessions: list[Session]
    agents: list[str]
    states: list[tuple[str, str]]
    filters: dict[str, str]
    since_choices: list[str]
    next_query: str | None
    errors: list[str] = field(default_factory=list)


def session_list(org: Organization, params: QueryDict) -> SessionListing:
    """Newest first, filtered by agent, state and age, 50 a page by keyset (`before`). Two queries."""
    agents = list(Agent.objects.for_org(org).order_by("name").values_list("name", flat=True))
    filters = {key: params.get(key, "").strip() for key in ("agent", "state", "since", "before")}
    errors: list[str] = []
    rows = sessions_of(org)
    if filters["agent"]:
        rows = rows.filter(agent__name=filters["agent"])
    if filters["state"]:
        if filters["state"] in Session.State.values:
            rows = rows.filter(state=filters["state"])
        else:
            errors.append(f"Unknown state {filters['state']!r}; showing every state.")
    if filters["since"]:
        if filters["since"] in SINCE_CHOICES:
            rows = rows.filter(created__gte=timezone.now() - SINCE_CHOICES[filters["since"]])
        else:
            errors.append(f"Unknown time range {filters['since']!r}; showing all.")
    cursor = _cursor(filters["before"])
    if cursor:
        rows = rows.filter(Q(created__lt=cursor[0]) | Q(created=cursor[0], id__lt=cursor[1]))
    found = list(rows.order_by("-created", "-id")[: SESSIONS_PAGE + 1])
    next_query = None
    if len(found) > SESSIONS_PAGE:
        found = found[:SESSIONS_PAGE]
        last = found[-1]
        query = params.copy()
        query["before"] = f"{last.created.isoformat()}|{last.id}"
        next_query = query.urlencode()
    return SessionListing(sessions=found, agents=agents, states=list(Session.State.choices), filters=filters,
                          since_choices=list(SINCE_CHOICES), next_query=next_query, errors=errors)


def _cursor(raw: str) -> tuple[dt.datetime, str] | None:
    created, _, pk = raw.partition("|")
    moment = parse_datetime(created) if created else None
    if moment is None or len(pk) != 36:
        return None
    return moment, pk


@dataclass
class TimelineItem:
    """One line of a session's timeline: a SAFE call, an effect, a refusal, or a savepoint (its
    name as `tool`: the step it marks, after that step's calls), at its step."""

    kind: str  # safe | effect | refusal | savepoint
    step_index: int
    at: dt.datetime
    tool: str
    tier: str
    state: str
    args_json: str
    result_json: str = ""
    error: str = ""
    transitions: list[EffectTransition] = field(default_factory=list)
    approval: ApprovalRequest | None = None
    refusal: Refusal | None = None
    reasoning: str = ""
    labels: list[str] = field(default_factory=list)  # the tool's, beside its tier


def session_context(session: Session) -> dict[str, Any]:
    """The timeline (effects with their transitions, SAFE calls, refusals and savepoints in
    place), the undo stack with attempts, the session's state history, its budget bars, and (one
    query) the labels of the tools it called."""
    effects = list(Effect.objects.for_session(session).order_by("-step_index", "-created")[:TIMELINE_LIMIT])
    ids = [effect.pk for effect in effects]
    transitions: dict[Any, list[EffectTransition]] = defaultdict(list)
    for row in EffectTransition.objects.filter(effect_id__in=ids).order_by("created", "id"):
        transitions[row.effect_id].append(row)
    approvals = {a.effect_id: a for a in ApprovalRequest.objects.filter(session=session)}
    items = [TimelineItem(kind="effect", step_index=e.step_index, at=e.created, tool=e.tool_name, tier=e.tier,
                          state=e.state, args_json=_json(e.args),
                          result_json=_json(e.result) if e.result is not None else "", error=e.error,
                          transitions=transitions[e.pk], approval=approvals.get(e.pk), reasoning=e.reasoning)
             for e in effects]
    items += [TimelineItem(kind="safe", step_index=s.step_index, at=s.created, tool=s.tool_name, tier="safe",
                           state="reported", args_json=_json(s.args))
              for s in SafeCall.objects.filter(session=session).order_by("-step_index")[:TIMELINE_LIMIT]]
    items += [TimelineItem(kind="refusal", step_index=r.step_index if r.step_index is not None else session.step_index,
                           at=r.created, tool=r.tool_name, tier="", state="refused", args_json=_json(r.args),
                           error=r.reason, refusal=r)
              for r in Refusal.objects.filter(org_id=session.org_id, session_id=session.pk)
              .exclude(kind=Refusal.Kind.APPROVAL)[:TIMELINE_LIMIT]]
    labels = tool_labels(session.org_id, {item.tool for item in items if item.kind != "refusal"})
    for item in items:
        if item.kind != "refusal":
            item.labels = labels.get(item.tool, [])
    items += [TimelineItem(kind="savepoint", step_index=p.step_index, at=p.created, tool=p.name, tier="",
                           state="", args_json="")
              for p in session.savepoints.order_by("-step_index")[:TIMELINE_LIMIT]]
    # A rejected or expired approval also writes a refusal row; the effect line already says it.
    # A savepoint marks its step once the step's calls are made: it comes after them.
    order = {"safe": 0, "effect": 1, "refusal": 2, "savepoint": 3}
    items.sort(key=lambda item: (item.step_index, order[item.kind], item.at))
    entries = list(UndoEntry.objects.filter(session=session).lifo().select_related("fn"))
    attempts: dict[Any, list[UndoAttempt]] = defaultdict(list)
    for attempt in UndoAttempt.objects.filter(entry__session=session).order_by("number"):
        attempts[attempt.entry_id].append(attempt)
    for entry in entries:
        entry.attempt_rows = attempts[entry.pk]
        entry.args_json = _json(entry.args)
        entry.waiting_for = entry.waiting_note(entry.fn)  # an agent-side undo: who it waits for
    open_entries = [entry for entry in entries if entry.state not in UndoEntry.TERMINAL]
    return {
        "session": session,
        "timeline": items,
        "truncated": len(effects) >= TIMELINE_LIMIT,
        "undo_stack": entries,
        "open_undo": open_entries,
        "state_history": list(SessionTransition.objects.filter(session=session)),
        "budget_bars": budget_bars(session),
        "is_open": session.state in Session.OPEN or session.state == Session.State.COMPENSATING,
        "can_fail": session.state in (Session.OPEN | {Session.State.HALTED}),
        "can_undo": session.state == Session.State.COMPLETED,
        # "Roll back to here" on a step (reviewers and admins: the template checks can_decide).
        # The states lifecycle.rewind accepts (approvals may not import lifecycle).
        "can_rewind": session.state in Session.OPEN,
        "rewinding": rewinding(session, entries),
        "rewinds": list(session.rewind_log.order_by("-epoch")),
    }


def rewinding(session: Session, entries: list[UndoEntry]) -> dict[str, Any] | None:
    """The rewind under way (its step, the undo entries it has left), as the API's
    `GET …/rewind` says it, from the undo stack already read: no query."""
    if session.rewind_to is None:
        return None
    left = sum(1 for e in entries if e.step_index > session.rewind_to and e.state in UndoEntry.OPEN)
    return {"to_step": session.rewind_to, "entries_left": left}


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


@dataclass
class Bar:
    label: str
    used: float
    limit: float | None

    @property
    def percent(self) -> int:
        if not self.limit:
            return 100 if self.limit == 0 and self.used else 0
        return min(100, round(self.used / self.limit * 100))

    @property
    def level(self) -> str:
        if self.limit is None:
            return "none"
        if self.limit == 0 or self.used >= self.limit:
            return "full"
        return "high" if self.percent >= 80 else "ok"


RUN_COUNTERS = (("tool calls (run)", "tool_calls", "max_tool_calls_per_run"),
                ("irreversible (run)", "irreversible_calls", "max_irreversible_per_run"),
                ("cost (run)", "cost", "max_cost_per_run"))


def budget_bars(session: Session) -> list[Bar]:
    """Used / limit for each run counter of the session, against the limits the guard applies
    to its agent now (its own policy, else the org default; the incident switch shows as 0). One query."""
    limits = Limits.for_agent(session.org_id, session.agent_id).values
    return [Bar(label, _number(getattr(session, counter)), _number(limits.get(name)))
            for label, counter, name in RUN_COUNTERS]


def _number(value: Any) -> float | None:
    if value is None:
        return None
    return float(value) if isinstance(value, Decimal) else value


# ---------------------------------------------------------------- agents


LIMIT_LABELS = (("max_tool_calls_per_run", "Tool calls per run", "1"),
                ("max_irreversible_per_run", "Irreversible per run", "1"),
                ("max_cost_per_run", "Cost per run", "0.01"),
                ("max_tool_calls_per_day", "Tool calls per day", "1"),
                ("max_irreversible_per_day", "Irreversible per day", "1"),
                ("max_cost_per_day", "Cost per day", "0.01"))
DAY_COUNTERS = (("tool calls", "tool_calls", "max_tool_calls_per_day"),
                ("irreversible", "irreversible_calls", "max_irreversible_per_day"),
                ("cost", "cost", "max_cost_per_day"))


def agents_context(org: Organization, now: dt.datetime | None = None, *, with_keys: bool = False,
                   only: str | None = None) -> dict[str, Any]:
    """Every agent with its state, today's counters, its limits and 7 days of runs against the cap.

    A fixed number of queries whatever the number of agents: the agents, the runs per day
    (grouped in the database, so 10,000 runs are one query, not 10,000 rows), the budget
    policies, today's counters and the ended runs the suggestion sizes from, the runs being
    walked back (a fleet rollback's progress); one more while an agent's own switch is on (the
    cap it had before, which turning the switch off restores), and one more for admins
    (`with_keys`: every agent's keys, which only admins manage). `only`: that agent alone (its page).
    """
    now = now or timezone.now()
    agents = Agent.objects.for_org(org).order_by("name")
    agents = list(agents.filter(name=only) if only is not None else agents)
    tz = org.tz
    days = [(now - timedelta(days=n)).astimezone(tz).date() for n in range(CHART_DAYS - 1, -1, -1)]
    per_day = _runs_per_day(org, now - timedelta(days=CHART_DAYS))
    budget, incident_on = _budgets_of(org, now, [agent.pk for agent in agents])
    keys: dict[Any, list[AgentKey]] = defaultdict(list)
    if with_keys:  # admins only: one query for every agent's keys, newest first
        for key in AgentKey.objects.filter(agent__org=org).order_by("-created", "-id"):
            keys[key.agent_id].append(key)
    walking = _walking_back(org)
    rows = []
    for agent in agents:
        mine = per_day.get(agent.pk, {})
        row = {"agent": agent,
               "runs_per_day": [{"date": day, "runs": mine.get(day, {}).get("runs", 0),
                                 "max_irreversible": mine.get(day, {}).get("max_irreversible") or 0,
                                 "max_cost": _number(mine.get(day, {}).get("max_cost")) or 0} for day in days]}
        row.update(budget(agent))
        row["keys"] = keys[agent.pk]
        row["rollback"] = walking.get(agent.pk, {"runs": 0, "entries_left": 0})
        rows.append(row)
    return {"agents": rows, "incident_on": incident_on}


ROLLBACKS_SHOWN = 10


def agent_page(org: Organization, name: str, now: dt.datetime | None = None) -> dict[str, Any] | None:
    """One agent's page (`/agents/<name>/`): its row as on the agents page, the fleet rollback
    control's defaults in the org's zone, and its last rollbacks with what each has left. None: no
    such agent in the org. The agents page's queries, plus two: the rollbacks, their progress."""
    now = now or timezone.now()
    context = agents_context(org, now, only=name)
    if not context["agents"]:
        return None
    row = context["agents"][0]
    local = now.astimezone(org.tz)
    events = list(Event.objects.filter(org=org, agent=row["agent"], kind="agent.rolled_back")
                  .order_by("-created", "-id")[:ROLLBACKS_SHOWN])
    left = _left_in([event.pk for event in events])
    rollbacks = [{"id": event.pk, "created": event.created, "since": parse_datetime(event.data.get("since", "")),
                  "by": event.data.get("by", ""), "reason": event.data.get("reason", ""),
                  "runs": event.data.get("runs", 0), "entries": event.data.get("entries", 0),
                  "left": left.get(event.pk, {"runs": 0, "entries_left": 0})} for event in events]
    return {**context, "row": row, "rollbacks": rollbacks, "zone": org.time_zone,
            "zone_offset": local.strftime("%z")[:3] + ":" + local.strftime("%z")[3:],
            "since_default": (local - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"),
            "since_max": local.strftime("%Y-%m-%dT%H:%M")}


def _left_in(rollback_ids: list[Any]) -> dict[Any, dict[str, int]]:
    """Per rollback: its runs still walking back and their open undo entries, in one query (the
    same numbers as `GET /api/v1/agents/{name}/rollbacks`' `in_progress`)."""
    if not rollback_ids:
        return {}
    rows = (UndoEntry.objects.filter(session__rolled_back_in__in=rollback_ids,
                                     session__state=Session.State.COMPENSATING).open()
            .values("session__rolled_back_in").annotate(runs=Count("session_id", distinct=True), entries=Count("id")))
    return {row["session__rolled_back_in"]: {"runs": row["runs"], "entries_left": row["entries"]} for row in rows}


def _walking_back(org: Organization) -> dict[Any, dict[str, int]]:
    """Per agent: its runs being walked back and the undo entries they have left, in one query
    (the same numbers as `GET /api/v1/agents/{name}/rollback`'s `in_progress`)."""
    rows = (UndoEntry.objects.filter(session__org=org, session__state=Session.State.COMPENSATING).open()
            .values("session__agent_id").annotate(runs=Count("session_id", distinct=True), entries=Count("id")))
    return {row["session__agent_id"]: {"runs": row["runs"], "entries_left": row["entries"]} for row in rows}


def _runs_per_day(org: Organization, since: dt.datetime) -> dict[Any, dict[dt.date, dict[str, Any]]]:
    """Runs per agent per day of the org's calendar (the day its daily budgets use)."""
    grouped: dict[Any, dict[dt.date, dict[str, Any]]] = defaultdict(dict)
    for row in (Session.objects.filter(org=org, created__gte=since)
                .annotate(day=TruncDate("created", tzinfo=org.tz)).values("agent_id", "day")
                .annotate(runs=Count("id"), max_irreversible=Max("irreversible_calls"), max_cost=Max("cost"))):
        grouped[row["agent_id"]][row["day"]] = row
    return grouped


def _budgets_of(org: Organization, now: dt.datetime, agent_ids: list[Any]):
    """A function giving each agent's budget part of the page, from six queries for all agents
    (seven while an agent's own switch is on), and whether the org's incident switch is on.
    Today's usage is true with or without a daily limit (`budgets.day_usage`: the day counters,
    and the effect log's calls of the day, weighted)."""
    policies = {policy.agent_id: policy for policy in BudgetPolicy.objects.filter(org=org)}
    default = policies.get(None)
    today = day_usage.today(org, agent_ids)
    healthy: dict[Any, dict[str, list]] = defaultdict(lambda: {"irreversible_calls": [], "cost": []})
    # The budgets app's suggestion (sizing.suggest), for all agents at once: just above the p95
    # of the runs that ended in the window completed and without a budget violation, and never
    # below the largest of them.
    for agent_id, irreversible, cost in (
            Session.objects.filter(org=org, created__gte=now - timedelta(days=sizing.WINDOW_DAYS),
                                   state=Session.State.COMPLETED, violation__isnull=True)
            .values_list("agent_id", "irreversible_calls", "cost")):
        healthy[agent_id]["irreversible_calls"].append(irreversible)
        healthy[agent_id]["cost"].append(cost)
    org_incident = bool(default and default.incident)
    stopped = [agent_id for agent_id, policy in policies.items()
               if agent_id is not None and policy.max_irreversible_per_run == 0]
    restore = _caps_before_switch(org, stopped)

    def budget(agent: Agent) -> dict[str, Any]:
        policy = policies.get(agent.pk) or default
        limits = {name: getattr(policy, name) if policy else None for name, _, _ in LIMIT_LABELS}
        used = today.get(agent.pk)
        suggested = {counter: _number(sizing.suggested_cap(values)) for counter, values in healthy[agent.pk].items()}
        irreversible_cap = 0 if org_incident else limits["max_irreversible_per_run"]
        return {
            "caps": {"irreversible": {"current": irreversible_cap, "suggested": suggested.get("irreversible_calls")},
                     "cost": {"current": _number(limits["max_cost_per_run"]), "suggested": suggested.get("cost")}},
            "today_bars": [Bar(label, _number(getattr(used, counter)) if used else 0, _number(limits[name]))
                           for label, counter, name in DAY_COUNTERS],
            "limit_fields": [{"name": name, "label": label, "step": step, "value": _number(limits[name])}
                             for name, label, step in LIMIT_LABELS],
            "source_label": ("its own policy" if agent.pk in policies else
                             "the organization's default" if default else "no budget policy yet"),
            "on_exceeded": policy.on_exceeded if policy else BudgetPolicy.OnExceeded.PAUSE,
            "on_exceeded_choices": list(BudgetPolicy.OnExceeded.values),
            "mode": policy.mode if policy else BudgetPolicy.Mode.ENFORCE,
            "mode_choices": list(BudgetPolicy.Mode.values),
            "incident": agent.pk in stopped,
            "restore_irreversible": restore.get(agent.pk),
        }

    return budget, org_incident


def _caps_before_switch(org: Organization, agent_ids: list[Any]) -> dict[Any, Any]:
    """For agents whose own switch is on (irreversible per run at 0): the cap they had before it
    went to 0, from the budget history (None: there was none). One query, only when needed."""
    if not agent_ids:
        return {}
    before: dict[Any, Any] = {}
    for agent_id, changes in (PolicyChange.objects.filter(org=org, agent_id__in=agent_ids)
                              .order_by("-created", "-id").values_list("agent_id", "changes")):
        change = (changes or {}).get("max_irreversible_per_run")
        if agent_id not in before and isinstance(change, list) and len(change) == 2 and change[1] == 0:
            before[agent_id] = change[0]  # the newest change that set it to 0
    return before


# ---------------------------------------------------------------- compensation failures


FAILURES_PAGE = 50


@dataclass
class FailureListing:
    entries: list[UndoEntry]
    next_query: str | None
    paged: bool  # an older page: the live refresh must keep the cursor


def compensation_failures(org: Organization, params: QueryDict | None = None) -> FailureListing:
    """Undo entries waiting for a person, longest-waiting last (newest first), 50 a page by keyset
    (`before` = the last row's updated|id), with their attempts. Two queries."""
    before = _cursor((params or {}).get("before", "").strip())
    rows = UndoEntry.objects.filter(session__org=org, state=UndoEntry.State.COMPENSATION_FAILED)
    if before:
        rows = rows.filter(Q(updated__lt=before[0]) | Q(updated=before[0], id__lt=before[1]))
    entries = list(rows.select_related("session__agent", "effect").prefetch_related("attempt_log")
                   .order_by("-updated", "-id")[: FAILURES_PAGE + 1])
    next_query = None
    if len(entries) > FAILURES_PAGE:
        entries = entries[:FAILURES_PAGE]
        last = entries[-1]
        query = params.copy() if params is not None else QueryDict(mutable=True)
        query.pop("part", None)
        query["before"] = f"{last.updated.isoformat()}|{last.id}"
        next_query = query.urlencode()
    for entry in entries:
        entry.args_json = _json(entry.args)
    return FailureListing(entries=entries, next_query=next_query, paged=before is not None)


# ---------------------------------------------------------------- settings


DURATION_UNITS = ((1, "seconds"), (60, "minutes"), (3600, "hours"), (86400, "days"))
# session.updated is a nudge for open pages, never sent to webhooks.
WEBHOOK_EVENTS = [kind for kind in EVENT_KINDS if kind != "session.updated"]


def duration(seconds: int) -> dict[str, int]:
    """The largest unit that shows the duration exactly: 900 s is 15 minutes, 90 s stays seconds."""
    unit = next(unit for unit, _ in reversed(DURATION_UNITS) if seconds % unit == 0)
    return {"amount": seconds // unit, "unit": unit}


def settings_context(org: Organization, *, with_webhooks: bool, slack_url: Callable[[Any], str]) -> dict[str, Any]:
    """The org's settings; its webhooks and signing secret for admins only (sensitive); its Slack
    connection (never the secrets) and its `slack_url(connection)` (see `slack.interactions_url`).
    Two queries."""
    webhooks = list(OrgWebhook.objects.for_org(org)) if with_webhooks else []
    slack = SlackConnection.objects.filter(org=org).first()
    return {"settings_org": org, "webhooks": webhooks, "show_webhooks": with_webhooks, "slack": slack,
            "slack_url": slack_url(slack) if slack else "",
            "slack_url_derived": not settings.UNDOLOG_PUBLIC_URL,
            "signing_secrets": org.signing_secrets() if with_webhooks else [],
            "timeout": duration(org.approval_timeout_s), "duration_units": DURATION_UNITS,
            "time_zones": time_zones(), "webhook_events": WEBHOOK_EVENTS}


@functools.cache
def time_zones() -> list[str]:
    """Every zone the server knows (what the settings API accepts), sorted; read once."""
    return sorted(zoneinfo.available_timezones())
