"""REST API of the registry, sessions and effects (DESIGN.md's API contract)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from approvals.models import ApprovalRequest
from budgets.bodies import budget_body
from core.outbound import check_target
from core.schema import constrain, errors, ok
from effects import claims, longpoll, rollback, shapes
from effects import intercept as pipeline
from effects.examples import BUDGET_REFUSAL, COMMITTED, INTERCEPT_EXAMPLES
from effects.models import (
    SEMVER,
    CompensationFunction,
    Effect,
    Session,
    Tier,
    Tool,
    UndoEntry,
    validate_semver,
)
from orgs.auth import (
    IsAdmin,
    IsAgent,
    IsAgentOrAdmin,
    IsAgentOrMember,
    IsAgentOrReviewer,
    IsReviewer,
    IsViewer,
    ReadViewerWriteAdmin,
)
from orgs.models import Agent
from orgs.views import OrgScopedAPIView, OrgScopedViewSet
from undolog_site.errors import DomainError, Invalid, NotFound
from undolog_site.validation import StrictSerializer, StringField, validated


@extend_schema_field({"type": "string", "pattern": SEMVER.pattern, "maxLength": 64, "example": "1.0.0"})
class SemverField(StringField):
    """A semantic version (1.0.0); documented with its pattern."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=64, validators=[semver], **kwargs)


def semver(value: str) -> str:
    try:
        validate_semver(value)
    except Exception as exc:  # ValidationError from Django; DRF wants its own
        raise serializers.ValidationError(str(exc.messages[0] if hasattr(exc, "messages") else exc)) from None
    return value


# ---------------------------------------------------------------- compensation registry


class CompensationSerializer(StrictSerializer):
    fn_name = serializers.RegexField(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,99}$")
    fn_version = SemverField()
    handler = serializers.ChoiceField(choices=CompensationFunction.Handler.choices)
    target = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
    timeout_ms = serializers.IntegerField(min_value=100, max_value=120_000, default=5000)
    claim_timeout_s = serializers.IntegerField(min_value=1, max_value=30 * 86400, default=3600)
    description = serializers.CharField(required=False, allow_blank=True, default="")

    def validate(self, attrs: dict) -> dict:
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


class CompensationsView(OrgScopedAPIView):
    permission_classes = [IsAgentOrAdmin]
    queryset = CompensationFunction.objects.all()

    @extend_schema(summary="List the compensation registry", tags=["registry"],
                   responses=ok(shapes.CompensationListDict))
    def get(self, request: Request) -> Response:
        fns = self.get_queryset()
        return Response({"compensations": [compensation_dict(fn) for fn in fns]})

    @extend_schema(summary="Register a compensation function (or update one)", tags=["registry"],
                   request=CompensationSerializer,
                   responses={**ok(shapes.CompensationDict, 201, "Registered."),
                              **ok(shapes.CompensationDict, 200, "Updated (same name and version).")})
    def post(self, request: Request) -> Response:
        data = validated(CompensationSerializer, request.data)
        fn, created = CompensationFunction.objects.update_or_create(
            org=self.org, fn_name=data["fn_name"], fn_version=data["fn_version"],
            defaults={k: data[k] for k in ("handler", "target", "timeout_ms", "claim_timeout_s", "description")},
        )
        return Response(compensation_dict(fn), status=201 if created else 200)


# ---------------------------------------------------------------- tools


class CompensationDescriptorSerializer(StrictSerializer):
    fn_name = StringField(max_length=100)
    fn_version = SemverField()
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
    approvals_required = serializers.IntegerField(min_value=1, max_value=10, required=False, default=1)


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


constrain("ToolListRequest", "tools", minItems=1, maxItems=500)


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
                            "auto_approve_on_timeout": tool.auto_approve_on_timeout,
                            "approvals_required": tool.approvals_required}
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
        "approvals_required": approval.get("approvals_required", 1),
        "executor_url": executor.get("url", ""), "executor_timeout_ms": executor.get("timeout_ms", 10000),
    }


