"""REST API of budgets: limits, usage and what remains; the incident switch; agents' states;
the refusal and event streams; sizing help. Permissions: people read with `viewer`, change
budgets and the incident switch with `admin`, resume and suspend with `reviewer`; an agent
reads its own budget (another agent's is a 404 to it). The rules live in `policies.py`
(edits and the incident switch), `agent_states.py` (resume, suspend) and `bodies.py` (what
a budget looks like); these views validate, look up in the caller's org, call, answer."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

from django.core.validators import validate_slug
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from budgets import agent_states, policies, shapes, sizing
from budgets.bodies import agent_dict, agent_with_today, agents_body, budget_body, incident_body, org_body
from budgets.models import LIMIT_FIELDS, BudgetPolicy, Limits, Refusal
from core.errors import Conflict, Invalid
from core.outbound import check_target
from core.pagination import NewestFirst, bad
from core.schema import errors, ok
from core.validation import StrictSerializer, StringField, validated
from effects.models import Session, Tier, Tool
from orgs.auth import IsReviewer, OwnBudgetOrReadViewerWriteAdmin, ReadViewerWriteAdmin
from orgs.models import Agent, Event
from orgs.views import OrgScopedAPIView

MAX_COUNT = 2**31 - 1
MAX_COST = Decimal("9999999999.9999")


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
        url = (url or "").strip()
        problem = check_target(url) if url else None
        if problem:
            raise serializers.ValidationError(problem)
        return url


REFUSAL_FILTERS = {"kind", "agent", "session", "since", "until", "tool", "limit", "observed"}
EVENT_FILTERS = {"kind", "agent", "session", "since", "until"}


# ---------------------------------------------------------------- agents


AGENT_404 = errors(404, codes={404: ["agent_not_found"]})
STREAM_PARAMETERS = [
    OpenApiParameter("agent", str, description="Only this agent's rows."),
    OpenApiParameter("session", str, description="Only this session's rows (a UUID)."),
    OpenApiParameter("since", str, description="ISO 8601; rows created at or after it."),
    OpenApiParameter("until", str, description="ISO 8601; rows created before it."),
    OpenApiParameter("cursor", str, description="`next_cursor` of the previous page."),
    OpenApiParameter("page_size", int, description="1 to 200 (default 50)."),
]


class AgentScoped(OrgScopedAPIView):
    """An agent of the caller's org by name; to an agent key, only itself exists."""

    queryset = Agent.objects.select_related("org")
    lookup_field = "name"
    lookup_is_uuid = False
    permission_classes = [OwnBudgetOrReadViewerWriteAdmin]

    def scope(self, queryset, caller):
        agents = queryset.filter(org=caller.org)
        return agents.filter(pk=caller.agent.pk) if caller.agent is not None else agents

    not_found = ("agent_not_found", "No agent named {value!r} in this organization.")


class AgentSerializer(StrictSerializer):
    # A slug: it is a URL segment of every agent endpoint. StringField, so 7 is refused, not "7".
    name = StringField(max_length=100, validators=[validate_slug])


class AgentsView(OrgScopedAPIView):
    """GET as before (budgets: every agent with today's counters); POST creates one (admin)."""

    permission_classes = [ReadViewerWriteAdmin]

    @extend_schema(summary="List the org's agents with their states and today's counters", tags=["agents"],
                   responses=ok(shapes.AgentsDict))
    def get(self, request: Request) -> Response:
        """Every agent of the org with its state, where its budget comes from, and today's counters."""
        return Response(agents_body(self.org))

    @extend_schema(summary="Create an agent", tags=["agents"], request=AgentSerializer,
                   responses={**ok(shapes.AgentBodyDict, 201), **errors(409, codes={409: ["agent_exists"]})})
    def post(self, request: Request) -> Response:
        data = validated(AgentSerializer, request.data)
        try:
            with transaction.atomic():
                agent = Agent.objects.create(org=self.org, name=data["name"])
        except IntegrityError:
            raise Conflict(f"There is already an agent named {data['name']!r}.", code="agent_exists") from None
        agent.org = self.org
        source = Limits.for_agent(self.org.pk, agent.pk).source
        return Response({"agent": agent_dict(agent, None, source)}, status=201)


