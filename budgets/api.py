"""REST API of budgets: limits, usage and what remains; the incident switch; agents' states;
the refusal and event streams; sizing help. Permissions: people read with `viewer`, change
budgets and the incident switch with `admin`, resume and suspend with `reviewer`; an agent
reads its own budget (another agent's is a 404 to it)."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from budgets import day_usage, sizing
from budgets.models import (
    DAY_LIMITS,
    LIMIT_FIELDS,
    RUN_LIMITS,
    TOOL_CAPS,
    BudgetPolicy,
    DayCounter,
    Limits,
    PolicyChange,
    Refusal,
    Usage,
    number,
)
from effects.models import Session, Tier, Tool
from orgs.auth import AgentPrincipal, caller_of, role_required
from orgs.models import Agent, Event, Organization
from undolog_site.errors import Conflict, Forbidden, Invalid, NotFound
from undolog_site.validation import StrictSerializer, validated

MAX_COUNT = 2**31 - 1
MAX_COST = Decimal("9999999999.9999")

# ---------------------------------------------------------------- permissions


def _is_member(request: Request, role: str) -> bool:
    return role_required(role)().has_permission(request, None)


class ReadViewerWriteAdmin(BasePermission):
    """People: viewer reads, admin writes. Agents: nothing."""

    message = "Reading needs the viewer role in the organization; changing it needs admin."

    def has_permission(self, request, view) -> bool:
        return _is_member(request, "viewer" if request.method in ("GET", "HEAD", "OPTIONS") else "admin")


class OwnBudgetOrReadViewerWriteAdmin(ReadViewerWriteAdmin):
    """As above, and an agent may read its own budget."""

    def has_permission(self, request, view) -> bool:
        if isinstance(request.user, AgentPrincipal):
            return request.method in ("GET", "HEAD", "OPTIONS")
        return super().has_permission(request, view)


class Reviewer(BasePermission):
    message = "This needs the reviewer role in the organization."

    def has_permission(self, request, view) -> bool:
        return _is_member(request, "reviewer")


# ---------------------------------------------------------------- lookups and bodies


def _agent(request: Request, name: str, *, lock: bool = False) -> Agent:
    """The caller's org's agent by name; to an agent key, only itself exists."""
    caller = caller_of(request)
    agents = Agent.objects.select_related("org").filter(org=caller.org, name=name)
    if caller.agent is not None:
        agents = agents.filter(pk=caller.agent.pk)
    if lock:
        # Serialises edits of one agent's policy (its first write copies the org default).
        agents = agents.select_for_update(of=("self",))
    agent = agents.first()
    if agent is None:
        raise NotFound(f"No agent named {name!r} in this organization.", code="agent_not_found")
    return agent


def _remaining(cap: Any, used: Any) -> Any:
    return None if cap is None else max(cap - used, 0)


def budget_body(agent: Agent, session: Session | None = None, *, latest: bool = True) -> dict[str, Any]:
    """Limits, usage and what remains: of `session`, or of the agent's latest run."""
    limits = Limits.for_agent(agent.org_id, agent.id)
    if session is None and latest:
        session = Session.objects.filter(agent=agent).order_by("-created").first()
    day = agent.org.today()
    run = Usage(session.tool_calls, session.irreversible_calls, session.cost) if session else Usage()
    today = day_usage.today(agent.org, [agent.pk])[agent.pk]  # true with or without a daily limit
    usage: dict[str, Any] = {}
    remaining: dict[str, Any] = {}
    for limits_of, used in ((RUN_LIMITS, run), (DAY_LIMITS, today)):
        for name, counter, key in limits_of:
            usage[key] = number(used.get(counter))
            remaining[key] = number(_remaining(limits.values[name], used.get(counter)))
    counts = session.tool_counts if session else {}
    tools = {tool: {"limit": cap, "used": counts.get(tool, 0), "remaining": _remaining(cap, counts.get(tool, 0))}
             for tool, cap in sorted(limits.tool_caps.items())}
    return {
        "agent": agent.name, "state": agent.state, "suspend_reason": agent.suspend_reason or None,
        "source": limits.source, "mode": limits.mode, "on_exceeded": limits.on_exceeded,
        "escalation_url": limits.escalation_url or None, "incident": limits.incident,
        "limits": limits.as_dict(), "policy": limits.policy.settings() if limits.policy else None,
        "usage": usage, "remaining": remaining, "tool_caps": tools,
        "session": ({"id": str(session.id), "state": session.state, "violation": session.violation}
                    if session else None),
        "day": day.isoformat(), "day_tracked": limits.tracks_day,
    }