class ToolsView(OrgScopedAPIView):
    permission_classes = [IsAgentOrAdmin]
    queryset = Tool.objects.select_related("compensation_fn")

    @extend_schema(summary="List the registered tools", tags=["registry"], responses=ok(shapes.ToolListDict))
    def get(self, request: Request) -> Response:
        tools = self.get_queryset()
        return Response({"tools": [tool_dict(tool) for tool in tools]})

    @extend_schema(summary="Register or update tools, all or none", tags=["registry"], request=ToolListSerializer,
                   responses=ok(shapes.ToolListDict))
    def post(self, request: Request) -> Response:
        """Register or update a list of tools: all of them, or none."""
        org = self.org
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
    # The person who started this run (their username or email): they cannot approve its calls.
    started_by = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class FailSerializer(StrictSerializer):
    error = serializers.CharField(max_length=10_000, required=False, allow_blank=True, default="")
    safe_calls = serializers.JSONField(required=False, default=None)


class CompleteSerializer(StrictSerializer):
    safe_calls = serializers.JSONField(required=False, default=None)


def session_dict(session: Session, *, full: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(session.id), "agent": session.agent.name, "state": session.state,
        "step_index": session.step_index, "metadata": session.metadata, "error": session.error or None,
        "started_by": session.started_by or None,
        "created": session.created.isoformat(), "updated": session.updated.isoformat(),
        "ended_at": session.ended_at.isoformat() if session.ended_at else None,
    }
    if full:
        effects = list(session.effects.all())
        entries = list(UndoEntry.objects.filter(session=session).lifo().prefetch_related("attempt_log"))
        body["effects"] = [effect.as_dict() for effect in effects]
        body["undo_stack"] = [{**entry.as_dict(), "attempt_log": [a.as_dict() for a in entry.attempt_log.all()]}
                              for entry in entries]
        full_budget = budget_body(session.agent, session)
        body["budget"] = {"tool_calls": session.tool_calls, "irreversible_calls": session.irreversible_calls,
                          "cost": float(session.cost), "tool_counts": session.tool_counts,
                          "violation": session.violation,
                          **{key: full_budget[key] for key in ("limits", "usage", "remaining", "tool_caps",
                                                                "mode", "on_exceeded", "incident")}}
    return body


class SafeCallSerializer(StrictSerializer):
    tool = StringField(max_length=200)
    step_index = serializers.IntegerField(min_value=0)
    args = serializers.DictField(required=False)


class InterceptSerializer(StrictSerializer):
    """The intercept's body (for the schema: the hot path validates it by hand, `intercept.parse`)."""

    tool = StringField(max_length=200)
    args = serializers.DictField(required=False, help_text="The call's arguments (at most UNDOLOG_MAX_ARGS_BYTES).")
    step_index = serializers.IntegerField(min_value=0)
    reasoning = serializers.CharField(required=False, allow_blank=True, help_text="Why the agent makes the call.")
    idempotency_key = serializers.CharField(required=False, allow_blank=True, max_length=200)
    safe_calls = SafeCallSerializer(many=True, required=False, help_text="SAFE calls since the last intercept.")