class AgentBudgetView(AgentScoped):
    @extend_schema(summary="Read an agent's budget: limits, usage, what remains", tags=["budgets"],
                   responses={**ok(shapes.BudgetDict), **AGENT_404})
    def get(self, request: Request, name: str) -> Response:
        return Response(budget_body(self.get_object()))

    @extend_schema(summary="Change an agent's budget (admins)", tags=["budgets"], request=PolicySerializer,
                   responses={**ok(shapes.BudgetDict), **AGENT_404})
    def patch(self, request: Request, name: str) -> Response:
        """Change the agent's limits, from its next call on. Its first change starts from the org default."""
        agent = self.get_object()
        changes = validated(PolicySerializer, request.data, org=self.org)
        policies.edit_agent_policy(agent, changes, self.caller.label)
        return Response(budget_body(agent))

    @extend_schema(summary="Drop an agent's own budget: the org default applies (admins)", tags=["budgets"],
                   request=None, responses={**ok(shapes.BudgetDict), **AGENT_404})
    def delete(self, request: Request, name: str) -> Response:
        """Drop the agent's own policy: the org default applies from its next call on."""
        agent = self.get_object()
        policies.drop_agent_policy(agent, self.caller.label)
        return Response(budget_body(agent))


class SessionBudgetView(OrgScopedAPIView):
    queryset = Session.objects.select_related("agent__org")
    not_found = ("session_not_found", "No such session.")
    permission_classes = [OwnBudgetOrReadViewerWriteAdmin]

    def scope(self, queryset, caller):
        sessions = queryset.filter(org=caller.org)
        return sessions.filter(agent=caller.agent) if caller.agent is not None else sessions

    @extend_schema(summary="Read a session's budget", tags=["budgets"],
                   responses={**ok(shapes.BudgetDict), **errors(404, codes={404: ["session_not_found"]})})
    def get(self, request: Request, pk: str) -> Response:
        session = self.get_object()
        return Response(budget_body(session.agent, session))


class SuggestView(AgentScoped):
    @extend_schema(summary="Suggest budget caps from the last 7 days of runs", tags=["budgets"],
                   responses={**ok(shapes.SuggestDict), **AGENT_404})
    def get(self, request: Request, name: str) -> Response:
        return Response(sizing.suggest(self.get_object()))


class NoteSerializer(StrictSerializer):
    note = StringField(max_length=2000, required=False, allow_blank=True, default="")


class ResumeView(AgentScoped):
    permission_classes = [IsReviewer]

    @extend_schema(summary="Resume a suspended (or, admins, stopped) agent", tags=["agents"], request=NoteSerializer,
                   responses={**ok(shapes.AgentBodyDict), **errors(404, 409, codes={
                       404: ["agent_not_found"], 409: ["agent_not_suspended"]})})
    def post(self, request: Request, name: str) -> Response:
        """Back to active. Its next run starts with fresh run counters; today's counters stay."""
        data = validated(NoteSerializer, request.data or {})
        agent = agent_states.resume(self.get_object(), by=self.caller, note=data["note"])
        return Response({"agent": agent_with_today(agent)})


class SuspendView(AgentScoped):
    permission_classes = [IsReviewer]

    @extend_schema(summary="Suspend an agent by hand", tags=["agents"], request=NoteSerializer,
                   responses={**ok(shapes.AgentBodyDict), **errors(404, 409, codes={
                       404: ["agent_not_found"], 409: ["agent_not_active"]})})
    def post(self, request: Request, name: str) -> Response:
        """Suspend by hand: new sessions and calls answer 423 until someone resumes it."""
        data = validated(NoteSerializer, request.data or {})
        agent = agent_states.suspend(self.get_object(), by=self.caller, note=data["note"])
        return Response({"agent": agent_with_today(agent)})


# ---------------------------------------------------------------- the org


class OrgBudgetView(OrgScopedAPIView):
    permission_classes = [ReadViewerWriteAdmin]

    @extend_schema(summary="Read the org's default budget", tags=["budgets"], responses=ok(shapes.OrgBudgetDict))
    def get(self, request: Request) -> Response:
        return Response(org_body(self.org))

    @extend_schema(summary="Change the org's default budget (admins)", tags=["budgets"], request=PolicySerializer,
                   responses=ok(shapes.OrgBudgetDict))
    def patch(self, request: Request) -> Response:
        """The default for agents without their own policy, from their next call on."""
        changes = validated(PolicySerializer, request.data, org=self.org)
        policies.edit_org_default(self.org, changes, self.caller.label)
        return Response(org_body(self.org))


class IncidentSerializer(StrictSerializer):
    on = serializers.BooleanField()

    def to_internal_value(self, data):
        if isinstance(data, dict) and "on" in data and not isinstance(data["on"], bool):
            raise serializers.ValidationError({"on": ["Must be true or false."]})
        return super().to_internal_value(data)