def agent_dict(agent: Agent, today: Usage | DayCounter | None, source: str) -> dict[str, Any]:
    usage = today.usage() if isinstance(today, DayCounter) else today or Usage()
    return {"name": agent.name, "state": agent.state, "suspend_reason": agent.suspend_reason or None,
            "budget_source": source,
            "today": {"tool_calls": usage.tool_calls, "irreversible_calls": usage.irreversible_calls,
                      "cost": number(usage.cost)}}


# ---------------------------------------------------------------- validation


class Count(serializers.IntegerField):
    """A JSON integer: no strings, no booleans, no floats."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class Cost(serializers.DecimalField):
    """A JSON number with at most 4 decimals."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("invalid")
        return super().to_internal_value(data)


def _limit_field(name: str) -> serializers.Field:
    if name.startswith("max_cost"):
        return Cost(max_digits=14, decimal_places=4, min_value=Decimal(0), max_value=MAX_COST,
                    allow_null=True, required=False)
    return Count(min_value=0, max_value=MAX_COUNT, allow_null=True, required=False)


class PolicySerializer(StrictSerializer):
    """A partial budget: only the fields sent change. null removes a limit."""

    tool_caps_per_run = serializers.DictField(child=Count(min_value=0, max_value=MAX_COUNT), required=False,
                                              allow_empty=True)
    mode = serializers.ChoiceField(choices=BudgetPolicy.Mode.choices, required=False)
    on_exceeded = serializers.ChoiceField(choices=BudgetPolicy.OnExceeded.choices, required=False)
    escalation_url = serializers.CharField(max_length=500, allow_blank=True, allow_null=True, required=False)

    def get_fields(self):
        fields = super().get_fields()
        fields.update({name: _limit_field(name) for name in LIMIT_FIELDS})
        return fields

    def validate_tool_caps_per_run(self, caps: dict[str, int]) -> dict[str, int]:
        if len(caps) > 500:
            raise serializers.ValidationError("At most 500 per-tool caps.")
        tiers = dict(Tool.objects.for_org(self.context["org"]).filter(name__in=list(caps))
                     .values_list("name", "tier"))
        unknown = sorted(set(caps) - set(tiers))
        if unknown:
            raise serializers.ValidationError(f"Not registered in this organization: {', '.join(unknown)} "
                                              "(a misspelled name would cap nothing).")
        safe = sorted(name for name, tier in tiers.items() if tier == Tier.SAFE)
        if safe:
            raise serializers.ValidationError(f"SAFE tools are reported after they ran, so they cannot be "
                                              f"capped: {', '.join(safe)}.")
        return caps

    def validate_escalation_url(self, url: str | None) -> str:
        from approvals.webhooks import check_target

        url = (url or "").strip()
        problem = check_target(url) if url else None
        if problem:
            raise serializers.ValidationError(problem)
        return url


def _apply(policy: BudgetPolicy, changes: dict[str, Any], actor: str) -> None:
    """Save the changed settings and their history row; escalate needs somewhere to escalate to."""
    if not changes:
        raise Invalid({"non_field_errors": "Send at least one setting to change."},
                      "Send at least one setting to change.")
    before = policy.settings()
    for name, value in changes.items():
        setattr(policy, name, value)
    if policy.on_exceeded == BudgetPolicy.OnExceeded.ESCALATE and not policy.escalation_url:
        raise Invalid({"escalation_url": "Required while on_exceeded is escalate."},
                      "escalation_url: required while on_exceeded is escalate.")
    tracked_before = any(before[name] is not None for name, _, _ in DAY_LIMITS)
    policy.updated_by = actor
    policy.save()
    if not tracked_before and any(getattr(policy, name) is not None for name, _, _ in DAY_LIMITS):
        _catch_up(policy)
    after = policy.settings()
    diff = {name: [before[name], after[name]] for name in after if before[name] != after[name]}
    PolicyChange.objects.create(org_id=policy.org_id, agent_id=policy.agent_id, actor=actor, changes=diff)


def _catch_up(policy: BudgetPolicy) -> None:
    """A daily limit starts to apply: today's counters of the agents it governs start from what
    they already did today (the effect log), not from 0."""
    if policy.agent_id is not None:
        agents = [policy.agent_id]
    else:  # the org default governs the agents without a policy of their own
        own = BudgetPolicy.objects.filter(org_id=policy.org_id, agent__isnull=False).values("agent_id")
        agents = list(Agent.objects.filter(org_id=policy.org_id).exclude(pk__in=own).values_list("pk", flat=True))
    day_usage.catch_up(policy.org, agents)


