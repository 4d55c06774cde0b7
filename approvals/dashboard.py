"""What each dashboard page shows: the reads, scoped to one org, in a fixed number of queries.

Every function here takes the org (never a user's id or a URL's slug), so tenancy is decided
once, in the view's membership lookup. Query counts are pinned in tests/dashboard: no page
runs a query per row.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from html import escape
from typing import Any

from django.db.models import Count, Max, Q, QuerySet, TextField
from django.db.models.functions import Cast, Substr, TruncDate
from django.http import QueryDict
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.safestring import SafeString, mark_safe

from approvals.models import ApprovalRequest, OrgWebhook
from budgets import sizing
from budgets.models import BudgetPolicy, DayCounter, Limits, PolicyChange, Refusal
from effects.models import Effect, EffectTransition, SafeCall, Session, SessionTransition, UndoAttempt, UndoEntry
from orgs.models import Agent, Membership, Organization

QUEUE_LIMIT = 500
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
    return {"role": membership.role,
            "can_decide": membership.has_role(Membership.Role.REVIEWER),
            "is_admin": membership.has_role(Membership.Role.ADMIN)}


def frame(membership: Membership, nav_pending: int | None = None) -> dict[str, Any]:
    """The header, nav badge and incident banner: two queries (one when the page already
    counted the pending requests)."""
    org = membership.org
    flags = roles(membership)
    config = {"org": org.slug, **flags, "ws": f"/ws/dashboard/?org={org.slug}", "risk_classes": RISK_CLASSES}
    if nav_pending is None:
        nav_pending = ApprovalRequest.objects.for_org(org).pending().count()
    return {"org": org, "membership": membership, **flags, "dashboard_config": config,
            "nav_pending": nav_pending, "incident": incident(org)}


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
             '<td class="deadline"><time class="countdown" datetime="{deadline}">{left}</time> '
             '<small class="auto"{auto}>then auto-approved</small></td>'
             '<td class="tool"><a class="row-link" href="{url}">{tool}</a></td>'
             '<td class="agent">{agent}</td><td class="tags">{tags}</td>'
             '<td class="impact">{impact}</td><td class="reasoning">{reasoning}</td></tr>')
HIDDEN = mark_safe(" hidden")


def empty_queue_row() -> SafeString:
    return mark_safe(QUEUE_ROW.format(id="", deadline="", left="", auto=HIDDEN, url="", tool="", agent="", tags="",
                                      impact="", reasoning=""))


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
            reasoning=escape(self.reasoning)))


def first_line(text: str | None, limit: int = 200) -> str:
    line = (text or "").strip().splitlines()[0].strip() if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def pending_queue(org: Organization, limit: int = QUEUE_LIMIT) -> list[QueueRow]:
    """Pending requests, most urgent deadline first. One query: no JSON context, and only the
    start of the reasoning (it may be 20 000 characters; the row shows one line).

    The deadline comes back as text: Django's psycopg loader for timestamptz runs in Python
    (~20 µs a value, a fifth of this page's time at 500 rows); `fromisoformat` is C."""
    rows = (ApprovalRequest.objects.for_org(org).pending()
            .order_by("timeout_at", "created")
            .annotate(reasoning_head=Substr("effect__reasoning", 1, 400),
                      deadline=Cast("timeout_at", output_field=TextField()))
            .values_list("id", "tool_name", "session_id", "session__agent__name", "risk_tags", "estimated_impact",
                         "deadline", "reasoning_head", "auto_approve_on_timeout")[:limit])
    return [QueueRow(id=str(pk), tool=tool, agent=agent, session=str(session),
                     risk_tags=[(tag, risk_class(tag)) for tag in tags or []], estimated_impact=impact,
                     timeout_at=_moment(deadline), reasoning=first_line(reasoning), auto_approve_on_timeout=auto)
            for pk, tool, session, agent, tags, impact, deadline, reasoning, auto in rows]


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


def approval_context(approval: ApprovalRequest) -> dict[str, Any]:
    """The request, its args as readable JSON, the agent's context as a timeline, the effect's
    history. One query beyond the request itself."""
    context = approval.agent_context or {}
    reasoning = {step["step_index"]: step["text"] for step in context.get("reasoning", [])}
    calls = [{**call, "reasoning": reasoning.pop(call["step_index"], ""),
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
        "calls": calls,
        "earlier_reasoning": earlier,
        "current_reasoning": current_reasoning,
        "history": list(EffectTransition.objects.filter(effect_id=approval.effect_id)),
        "is_pending": approval.state == ApprovalRequest.State.PENDING,
    }


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
    """One line of a session's timeline: a SAFE call, an effect, or a refusal, at its step."""

    kind: str  # safe | effect | refusal
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


def session_context(session: Session) -> dict[str, Any]:
    """The timeline (effects with their transitions, SAFE calls, refusals in place), the undo
    stack with attempts, the session's state history and its budget bars. Eight queries."""
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
    # A rejected or expired approval also writes a refusal row; the effect line already says it.
    order = {"safe": 0, "effect": 1, "refusal": 2}
    items.sort(key=lambda item: (item.step_index, order[item.kind], item.at))
    entries = list(UndoEntry.objects.filter(session=session).lifo())
    attempts: dict[Any, list[UndoAttempt]] = defaultdict(list)
    for attempt in UndoAttempt.objects.filter(entry__session=session).order_by("number"):
        attempts[attempt.entry_id].append(attempt)
    for entry in entries:
        entry.attempt_rows = attempts[entry.pk]
        entry.args_json = _json(entry.args)
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
    }


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


def agents_context(org: Organization, now: dt.datetime | None = None) -> dict[str, Any]:
    """Every agent with its state, today's counters, its limits and 7 days of runs against the cap.

    A fixed number of queries whatever the number of agents: the agents, the runs per day
    (grouped in the database, so 10,000 runs are one query, not 10,000 rows), the budget
    policies, today's counters and the ended runs the suggestion sizes from; one more while an
    agent's own switch is on (the cap it had before, which turning the switch off restores).
    """
    now = now or timezone.now()
    agents = list(Agent.objects.for_org(org).order_by("name"))
    tz = org.tz
    days = [(now - timedelta(days=n)).astimezone(tz).date() for n in range(CHART_DAYS - 1, -1, -1)]
    per_day = _runs_per_day(org, now - timedelta(days=CHART_DAYS))
    budget, incident_on = _budgets_of(org, now)
    rows = []
    for agent in agents:
        mine = per_day.get(agent.pk, {})
        row = {"agent": agent,
               "runs_per_day": [{"date": day, "runs": mine.get(day, {}).get("runs", 0),
                                 "max_irreversible": mine.get(day, {}).get("max_irreversible") or 0,
                                 "max_cost": _number(mine.get(day, {}).get("max_cost")) or 0} for day in days]}
        row.update(budget(agent))
        rows.append(row)
    return {"agents": rows, "incident_on": incident_on}


def _runs_per_day(org: Organization, since: dt.datetime) -> dict[Any, dict[dt.date, dict[str, Any]]]:
    """Runs per agent per day of the org's calendar (the day its daily budgets use)."""
    grouped: dict[Any, dict[dt.date, dict[str, Any]]] = defaultdict(dict)
    for row in (Session.objects.filter(org=org, created__gte=since)
                .annotate(day=TruncDate("created", tzinfo=org.tz)).values("agent_id", "day")
                .annotate(runs=Count("id"), max_irreversible=Max("irreversible_calls"), max_cost=Max("cost"))):
        grouped[row["agent_id"]][row["day"]] = row
    return grouped


def _budgets_of(org: Organization, now: dt.datetime):
    """A function giving each agent's budget part of the page, from three queries for all agents
    (four while an agent's own switch is on), and whether the org's incident switch is on."""
    policies = {policy.agent_id: policy for policy in BudgetPolicy.objects.filter(org=org)}
    default = policies.get(None)
    today = {row.agent_id: row for row in DayCounter.objects.filter(org=org, day=org.today())}
    healthy: dict[Any, dict[str, list]] = defaultdict(lambda: {"irreversible_calls": [], "cost": []})
    # The budgets app's suggestion (sizing.suggest), for all agents at once: just above the p95
    # of the runs that ended in the window completed and without a budget violation.
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
        suggested = {counter: _number(sizing.just_above(sizing.percentile(sorted(values), 95)))
                     for counter, values in healthy[agent.pk].items()}
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


def compensation_failures(org: Organization) -> list[UndoEntry]:
    """Undo entries waiting for a person, newest first, with their attempts. Two queries."""
    entries = list(UndoEntry.objects.filter(session__org=org, state=UndoEntry.State.COMPENSATION_FAILED)
                   .select_related("session__agent", "effect").prefetch_related("attempt_log")
                   .order_by("-updated")[:200])
    for entry in entries:
        entry.args_json = _json(entry.args)
    return entries


# ---------------------------------------------------------------- settings


def settings_context(org: Organization, *, with_webhooks: bool) -> dict[str, Any]:
    """The org's settings; its webhooks for admins only (their URLs are sensitive). One query."""
    webhooks = list(OrgWebhook.objects.for_org(org)) if with_webhooks else []
    return {"settings_org": org, "webhooks": webhooks, "show_webhooks": with_webhooks}