class SessionViewSet(OrgScopedViewSet):
    """Runs of an agent: open, intercept calls, complete or fail."""

    queryset = Session.objects.select_related("agent")
    not_found = ("session_not_found", "No such session.")

    def scope(self, queryset, caller):
        sessions = queryset.filter(org=caller.org)
        return sessions.filter(agent=caller.agent) if caller.agent else sessions

    def get_permissions(self):
        if self.action in ("create", "intercept", "complete"):
            return [IsAgent()]
        if self.action == "fail":
            return [IsAgentOrReviewer()]
        if self.action == "undo":
            return [IsAdmin()]
        return [IsAgentOrMember()]

    @extend_schema(summary="Open a session (a run of the calling agent)", tags=["sessions"],
                   request=SessionCreateSerializer,
                   responses={**ok(shapes.SessionDict, 201), **errors(404, 423, codes={404: ["agent_not_found"]})})
    def create(self, request: Request) -> Response:
        data = validated(SessionCreateSerializer, request.data)
        agent: Agent = self.caller.agent
        if data.get("agent", agent.name) != agent.name:
            raise NotFound(f"No agent named {data['agent']!r} for this key (the key belongs to {agent.name!r}).",
                           code="agent_not_found")
        if agent.state != Agent.State.ACTIVE:
            raise DomainError(f"The agent {agent.name} is {agent.state}; a reviewer must resume it.",
                              code="agent_suspended", status_code=423,
                              reason=agent.suspend_reason or agent.state, state=agent.state)
        session = Session.objects.create(org=agent.org, agent=agent, metadata=data["metadata"],
                                         started_by=data["started_by"].strip())
        return Response(session_dict(session), status=status.HTTP_201_CREATED)

    @extend_schema(summary="Read a session with its effects, undo stack and budget", tags=["sessions"],
                   responses={**ok(shapes.SessionDetailDict), **errors(404, codes={404: ["session_not_found"]})})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(session_dict(self.get_object(), full=True))

    @extend_schema(operation_id="v1_sessions_list", summary="List sessions (newest 100)", tags=["sessions"],
                   parameters=[OpenApiParameter("state", str, enum=[*Session.State.values, ""],
                                                description="Only sessions in this state. Empty: every state.")],
                   responses=ok(shapes.SessionListDict))
    def list(self, request: Request) -> Response:
        sessions = self.get_queryset()
        state = request.query_params.get("state")
        if state:
            if state not in Session.State.values:
                raise Invalid({"state": f"One of {', '.join(Session.State.values)}."},
                              f"state must be one of {', '.join(Session.State.values)}.")
            sessions = sessions.filter(state=state)
        return Response({"sessions": [session_dict(s) for s in sessions.order_by("-created")[:100]]})

    @extend_schema(
        summary="Intercept a tool call before it runs", tags=["sessions"], request=InterceptSerializer,
        description="Every call that changes something goes through here first: a compensable call is "
                    "logged with its undo entry (201 execute), an irreversible one waits for a reviewer (202 "
                    "await_approval), a call seen before replays (200), a call over the budget is refused (429).",
        responses={**ok(shapes.InterceptDict, 201, "execute: run the tool, then commit the effect. approved: a "
                                "grant decided it; claim it (/start), run it, commit it."),
                   **ok(shapes.InterceptDict, 202, "await_approval: poll the effect until it is decided."),
                   **ok(shapes.InterceptDict, 200, "replay: the same call again; its recorded outcome."),
                   **ok(shapes.InterceptDict, 429, "refused by the budget (or the incident switch).",
                        examples=[BUDGET_REFUSAL]),
                   **errors(404, 409, 423, codes={
                       404: ["session_not_found", "tool_not_registered"],
                       409: ["session_not_running", "session_awaiting_approval", "idempotency_key_reused"]}),
                   **errors(400, codes={400: ["invalid", "safe_tool_not_intercepted", "malformed_json",
                                               "too_deep"]})},
        examples=INTERCEPT_EXAMPLES)
    @action(detail=True, methods=["post"])
    def intercept(self, request: Request, pk: str) -> Response:
        call = pipeline.parse(request.data)
        answer = pipeline.intercept(self.caller.agent, self.lookup_value(), call)
        return Response(answer.body, status=answer.status)

    def _charge_last_safe_calls(self, request: Request, pk: str, raw) -> None:
        reported = pipeline.parse_safe_calls(raw)
        if reported and self.caller.agent:
            pipeline.report_safe_calls(self.caller.agent, pk, reported)

    @extend_schema(summary="Complete a session", tags=["sessions"], request=CompleteSerializer,
                   responses={**ok(shapes.SessionBodyDict),
                              **errors(404, 409, codes={404: ["session_not_found"], 409: ["session_state_conflict"]})})
    @action(detail=True, methods=["post"])
    def complete(self, request: Request, pk: str) -> Response:
        data = validated(CompleteSerializer, request.data or {})
        session = self.get_object()
        self._charge_last_safe_calls(request, pk, data["safe_calls"])
        session.refresh_from_db()
        session.complete(actor=self.caller.label)
        return Response({"session": session_dict(session)})

    @extend_schema(summary="Fail a session: its undo stack is walked back", tags=["sessions"], request=FailSerializer,
                   responses={**ok(shapes.SessionBodyDict),
                              **errors(404, 409, codes={404: ["session_not_found"], 409: ["session_state_conflict"]})})
    @action(detail=True, methods=["post"])
    def fail(self, request: Request, pk: str) -> Response:
        data = validated(FailSerializer, request.data or {})
        session = self.get_object()
        self._charge_last_safe_calls(request, pk, data["safe_calls"])
        session.refresh_from_db()
        session.fail(data["error"], actor=self.caller.label)
        return Response({"session": session_dict(session)})


    @extend_schema(summary="Undo a completed session (admins)", tags=["sessions"], request=None,
                   responses={**ok(shapes.SessionBodyDict),
                              **errors(404, 409, codes={404: ["session_not_found"], 409: ["session_state_conflict"]})})
    @action(detail=True, methods=["post"])
    def undo(self, request: Request, pk: str) -> Response:
        """An org admin undoes a completed session: its undo stack is walked back."""
        session = self.get_object()
        session.undo(actor=self.caller.label)
        return Response({"session": session_dict(session)})