def _org_default(org: Organization) -> BudgetPolicy:
    """The org default row, made on first use. Call with the org row locked."""
    policy = BudgetPolicy.objects.org_default(org).first()
    return policy or BudgetPolicy(org=org)


def _lock_org(request: Request) -> Organization:
    # Serialises edits of the org default (its first write creates the row).
    return Organization.objects.select_for_update().get(pk=caller_of(request).org.pk)


# ---------------------------------------------------------------- agents


class AgentsView(APIView):
    permission_classes = [ReadViewerWriteAdmin]

    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        """Every agent of the org with its state, where its budget comes from, and today's counters."""
        org = caller_of(request).org
        agents = list(Agent.objects.for_org(org).order_by("name"))
        days = day_usage.today(org, [agent.pk for agent in agents])
        policies = dict(BudgetPolicy.objects.filter(org=org).values_list("agent_id", "pk"))
        default = "org" if None in policies else "none"
        return Response({"day": org.today().isoformat(), "incident": _incident_on(org),
                         "agents": [agent_dict(a, days.get(a.pk), "agent" if a.pk in policies else default)
                                    for a in agents]})


class AgentBudgetView(APIView):
    permission_classes = [OwnBudgetOrReadViewerWriteAdmin]

    @extend_schema(responses={200: dict})
    def get(self, request: Request, name: str) -> Response:
        return Response(budget_body(_agent(request, name)))

    @extend_schema(request=PolicySerializer, responses={200: dict})
    def patch(self, request: Request, name: str) -> Response:
        """Change the agent's limits, from its next call on. Its first change starts from the org default."""
        org = caller_of(request).org
        with transaction.atomic():
            agent = _agent(request, name, lock=True)
            changes = validated(PolicySerializer, request.data, org=org)
            policy = BudgetPolicy.objects.filter(agent=agent).first()
            if policy is None:
                default = BudgetPolicy.objects.org_default(org).first()
                policy = default.copy_for(agent) if default else BudgetPolicy(org=org, agent=agent)
            _apply(policy, changes, caller_of(request).label)
        return Response(budget_body(agent))

    @extend_schema(request=None, responses={200: dict})
    def delete(self, request: Request, name: str) -> Response:
        """Drop the agent's own policy: the org default applies from its next call on."""
        with transaction.atomic():
            agent = _agent(request, name, lock=True)
            deleted, _ = BudgetPolicy.objects.filter(agent=agent).delete()
            if deleted:
                PolicyChange.objects.create(org_id=agent.org_id, agent=agent, actor=caller_of(request).label,
                                            changes={"source": ["agent", "org"]})
        return Response(budget_body(agent))


class SessionBudgetView(APIView):
    permission_classes = [OwnBudgetOrReadViewerWriteAdmin]

    @extend_schema(responses={200: dict})
    def get(self, request: Request, pk: str) -> Response:
        caller = caller_of(request)
        sessions = Session.objects.select_related("agent__org").filter(org=caller.org, pk=pk)
        if caller.agent is not None:
            sessions = sessions.filter(agent=caller.agent)
        session = sessions.first()
        if session is None:
            raise NotFound("No such session.", code="session_not_found")
        return Response(budget_body(session.agent, session))


class SuggestView(APIView):
    permission_classes = [OwnBudgetOrReadViewerWriteAdmin]

    @extend_schema(responses={200: dict})
    def get(self, request: Request, name: str) -> Response:
        return Response(sizing.suggest(_agent(request, name)))


class NoteSerializer(StrictSerializer):
    note = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class ResumeView(APIView):
    permission_classes = [Reviewer]

    @extend_schema(request=NoteSerializer, responses={200: dict})
    def post(self, request: Request, name: str) -> Response:
        """Back to active. Its next run starts with fresh run counters; today's counters stay."""
        data = validated(NoteSerializer, request.data or {})
        caller = caller_of(request)
        with transaction.atomic():
            agent = _agent(request, name, lock=True)
            before, reason = agent.state, agent.suspend_reason
            if before == Agent.State.STOPPED and not caller.has_role("admin"):
                raise Forbidden("A stopped agent can only be resumed by an admin.")
            if not agent.resume():
                raise Conflict(f"The agent {agent.name} is {agent.state}; there is nothing to resume.",
                               code="agent_not_suspended", state=agent.state)
            Event.record(agent.org, "agent.resumed", agent=agent, by=caller.label, previous_state=before,
                         previous_reason=reason or None, note=data["note"])
        return Response({"agent": _agent_with_today(agent)})


