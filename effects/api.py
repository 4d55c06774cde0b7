"""REST API of the registry, sessions and effects (DESIGN.md's API contract)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.viewsets import ViewSet

from effects import claims, fastpath, longpoll
from effects import intercept as pipeline
from effects.models import (
    CompensationFunction,
    Effect,
    Session,
    Tier,
    Tool,
    UndoEntry,
    validate_semver,
)
from orgs.auth import IsAgent, IsAgentOrMember, caller_of, role_required
from orgs.models import Agent
from undolog_site.errors import DomainError, Invalid, NotFound
from undolog_site.validation import StrictSerializer, StringField, validated


def semver(value: str) -> str:
    try:
        validate_semver(value)
    except Exception as exc:  # ValidationError from Django; DRF wants its own
        raise serializers.ValidationError(str(exc.messages[0] if hasattr(exc, "messages") else exc)) from None
    return value


class IsAgentOrAdmin(IsAgentOrMember):
    """Agents of the org may register their own tools; people need the admin role."""

    def has_permission(self, request, view) -> bool:
        if request.method in ("GET", "HEAD", "OPTIONS"):
            return super().has_permission(request, view)
        return IsAgent().has_permission(request, view) or role_required("admin")().has_permission(request, view)


# ---------------------------------------------------------------- compensation registry


class CompensationSerializer(StrictSerializer):
    fn_name = serializers.RegexField(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,99}$")
    fn_version = StringField(max_length=64, validators=[semver])
    handler = serializers.ChoiceField(choices=CompensationFunction.Handler.choices)
    target = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
    timeout_ms = serializers.IntegerField(min_value=100, max_value=120_000, default=5000)
    claim_timeout_s = serializers.IntegerField(min_value=1, max_value=30 * 86400, default=3600)
    description = serializers.CharField(required=False, allow_blank=True, default="")

    def validate(self, attrs: dict) -> dict:
        from approvals.webhooks import check_target  # SSRF rule lives with the deliverer

        if attrs["handler"] == CompensationFunction.Handler.AGENT:
            if attrs["target"]:
                raise serializers.ValidationError({"target": ["An agent handler has no target: the agent side "
                                                              "claims its entries (POST /undo-entries/claim)."]})
        elif not attrs["target"].strip():
            raise serializers.ValidationError({"target": ["A webhook URL or a dotted path is required."]})
        elif attrs["handler"] == CompensationFunction.Handler.WEBHOOK:
            problem = check_target(attrs["target"])
            if problem:
                raise serializers.ValidationError({"target": [problem]})
        elif not all(part.isidentifier() for part in attrs["target"].split(".")) or "." not in attrs["target"]:
            raise serializers.ValidationError({"target": ["A dotted path to a callable, like pkg.module.undo."]})
        return attrs


def compensation_dict(fn: CompensationFunction) -> dict[str, Any]:
    return {"id": fn.pk, "fn_name": fn.fn_name, "fn_version": fn.fn_version, "handler": fn.handler,
            "target": fn.target, "timeout_ms": fn.timeout_ms, "claim_timeout_s": fn.claim_timeout_s,
            "description": fn.description}


class CompensationsView(APIView):
    permission_classes = [IsAgentOrAdmin]

    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        fns = CompensationFunction.objects.filter(org=caller_of(request).org)
        return Response({"compensations": [compensation_dict(fn) for fn in fns]})

    @extend_schema(request=CompensationSerializer, responses={201: dict, 200: dict})
    def post(self, request: Request) -> Response:
        data = validated(CompensationSerializer, request.data)
        fn, created = CompensationFunction.objects.update_or_create(
            org=caller_of(request).org, fn_name=data["fn_name"], fn_version=data["fn_version"],
            defaults={k: data[k] for k in ("handler", "target", "timeout_ms", "claim_timeout_s", "description")},
        )
        return Response(compensation_dict(fn), status=201 if created else 200)


# ---------------------------------------------------------------- tools


class CompensationDescriptorSerializer(StrictSerializer):
    fn_name = StringField(max_length=100)
    fn_version = StringField(max_length=64, validators=[semver])
    args = serializers.DictField(required=False, default=dict)
    max_retries = serializers.IntegerField(min_value=0, max_value=20, default=3)
    retry_backoff_ms = serializers.IntegerField(min_value=0, max_value=3_600_000, default=1000)


class ApprovalMetaSerializer(StrictSerializer):
    reason = StringField(max_length=2000, allow_blank=True, trim_whitespace=True)
    risk_tags = serializers.ListField(child=serializers.CharField(max_length=50), required=False, default=list,
                                      max_length=20)
    estimated_impact = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    timeout_s = serializers.IntegerField(min_value=1, max_value=30 * 86400, required=False, allow_null=True,
                                         default=None)
    auto_approve_on_timeout = serializers.BooleanField(required=False, allow_null=True, default=None)


class ExecutorSerializer(StrictSerializer):
    url = StringField(max_length=500)
    timeout_ms = serializers.IntegerField(min_value=100, max_value=120_000, default=10000)


class AnnotationsSerializer(StrictSerializer):
    title = serializers.CharField(required=False, allow_blank=True)
    readOnlyHint = serializers.BooleanField(required=False)  # noqa: N815 (MCP's spelling)
    destructiveHint = serializers.BooleanField(required=False)  # noqa: N815
    idempotentHint = serializers.BooleanField(required=False)  # noqa: N815
    openWorldHint = serializers.BooleanField(required=False)  # noqa: N815


class ToolSerializer(StrictSerializer):
    name = serializers.RegexField(r"^[A-Za-z0-9_.:/-]{1,200}$")
    tier = serializers.ChoiceField(choices=Tier.choices)
    description = serializers.CharField(required=False, allow_blank=True, default="", max_length=5000)
    cost_weight = serializers.DecimalField(max_digits=12, decimal_places=4, min_value=0, default=1,
                                           coerce_to_string=False)
    irreversible = serializers.BooleanField(required=False, allow_null=True, default=None)
    annotations = AnnotationsSerializer(required=False)
    compensation = CompensationDescriptorSerializer(required=False, allow_null=True)
    approval = ApprovalMetaSerializer(required=False, allow_null=True)
    executor = ExecutorSerializer(required=False, allow_null=True)

    def validate(self, attrs: dict) -> dict:
        tier = attrs["tier"]
        if tier == Tier.COMPENSABLE and not attrs.get("compensation"):
            raise serializers.ValidationError({"compensation": ["A compensable tool needs a compensation "
                                                                "descriptor (fn_name, fn_version, args)."]})
        if tier != Tier.COMPENSABLE and attrs.get("compensation"):
            raise serializers.ValidationError({"compensation": [f"A {tier} tool has no compensation."]})
        if tier == Tier.IRREVERSIBLE and not (attrs.get("approval") or {}).get("reason", "").strip():
            raise serializers.ValidationError({"approval": ["An irreversible tool needs approval.reason "
                                                            "(shown to the reviewer)."]})
        if tier != Tier.IRREVERSIBLE and (attrs.get("approval") or attrs.get("executor")):
            raise serializers.ValidationError({"approval": [f"Only irreversible tools take approval or executor "
                                                            f"settings, not {tier} ones."]})
        executor = attrs.get("executor")
        if executor:
            from approvals.webhooks import check_target

            problem = check_target(executor["url"])
            if problem:
                raise serializers.ValidationError({"executor": {"url": [problem]}})
        return attrs


class ToolListSerializer(StrictSerializer):
    tools = ToolSerializer(many=True, allow_empty=False, max_length=500)

    def validate_tools(self, tools: list[dict]) -> list[dict]:
        names = [tool["name"] for tool in tools]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise serializers.ValidationError(f"Tool names appear twice: {', '.join(duplicates)}.")
        return tools


def tool_dict(tool: Tool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(tool.id), "name": tool.name, "tier": tool.tier, "description": tool.description,
        "cost_weight": float(tool.cost_weight), "irreversible": tool.irreversible,
        "annotations": tool.annotations,
    }
    if tool.tier == Tier.COMPENSABLE and tool.compensation_fn:
        body["compensation"] = {"fn_name": tool.compensation_fn.fn_name,
                                "fn_version": tool.compensation_fn.fn_version,
                                "args": tool.compensation_args, "max_retries": tool.max_retries,
                                "retry_backoff_ms": tool.retry_backoff_ms}
    if tool.tier == Tier.IRREVERSIBLE:
        body["approval"] = {"reason": tool.approval_reason, "risk_tags": tool.risk_tags,
                            "estimated_impact": tool.estimated_impact, "timeout_s": tool.approval_timeout_s,
                            "auto_approve_on_timeout": tool.auto_approve_on_timeout}
        if tool.executor_url:
            body["executor"] = {"url": tool.executor_url, "timeout_ms": tool.executor_timeout_ms}
    return body


def _tool_fields(spec: dict, fns: dict[tuple[str, str], CompensationFunction]) -> dict[str, Any]:
    compensation, approval = spec.get("compensation") or {}, spec.get("approval") or {}
    executor = spec.get("executor") or {}
    irreversible = spec["irreversible"]
    return {
        "tier": spec["tier"], "description": spec["description"], "cost_weight": spec["cost_weight"],
        "irreversible": spec["tier"] == Tier.IRREVERSIBLE if irreversible is None else irreversible,
        "annotations": spec.get("annotations") or {},
        "compensation_fn": fns.get((compensation.get("fn_name"), compensation.get("fn_version"))),
        "compensation_args": compensation.get("args", {}),
        "max_retries": compensation.get("max_retries", 3),
        "retry_backoff_ms": compensation.get("retry_backoff_ms", 1000),
        "approval_reason": approval.get("reason", ""), "risk_tags": approval.get("risk_tags", []),
        "estimated_impact": approval.get("estimated_impact", ""),
        "approval_timeout_s": approval.get("timeout_s"),
        "auto_approve_on_timeout": approval.get("auto_approve_on_timeout"),
        "executor_url": executor.get("url", ""), "executor_timeout_ms": executor.get("timeout_ms", 10000),
    }


class ToolsView(APIView):
    permission_classes = [IsAgentOrAdmin]

    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        tools = Tool.objects.for_org(caller_of(request).org).select_related("compensation_fn")
        return Response({"tools": [tool_dict(tool) for tool in tools]})

    @extend_schema(request=ToolListSerializer, responses={200: dict})
    def post(self, request: Request) -> Response:
        """Register or update a list of tools: all of them, or none."""
        org = caller_of(request).org
        specs = validated(ToolListSerializer, request.data)["tools"]
        fns = self._compensation_functions(org, specs)
        with transaction.atomic():
            saved = []
            for spec in specs:
                tool, _ = Tool.objects.update_or_create(org=org, name=spec["name"], defaults=_tool_fields(spec, fns))
                saved.append(tool)
        return Response({"tools": [tool_dict(tool) for tool in saved]})

    @staticmethod
    def _compensation_functions(org, specs: list[dict]) -> dict[tuple[str, str], CompensationFunction]:
        wanted = {(s["compensation"]["fn_name"], s["compensation"]["fn_version"]) for s in specs
                  if s.get("compensation")}
        names = {name for name, _ in wanted}
        fns = {(fn.fn_name, fn.fn_version): fn for fn in
               CompensationFunction.objects.filter(org=org, fn_name__in=names)}
        errors = {}
        for n, spec in enumerate(specs):
            key = (spec["compensation"]["fn_name"], spec["compensation"]["fn_version"]) if spec.get("compensation") \
                else None
            if key and key not in fns:
                errors[f"tools[{n}].compensation"] = (f"{key[0]}@{key[1]} is not in the compensation registry: "
                                                      f"register it with POST /api/v1/compensations first.")
        if errors:
            raise Invalid(errors, next(iter(errors.values())))
        return fns


# ---------------------------------------------------------------- sessions


class SessionCreateSerializer(StrictSerializer):
    # Optional: a key belongs to exactly one agent, so the key says which. When given, it must match.
    agent = StringField(max_length=100, required=False)
    metadata = serializers.DictField(required=False, default=dict)


class FailSerializer(StrictSerializer):
    error = serializers.CharField(max_length=10_000, required=False, allow_blank=True, default="")
    safe_calls = serializers.JSONField(required=False, default=None)


class CompleteSerializer(StrictSerializer):
    safe_calls = serializers.JSONField(required=False, default=None)


def session_dict(session: Session, *, full: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(session.id), "agent": session.agent.name, "state": session.state,
        "step_index": session.step_index, "metadata": session.metadata, "error": session.error or None,
        "created": session.created.isoformat(), "updated": session.updated.isoformat(),
        "ended_at": session.ended_at.isoformat() if session.ended_at else None,
    }
    if full:
        effects = list(session.effects.all())
        entries = list(UndoEntry.objects.filter(session=session).lifo().prefetch_related("attempt_log"))
        body["effects"] = [effect.as_dict() for effect in effects]
        body["undo_stack"] = [{**entry.as_dict(), "attempt_log": [a.as_dict() for a in entry.attempt_log.all()]}
                              for entry in entries]
        from budgets.api import budget_body

        full_budget = budget_body(session.agent, session)
        body["budget"] = {"tool_calls": session.tool_calls, "irreversible_calls": session.irreversible_calls,
                          "cost": float(session.cost), "tool_counts": session.tool_counts,
                          "violation": session.violation,
                          **{key: full_budget[key] for key in ("limits", "usage", "remaining", "tool_caps",
                                                                "mode", "on_exceeded", "incident")}}
    return body


def sessions_for(request: Request):
    caller = caller_of(request)
    sessions = Session.objects.filter(org=caller.org).select_related("agent")
    return sessions.filter(agent=caller.agent) if caller.agent else sessions


class SessionViewSet(ViewSet):
    """Runs of an agent: open, intercept calls, complete or fail."""

    lookup_value_regex = "[0-9a-fA-F-]{36}"

    def dispatch(self, request, *args, **kwargs):
        # The hot path first: one statement when it can answer, else DRF and the full pipeline.
        if self.action_map.get(request.method.lower()) == "intercept" and fastpath.available():
            answer = fastpath.intercept(request, kwargs["pk"])
            if answer is not None:
                return answer
        return super().dispatch(request, *args, **kwargs)

    def get_permissions(self):
        if self.action in ("create", "intercept", "complete"):
            return [IsAgent()]
        if self.action == "fail":
            return [IsAgentOrReviewer()]
        if self.action == "undo":
            return [role_required("admin")()]
        return [IsAgentOrMember()]

    def _get(self, request: Request, pk: str) -> Session:
        session = sessions_for(request).filter(pk=pk).first()
        if session is None:
            raise NotFound("No such session.", code="session_not_found")
        return session

    @extend_schema(request=SessionCreateSerializer, responses={201: dict})
    def create(self, request: Request) -> Response:
        data = validated(SessionCreateSerializer, request.data)
        agent: Agent = request.user.agent
        if data.get("agent", agent.name) != agent.name:
            raise NotFound(f"No agent named {data['agent']!r} for this key (the key belongs to {agent.name!r}).",
                           code="agent_not_found")
        if agent.state != Agent.State.ACTIVE:
            raise DomainError(f"The agent {agent.name} is {agent.state}; a reviewer must resume it.",
                              code="agent_suspended", status_code=423,
                              reason=agent.suspend_reason or agent.state, state=agent.state)
        session = Session.objects.create(org=agent.org, agent=agent, metadata=data["metadata"])
        return Response(session_dict(session), status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: dict})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(session_dict(self._get(request, pk), full=True))

    @extend_schema(operation_id="v1_sessions_list", responses={200: dict})
    def list(self, request: Request) -> Response:
        sessions = sessions_for(request)
        state = request.query_params.get("state")
        if state:
            sessions = sessions.filter(state=state)
        return Response({"sessions": [session_dict(s) for s in sessions.order_by("-created")[:100]]})

    @extend_schema(request=dict, responses={201: dict, 202: dict, 200: dict, 429: dict})
    @action(detail=True, methods=["post"])
    def intercept(self, request: Request, pk: str) -> Response:
        call = pipeline.parse(request.data)
        answer = pipeline.intercept(request.user.agent, pk, call)
        return Response(answer.body, status=answer.status)

    def _charge_last_safe_calls(self, request: Request, pk: str, raw) -> None:
        reported = pipeline.parse_safe_calls(raw)
        if reported and caller_of(request).agent:
            pipeline.report_safe_calls(caller_of(request).agent, pk, reported)

    @extend_schema(request=CompleteSerializer, responses={200: dict})
    @action(detail=True, methods=["post"])
    def complete(self, request: Request, pk: str) -> Response:
        data = validated(CompleteSerializer, request.data or {})
        session = self._get(request, pk)
        self._charge_last_safe_calls(request, pk, data["safe_calls"])
        session.refresh_from_db()
        session.complete(actor=caller_of(request).label)
        return Response({"session": session_dict(session)})

    @extend_schema(request=FailSerializer, responses={200: dict})
    @action(detail=True, methods=["post"])
    def fail(self, request: Request, pk: str) -> Response:
        data = validated(FailSerializer, request.data or {})
        session = self._get(request, pk)
        self._charge_last_safe_calls(request, pk, data["safe_calls"])
        session.refresh_from_db()
        session.fail(data["error"], actor=caller_of(request).label)
        return Response({"session": session_dict(session)})


    @extend_schema(request=None, responses={200: dict})
    @action(detail=True, methods=["post"])
    def undo(self, request: Request, pk: str) -> Response:
        """An org admin undoes a completed session: its undo stack is walked back."""
        session = self._get(request, pk)
        session.undo(actor=caller_of(request).label)
        return Response({"session": session_dict(session)})


class IsAgentOrReviewer(IsAgentOrMember):
    def has_permission(self, request, view) -> bool:
        return IsAgent().has_permission(request, view) or role_required("reviewer")().has_permission(request, view)


# ---------------------------------------------------------------- effects


class CommitSerializer(StrictSerializer):
    result = serializers.JSONField(required=False, allow_null=True, default=None)


class EffectFailSerializer(StrictSerializer):
    error = StringField(max_length=10_000)


def effects_for(request: Request):
    caller = caller_of(request)
    effects = Effect.objects.for_org(caller.org)
    return effects.filter(session__agent=caller.agent) if caller.agent else effects


class EffectViewSet(ViewSet):
    lookup_value_regex = "[0-9a-fA-F-]{36}"

    def dispatch(self, request, *args, **kwargs):
        if self.action_map.get(request.method.lower()) == "commit" and fastpath.available():
            answer = fastpath.commit(request, kwargs["pk"])
            if answer is not None:
                return answer
        return super().dispatch(request, *args, **kwargs)

    def get_permissions(self):
        if self.action in ("commit", "fail", "start"):
            return [IsAgent()]
        return [IsAgentOrMember()]

    def _get(self, request: Request, pk: str) -> Effect:
        effect = effects_for(request).filter(pk=pk).first()
        if effect is None:
            raise NotFound("No such effect.", code="effect_not_found")
        return effect

    @extend_schema(parameters=[OpenApiParameter("wait", int, description="Long-poll up to this many seconds "
                                                "(at most 60) while the effect is pending or approved.")],
                   responses={200: dict})
    def retrieve(self, request: Request, pk: str) -> Response:
        effect = self._get(request, pk)
        wait = _wait_seconds(request)
        if wait and effect.state in longpoll.WAITED_ON:
            seen = effect.state

            def changed() -> bool:
                return Effect.objects.filter(pk=effect.pk).exclude(state=seen).exists()

            longpoll.wait(effect.pk, wait, changed)
            effect.refresh_from_db()
        body = _effect_body(effect)
        # A decided irreversible call: the decision at the top too ({"decision": "rejected", "reason"}).
        return Response({"effect": body, **{k: body[k] for k in ("decision", "reason") if k in body}})

    @extend_schema(request=None, responses={200: dict, 409: dict})
    @action(detail=True, methods=["post"])
    def start(self, request: Request, pk: str) -> Response:
        """Claim an approved effect before running it (approved → executing): when two
        callers wait on the same approval, only the first to start may run the tool."""
        effect = self._get(request, pk)
        effect.start_executing(actor=caller_of(request).label)
        return Response({"effect": effect.as_dict()})

    @extend_schema(request=CommitSerializer, responses={200: dict})
    @action(detail=True, methods=["post"])
    def commit(self, request: Request, pk: str) -> Response:
        data = validated(CommitSerializer, request.data if request.data != {} else {})
        effect = self._get(request, pk)
        effect.commit(data["result"], actor=caller_of(request).label)
        return Response({"effect": effect.as_dict()})

    @extend_schema(request=EffectFailSerializer, responses={200: dict})
    @action(detail=True, methods=["post"])
    def fail(self, request: Request, pk: str) -> Response:
        data = validated(EffectFailSerializer, request.data)
        effect = self._get(request, pk)
        effect.fail(data["error"], actor=caller_of(request).label)
        return Response({"effect": effect.as_dict()})


def _effect_body(effect: Effect) -> dict[str, Any]:
    body = effect.as_dict()
    if effect.tier == Tier.IRREVERSIBLE:
        from approvals.models import ApprovalRequest

        found = ApprovalRequest.for_caller(effect)
        if found is not None:
            body["approval"], fields = found
            body.update(fields)
    return body


def _wait_seconds(request: Request) -> float:
    raw = request.query_params.get("wait")
    if raw in (None, ""):
        return 0
    try:
        value = float(raw)
    except ValueError:
        raise Invalid({"wait": "Must be a number of seconds."}, "wait must be a number of seconds.") from None
    if not 0 <= value <= 60:
        raise Invalid({"wait": "Must be between 0 and 60."}, "wait must be between 0 and 60 seconds.")
    return value




# ---------------------------------------------------------------- undo entries


class ResolveSerializer(StrictSerializer):
    note = serializers.CharField(max_length=10_000, trim_whitespace=True)


UNDO_STATES = [choice for choice, _ in UndoEntry.State.choices]


class ClaimSerializer(StrictSerializer):
    max = serializers.IntegerField(min_value=1, max_value=100, default=10)
    lease_s = serializers.IntegerField(min_value=1, max_value=3600, default=30)


class ReportSerializer(StrictSerializer):
    ok = serializers.BooleanField()
    error = serializers.CharField(max_length=10_000, required=False, allow_blank=True, default="")
    permanent = serializers.BooleanField(required=False, default=False)
    attempt = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)


def undo_entry_dict(entry: UndoEntry, *, attempts: bool = False) -> dict[str, Any]:
    session = entry.session
    body = {**entry.as_dict(), "tool": entry.effect.tool_name, "agent": session.agent.name,
            "session_state": session.state, "handler": entry.fn.handler,
            "waiting_for": claims.waiting_for(entry, entry.fn)}
    if attempts:
        body["attempt_log"] = [attempt.as_dict() for attempt in entry.attempt_log.all()]
    return body


class UndoEntryViewSet(ViewSet):
    """Undo entries of the caller's org: the dashboard's list of compensations waiting for a
    person, and the two ways out (retry, or resolved by hand)."""

    lookup_value_regex = "[0-9a-fA-F-]{36}"

    def get_permissions(self):
        if self.action in ("retry", "resolve"):
            return [role_required("reviewer")()]
        if self.action in ("claim", "report"):
            return [IsAgent()]
        return [role_required("viewer")()]

    def get_queryset(self):
        return UndoEntry.objects.for_org(caller_of(self.request).org).select_related("session__agent", "effect", "fn")

    def _get(self, pk: str) -> UndoEntry:
        entry = self.get_queryset().filter(pk=pk).first()
        if entry is None:
            raise NotFound("No such undo entry.", code="undo_entry_not_found")
        return entry

    @extend_schema(operation_id="v1_undo_entries_list", responses={200: dict},
                   parameters=[OpenApiParameter("state", str, enum=UNDO_STATES), OpenApiParameter("session", str)])
    def list(self, request: Request) -> Response:
        entries = self.get_queryset()
        state, session = request.query_params.get("state"), request.query_params.get("session")
        if state:
            if state not in UNDO_STATES:
                raise Invalid({"state": f"One of {', '.join(UNDO_STATES)}."},
                              f"state must be one of {', '.join(UNDO_STATES)}.")
            entries = entries.filter(state=state)
        if session:
            entries = entries.filter(session_id=_uuid(session, "session"))
        entries = entries.prefetch_related("attempt_log").order_by("-updated")[:200]
        return Response({"undo_entries": [undo_entry_dict(entry, attempts=True) for entry in entries]})

    @extend_schema(responses={200: dict})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response({"undo_entry": undo_entry_dict(self._get(pk), attempts=True)})

    @extend_schema(request=None, responses={200: dict, 409: dict})
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str) -> Response:
        """Another round of attempts for a compensation_failed entry; the walk resumes from it."""
        entry = self._get(pk)
        entry.retry(actor=caller_of(request).label)
        return self._answer(entry)

    @extend_schema(request=ResolveSerializer, responses={200: dict, 409: dict})
    @action(detail=True, methods=["post"])
    def resolve(self, request: Request, pk: str) -> Response:
        """A person undid the effect by hand; the walk resumes below the entry."""
        data = validated(ResolveSerializer, request.data)
        entry = self._get(pk)
        entry.resolve(actor=caller_of(request).label, note=data["note"])
        return self._answer(entry)

    @extend_schema(request=ClaimSerializer, responses={200: dict})
    @action(detail=False, methods=["post"])
    def claim(self, request: Request) -> Response:
        """The agent side takes the agent-handler entries the walk is waiting on, each under a lease."""
        data = validated(ClaimSerializer, request.data)
        entries = claims.claim(request.user.agent, data["max"], data["lease_s"])
        return Response({"entries": [claims.claim_dict(entry) for entry in entries]})

    @extend_schema(request=ReportSerializer, responses={200: dict, 409: dict})
    @action(detail=True, methods=["post"])
    def report(self, request: Request, pk: str) -> Response:
        """The claimer says how its attempt went; recorded like a worker's, and the walk goes on."""
        data = validated(ReportSerializer, request.data)
        entry = self._get_own(request, pk)
        claims.report(entry, data["ok"], data["error"], data["permanent"], data["attempt"])
        return Response({"undo_entry": entry.as_dict()})

    def _get_own(self, request: Request, pk: str) -> UndoEntry:
        entry = (UndoEntry.objects.filter(pk=pk, session__agent=request.user.agent)
                 .select_related("fn", "session").first())
        if entry is None:
            raise NotFound("No such undo entry.", code="undo_entry_not_found")
        return entry

    def _answer(self, entry: UndoEntry) -> Response:
        # The walk may already have run (eagerly, or on a fast worker): answer what the rows say now.
        entry = self._get(entry.pk)
        return Response({"undo_entry": undo_entry_dict(entry, attempts=True),
                         "session": session_dict(entry.session)})


def _uuid(value: str, name: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise Invalid({name: "Must be a UUID."}, f"{name} must be a UUID.") from None