# ---------------------------------------------------------------- fleet rollback


def _not_in_future(value):
    if value > timezone.now():
        raise serializers.ValidationError("Must not be in the future.")
    return value


SINCE_HELP = ("Roll back the runs that ended at or after this time (ISO 8601; without an offset, UTC). "
              "Open runs are failed whenever they began.")


class RollbackSerializer(StrictSerializer):
    since = serializers.DateTimeField(help_text=SINCE_HELP, validators=[_not_in_future])
    reason = StringField(max_length=2000, help_text="Why: kept with the audited event and on each failed run.")


class RollbackPreviewSerializer(StrictSerializer):
    since = serializers.DateTimeField(required=False, help_text=SINCE_HELP, validators=[_not_in_future])


class AgentRollbackView(OrgScopedAPIView):
    """Fleet rollback of one agent (effects/rollback.py): admins start it, members watch it."""

    queryset = Agent.objects.select_related("org")
    lookup_field = "name"
    lookup_is_uuid = False
    permission_classes = [ReadViewerWriteAdmin]
    not_found = ("agent_not_found", "No agent named {value!r} in this organization.")

    @extend_schema(summary="What a rollback would take, and what is being walked back", tags=["agents"],
                   parameters=[OpenApiParameter("since", str, description="ISO 8601; with it, the runs and "
                                                "entries a rollback since then would take now")],
                   responses={**ok(shapes.RollbackPreviewDict), **errors(404, codes={404: ["agent_not_found"]})})
    def get(self, request: Request, name: str) -> Response:
        agent = self.get_object()
        data = validated(RollbackPreviewSerializer, request.query_params.dict())
        body: dict[str, Any] = {}
        if data.get("since") is not None:
            body = {**rollback.preview(agent, data["since"]).as_dict(), "since": data["since"].isoformat()}
        return Response({**body, "in_progress": rollback.progress(agent)})

    @extend_schema(summary="Roll back every run of the agent since a time (admins)", tags=["agents"],
                   request=RollbackSerializer,
                   responses={**ok(shapes.RollbackDict), **errors(404, codes={404: ["agent_not_found"]})})
    def post(self, request: Request, name: str) -> Response:
        """Fails every open run of the agent and undoes every run of it that ended since `since`
        (completed ones too); each run's undo stack is walked back newest first, the runs in
        parallel across the workers. One `agent.rolled_back` event records who, why and the counts."""
        agent = self.get_object()
        data = validated(RollbackSerializer, request.data)
        scope = rollback.rollback(agent, data["since"], data["reason"], actor=self.caller.label)
        return Response({**scope.as_dict(), "since": data["since"].isoformat()})