class SuspendView(APIView):
    permission_classes = [Reviewer]

    @extend_schema(request=NoteSerializer, responses={200: dict})
    def post(self, request: Request, name: str) -> Response:
        """Suspend by hand: new sessions and calls answer 423 until someone resumes it."""
        data = validated(NoteSerializer, request.data or {})
        caller = caller_of(request)
        with transaction.atomic():
            agent = _agent(request, name, lock=True)
            if not agent.suspend(Agent.SuspendReason.MANUAL):
                raise Conflict(f"The agent {agent.name} is {agent.state}; only an active agent can be suspended.",
                               code="agent_not_active", state=agent.state)
            Event.record(agent.org, "agent.suspended", agent=agent, reason=Agent.SuspendReason.MANUAL,
                         by=caller.label, note=data["note"])
        return Response({"agent": _agent_with_today(agent)})


def _agent_with_today(agent: Agent) -> dict[str, Any]:
    today = day_usage.today(agent.org, [agent.pk])[agent.pk]
    return agent_dict(agent, today, Limits.for_agent(agent.org_id, agent.id).source)


# ---------------------------------------------------------------- the org


class OrgBudgetView(APIView):
    permission_classes = [ReadViewerWriteAdmin]

    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        return Response(_org_body(caller_of(request).org))

    @extend_schema(request=PolicySerializer, responses={200: dict})
    def patch(self, request: Request) -> Response:
        """The default for agents without their own policy, from their next call on."""
        with transaction.atomic():
            org = _lock_org(request)
            changes = validated(PolicySerializer, request.data, org=org)
            _apply(_org_default(org), changes, caller_of(request).label)
        return Response(_org_body(org))


def _org_body(org: Organization) -> dict[str, Any]:
    policy = BudgetPolicy.objects.org_default(org).first() or BudgetPolicy(org=org)
    own = BudgetPolicy.objects.filter(org=org, agent__isnull=False).count()
    return {**policy.settings(), "limits": {name: number(getattr(policy, name)) for name in LIMIT_FIELDS}
            | {TOOL_CAPS: dict(policy.tool_caps_per_run)},
            "incident": _incident_body(policy), "agents_with_own_policy": own}


def _incident_on(org: Organization) -> bool:
    return BudgetPolicy.objects.org_default(org).filter(incident=True).exists()


def _incident_body(policy: BudgetPolicy | None) -> dict[str, Any]:
    on = bool(policy and policy.incident)
    changed_at = policy.incident_changed_at if policy else None
    return {"on": on, "changed_at": changed_at.isoformat() if changed_at else None,
            "changed_by": (policy.incident_changed_by or None) if policy else None,
            "effect": "every agent of the org at 0 irreversible calls" if on else None}


class IncidentSerializer(StrictSerializer):
    on = serializers.BooleanField()

    def to_internal_value(self, data):
        if isinstance(data, dict) and "on" in data and not isinstance(data["on"], bool):
            raise serializers.ValidationError({"on": ["Must be true or false."]})
        return super().to_internal_value(data)


class IncidentView(APIView):
    permission_classes = [ReadViewerWriteAdmin]

    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        return Response(_incident_body(BudgetPolicy.objects.org_default(caller_of(request).org).first()))

    @extend_schema(request=IncidentSerializer, responses={200: dict})
    def post(self, request: Request) -> Response:
        """On: every agent of the org, new ones included, is refused every irreversible call from its
        next call on, whatever its own limits; off: their own limits apply again, untouched."""
        on = validated(IncidentSerializer, request.data)["on"]
        actor = caller_of(request).label
        with transaction.atomic():
            org = _lock_org(request)
            policy = _org_default(org)
            changed = policy.incident != on
            if changed:
                policy.incident, policy.incident_changed_at, policy.incident_changed_by = on, timezone.now(), actor
                policy.save()
                PolicyChange.objects.create(org=org, actor=actor, changes={"incident": [not on, on]})
                Event.record(org, "incident.changed", on=on, by=actor,
                             agents=Agent.objects.for_org(org).count())
        return Response({**_incident_body(policy), "changed": changed})


# ---------------------------------------------------------------- refusals and events

PAGE_SIZE, MAX_PAGE_SIZE = 50, 200


def _bad(name: str, message: str) -> Invalid:
    return Invalid({name: message}, f"{name}: {message}")