class IncidentView(OrgScopedAPIView):
    permission_classes = [ReadViewerWriteAdmin]

    @extend_schema(summary="Read the incident switch", tags=["incident"], responses=ok(shapes.IncidentDict))
    def get(self, request: Request) -> Response:
        return Response(incident_body(BudgetPolicy.objects.org_default(self.org).first()))

    @extend_schema(summary="Switch the incident mode on or off (admins)", tags=["incident"],
                   request=IncidentSerializer, responses=ok(shapes.IncidentSwitchDict))
    def post(self, request: Request) -> Response:
        """On: every agent of the org, new ones included, is refused every irreversible call from its
        next call on, whatever its own limits; off: their own limits apply again, untouched."""
        on = validated(IncidentSerializer, request.data)["on"]
        policy, changed = policies.switch_incident(self.org, on, self.caller.label)
        return Response({**incident_body(policy), "changed": changed})


# ---------------------------------------------------------------- refusals and events


def moment(request: Request, name: str) -> dt.datetime | None:
    """The query parameter `name` as an aware datetime (ISO 8601, a naive one read as UTC), None when
    absent; 400 when it is not one."""
    raw = request.query_params.get(name)
    if not raw:
        return None
    try:
        value = parse_datetime(raw)
    except ValueError:
        value = None
    if value is None:
        raise bad(name, "Must be an ISO 8601 date and time, like 2026-01-31T08:00:00Z.")
    return value if timezone.is_aware(value) else timezone.make_aware(value, dt.UTC)


def _uuid(request: Request, name: str) -> uuid.UUID | None:
    raw = request.query_params.get(name)
    if not raw:
        return None
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise bad(name, "Must be a UUID.") from None


class StreamView(OrgScopedAPIView):
    """A stream of the org's rows, newest first, by cursor; the filters both streams share.
    Unknown parameters are an error, not silently ignored."""

    permission_classes = [ReadViewerWriteAdmin]
    filters: set[str] = set()
    items_key = ""

    def filtered(self, rows: QuerySet) -> QuerySet:
        params = self.request.query_params
        unknown = sorted(set(params) - self.filters - {"cursor", "page_size"})
        if unknown:
            raise Invalid(dict.fromkeys(unknown, "Unknown filter."), f"Unknown filter: {', '.join(unknown)}.")
        if params.get("agent"):
            rows = rows.filter(agent__name=params["agent"])
        session = _uuid(self.request, "session")
        if session:
            rows = rows.filter(session_id=session)
        since, until = moment(self.request, "since"), moment(self.request, "until")
        if since:
            rows = rows.filter(created__gte=since)
        if until:
            rows = rows.filter(created__lt=until)
        return rows

    def page(self, rows: QuerySet) -> Response:
        paginator = NewestFirst(self.items_key)
        found = paginator.paginate_queryset(rows, self.request, view=self)
        return paginator.get_paginated_response([row.as_dict() for row in found])


class RefusalsView(StreamView):
    queryset = Refusal.objects.select_related("agent")
    filters = REFUSAL_FILTERS
    items_key = "refusals"

    @extend_schema(summary="The refusal stream, newest first", tags=["streams"], responses=ok(shapes.RefusalPageDict),
                   parameters=[*STREAM_PARAMETERS, OpenApiParameter("kind", str, enum=list(Refusal.Kind.values)),
                               OpenApiParameter("tool", str), OpenApiParameter("limit", str),
                               OpenApiParameter("observed", bool)])
    def get(self, request: Request) -> Response:
        """Calls not let through (and, observed, those observe mode let through), newest first."""
        rows = self.filtered(self.get_queryset())
        params = request.query_params
        kind = params.get("kind")
        if kind:
            if kind not in Refusal.Kind.values:
                raise bad("kind", f"One of {', '.join(Refusal.Kind.values)}.")
            rows = rows.filter(kind=kind)
        if params.get("tool"):
            rows = rows.filter(tool_name=params["tool"])
        if params.get("limit"):
            rows = rows.filter(limit=params["limit"])
        observed = params.get("observed")
        if observed:
            if observed not in ("true", "false"):
                raise bad("observed", "Must be true or false.")
            rows = rows.filter(observed=observed == "true")
        return self.page(rows)


class EventsView(StreamView):
    queryset = Event.objects.select_related("agent")
    filters = EVENT_FILTERS
    items_key = "events"

    @extend_schema(summary="The org's audit stream, newest first", tags=["streams"], responses=ok(shapes.EventPageDict),
                   parameters=[*STREAM_PARAMETERS, OpenApiParameter("kind", str)])
    def get(self, request: Request) -> Response:
        """The org's audit stream, newest first."""
        rows = self.filtered(self.get_queryset())
        kind = request.query_params.get("kind")
        if kind:
            rows = rows.filter(kind=kind)
        return self.page(rows)