# ---------------------------------------------------------------- effects


class CommitSerializer(StrictSerializer):
    result = serializers.JSONField(required=False, allow_null=True, default=None)


class EffectFailSerializer(StrictSerializer):
    error = StringField(max_length=10_000)


class EffectViewSet(OrgScopedViewSet):
    queryset = Effect.objects.all()
    not_found = ("effect_not_found", "No such effect.")

    def scope(self, queryset, caller):
        effects = queryset.filter(org=caller.org)
        return effects.filter(session__agent=caller.agent) if caller.agent else effects

    def get_permissions(self):
        if self.action in ("commit", "fail", "start"):
            return [IsAgent()]
        return [IsAgentOrMember()]

    @extend_schema(summary="Read an effect (long-poll with ?wait=)", tags=["effects"],
                   parameters=[OpenApiParameter("wait", float, description="Long-poll up to this many seconds "
                                                "(at most 60) while the effect is pending or approved.")],
                   responses={**ok(shapes.EffectReadDict), **errors(404, codes={404: ["effect_not_found"]})})
    def retrieve(self, request: Request, pk: str) -> Response:
        effect = self.get_object()
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

    @extend_schema(summary="Claim an approved effect before running it", tags=["effects"], request=None,
                   responses={**ok(shapes.EffectBodyDict),
                              **errors(404, 409, codes={404: ["effect_not_found"], 409: ["effect_state_conflict"]})})
    @action(detail=True, methods=["post"])
    def start(self, request: Request, pk: str) -> Response:
        """Claim an approved effect before running it (approved → executing): when two
        callers wait on the same approval, only the first to start may run the tool."""
        effect = self.get_object()
        effect.start_executing(actor=self.caller.label)
        return Response({"effect": effect.as_dict()})

    @extend_schema(summary="Commit an effect: the tool ran, here is its result", tags=["effects"],
                   request=CommitSerializer,
                   responses={**ok(shapes.EffectBodyDict, examples=[COMMITTED]),
                              **errors(404, 409, codes={404: ["effect_not_found"], 409: ["effect_state_conflict"]})},
                   examples=[OpenApiExample("commit", value={"result": {"message_id": "m-42"}}, request_only=True)])
    @action(detail=True, methods=["post"])
    def commit(self, request: Request, pk: str) -> Response:
        data = validated(CommitSerializer, request.data if request.data != {} else {})
        effect = self.get_object()
        effect.commit(data["result"], actor=self.caller.label)
        return Response({"effect": effect.as_dict()})

    @extend_schema(summary="Fail an effect: the tool did not run or failed", tags=["effects"],
                   request=EffectFailSerializer,
                   responses={**ok(shapes.EffectBodyDict),
                              **errors(404, 409, codes={404: ["effect_not_found"], 409: ["effect_state_conflict"]})})
    @action(detail=True, methods=["post"])
    def fail(self, request: Request, pk: str) -> Response:
        data = validated(EffectFailSerializer, request.data)
        effect = self.get_object()
        effect.fail(data["error"], actor=self.caller.label)
        return Response({"effect": effect.as_dict()})


def _effect_body(effect: Effect) -> dict[str, Any]:
    body = effect.as_dict()
    if effect.tier == Tier.IRREVERSIBLE:
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