def _moment(request: Request, name: str) -> dt.datetime | None:
    raw = request.query_params.get(name)
    if not raw:
        return None
    try:
        value = parse_datetime(raw)
    except ValueError:
        value = None
    if value is None:
        raise _bad(name, "Must be an ISO 8601 date and time, like 2026-01-31T08:00:00Z.")
    return value if timezone.is_aware(value) else timezone.make_aware(value, dt.UTC)


def _uuid(request: Request, name: str) -> uuid.UUID | None:
    raw = request.query_params.get(name)
    if not raw:
        return None
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise _bad(name, "Must be a UUID.")


def _filtered(request: Request, rows: QuerySet, allowed: set[str]) -> QuerySet:
    """The filters both streams share; unknown parameters are an error, not silently ignored."""
    unknown = sorted(set(request.query_params) - allowed - {"cursor", "page_size"})
    if unknown:
        raise Invalid(dict.fromkeys(unknown, "Unknown filter."), f"Unknown filter: {', '.join(unknown)}.")
    params = request.query_params
    if params.get("agent"):
        rows = rows.filter(agent__name=params["agent"])
    session = _uuid(request, "session")
    if session:
        rows = rows.filter(session_id=session)
    since, until = _moment(request, "since"), _moment(request, "until")
    if since:
        rows = rows.filter(created__gte=since)
    if until:
        rows = rows.filter(created__lt=until)
    return rows


def _page(request: Request, rows: QuerySet, key: str) -> Response:
    """Newest first, by keyset (created, id): stable while new rows keep arriving."""
    raw_size = request.query_params.get("page_size") or str(PAGE_SIZE)
    if not raw_size.isdigit() or not 1 <= int(raw_size) <= MAX_PAGE_SIZE:
        raise _bad("page_size", f"Must be a whole number from 1 to {MAX_PAGE_SIZE}.")
    size = int(raw_size)
    cursor = request.query_params.get("cursor")
    if cursor:
        created, pk = _decode_cursor(cursor)
        rows = rows.filter(Q(created__lt=created) | Q(created=created, pk__lt=pk))
    found = list(rows.order_by("-created", "-pk")[: size + 1])
    more, found = len(found) > size, found[:size]
    next_cursor = _encode_cursor(found[-1]) if more else None
    next_url = replace_query_param(request.build_absolute_uri(), "cursor", next_cursor) if next_cursor else None
    return Response({key: [row.as_dict() for row in found], "next_cursor": next_cursor, "next": next_url})


def _encode_cursor(row: Any) -> str:
    return base64.urlsafe_b64encode(f"{row.created.isoformat()}|{row.pk}".encode()).decode()


def _decode_cursor(cursor: str) -> tuple[dt.datetime, uuid.UUID]:
    try:
        created, pk = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        moment = dt.datetime.fromisoformat(created)
        return moment, uuid.UUID(pk)
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise _bad("cursor", "Not a cursor this API gave out: follow `next` from the previous page.")


REFUSAL_FILTERS = {"kind", "agent", "session", "since", "until", "tool", "limit", "observed"}
EVENT_FILTERS = {"kind", "agent", "session", "since", "until"}


class RefusalsView(APIView):
    permission_classes = [ReadViewerWriteAdmin]

    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        """Calls not let through (and, observed, those observe mode let through), newest first."""
        rows = _filtered(request, Refusal.objects.for_org(caller_of(request).org).select_related("agent"),
                         REFUSAL_FILTERS)
        params = request.query_params
        kind = params.get("kind")
        if kind:
            if kind not in Refusal.Kind.values:
                raise _bad("kind", f"One of {', '.join(Refusal.Kind.values)}.")
            rows = rows.filter(kind=kind)
        if params.get("tool"):
            rows = rows.filter(tool_name=params["tool"])
        if params.get("limit"):
            rows = rows.filter(limit=params["limit"])
        observed = params.get("observed")
        if observed:
            if observed not in ("true", "false"):
                raise _bad("observed", "Must be true or false.")
            rows = rows.filter(observed=observed == "true")
        return _page(request, rows, "refusals")


class EventsView(APIView):
    permission_classes = [ReadViewerWriteAdmin]

    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        """The org's audit stream, newest first."""
        rows = _filtered(request, Event.objects.for_org(caller_of(request).org).select_related("agent"),
                         EVENT_FILTERS)
        kind = request.query_params.get("kind")
        if kind:
            rows = rows.filter(kind=kind)
        return _page(request, rows, "events")