class UndoEntryViewSet(OrgScopedViewSet):
    """Undo entries of the caller's org: the dashboard's list of compensations waiting for a
    person, and the two ways out (retry, or resolved by hand)."""

    queryset = UndoEntry.objects.select_related("session__agent", "effect")
    not_found = ("undo_entry_not_found", "No such undo entry.")

    def scope(self, queryset, caller):
        return queryset.for_org(caller.org)

    def get_permissions(self):
        if self.action in ("retry", "resolve"):
            return [IsReviewer()]
        if self.action in ("claim", "report"):
            return [IsAgent()]
        return [IsViewer()]

    @extend_schema(operation_id="v1_undo_entries_list", summary="List the org's undo entries", tags=["undo entries"],
                   responses=ok(shapes.UndoEntryListDict),
                   parameters=[OpenApiParameter("state", str, enum=[*UNDO_STATES, ""],
                                                description="Empty: every state."),
                               OpenApiParameter("session", str)])
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

    @extend_schema(summary="Read an undo entry with its attempts", tags=["undo entries"],
                   responses={**ok(shapes.UndoEntryBodyDict), **errors(404, codes={404: ["undo_entry_not_found"]})})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response({"undo_entry": undo_entry_dict(self.get_object(), attempts=True)})

    @extend_schema(summary="Retry a failed compensation", tags=["undo entries"], request=None,
                   responses={**ok(shapes.UndoEntryAnswerDict), **errors(404, 409, codes={
                       404: ["undo_entry_not_found"], 409: ["undo_entry_state_conflict"]})})
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str) -> Response:
        """Another round of attempts for a compensation_failed entry; the walk resumes from it."""
        entry = self.get_object()
        entry.retry(actor=self.caller.label)
        return self._answer(entry)

    @extend_schema(summary="Mark a compensation resolved by hand", tags=["undo entries"], request=ResolveSerializer,
                   responses={**ok(shapes.UndoEntryAnswerDict), **errors(404, 409, codes={
                       404: ["undo_entry_not_found"], 409: ["undo_entry_state_conflict"]})})
    @action(detail=True, methods=["post"])
    def resolve(self, request: Request, pk: str) -> Response:
        """A person undid the effect by hand; the walk resumes below the entry."""
        data = validated(ResolveSerializer, request.data)
        entry = self.get_object()
        entry.resolve(actor=self.caller.label, note=data["note"])
        return self._answer(entry)

    @extend_schema(summary="Claim the agent-side undo entries the walk waits on", tags=["undo entries"],
                   request=ClaimSerializer, responses={**ok(shapes.ClaimedListDict), **errors()})
    @action(detail=False, methods=["post"])
    def claim(self, request: Request) -> Response:
        """The agent side takes the agent-handler entries the walk is waiting on, each under a lease."""
        data = validated(ClaimSerializer, request.data)
        entries = claims.claim(self.caller.agent, data["max"], data["lease_s"])
        return Response({"entries": [claims.claim_dict(entry) for entry in entries]})

    @extend_schema(summary="Report how a claimed undo entry went", tags=["undo entries"],
                   request=ReportSerializer,
                   responses={**ok(shapes.UndoEntryBodyDict),
                              **errors(404, 409, codes={404: ["undo_entry_not_found"],
                                                        409: ["undo_entry_not_claimed"]})})
    @action(detail=True, methods=["post"])
    def report(self, request: Request, pk: str) -> Response:
        """The claimer says how its attempt went; recorded like a worker's, and the walk goes on."""
        data = validated(ReportSerializer, request.data)
        entry = self.get_object(self.get_queryset().filter(session__agent=self.caller.agent).select_related("fn"))
        claims.report(entry, data["ok"], data["error"], data["permanent"], data["attempt"])
        return Response({"undo_entry": entry.as_dict()})

    def _answer(self, entry: UndoEntry) -> Response:
        # The walk may already have run (eagerly, or on a fast worker): answer what the rows say now.
        entry = self.get_object()
        return Response({"undo_entry": undo_entry_dict(entry, attempts=True),
                         "session": session_dict(entry.session)})


def _uuid(value: str, name: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise Invalid({name: "Must be a UUID."}, f"{name} must be a UUID.") from None
