"""REST API of the registry: tools and compensation functions (DESIGN.md's API contract).

The runs' endpoints (sessions, effects, undo entries) drive the workflows above this app: they
are in lifecycle/api.py.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.db import transaction
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from core.errors import Conflict, Invalid
from core.outbound import check_target
from core.schema import constrain, errors, ok
from core.validation import StrictSerializer, StringField, validated
from effects import preimages, shapes
from effects.models import (
    ASKED_HELP,
    MAX_ASKED,
    MAX_ASKED_CHARS,
    SEMVER,
    CompensationFunction,
    Tier,
    Tool,
    validate_semver,
)
from orgs.auth import IsAgentOrAdmin
from orgs.views import OrgScopedAPIView


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
    scope = serializers.RegexField(
        r"^[A-Za-z0-9_.:@/+=-]{1,200}$", required=False, default="",
        help_text="Agent handler: the upstream that runs it (the gateway sends its server's identity). Its entries "
                  "are claimed only by claims naming this scope; a scoped function keeps its scope (409).")

    def validate(self, attrs: dict) -> dict:
        if attrs["scope"] and attrs["handler"] != CompensationFunction.Handler.AGENT:
            raise serializers.ValidationError({"scope": ["Only an agent handler has a scope (the upstream that "
                                                         "claims its entries)."]})
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
            "description": fn.description, "scope": fn.scope}


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
                              **ok(shapes.CompensationDict, 200, "Updated (same name and version)."),
                              **errors(409, codes={409: ["compensation_scope_conflict"]})})
    def post(self, request: Request) -> Response:
        data = validated(CompensationSerializer, request.data)
        fn, created = CompensationFunction.register(
            self.org, data["fn_name"], data["fn_version"],
            **{k: data[k] for k in ("handler", "target", "timeout_ms", "claim_timeout_s", "description", "scope")})
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


class LabelsField(serializers.ListField):
    """At most 16 free strings of at most 40 characters (`tool.labels` in conditions)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(child=StringField(max_length=40), max_length=16, required=False, default=list, **kwargs)


class AskedField(serializers.ListField):
    """What a request must say for the tool to be asked for (`asked(tool)` in conditions): at most 32
    words or short phrases, each with a letter or digit."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(child=StringField(max_length=MAX_ASKED_CHARS), max_length=MAX_ASKED, required=False,
                         default=list, help_text=ASKED_HELP, **kwargs)

    def to_internal_value(self, data: Any) -> list[str]:
        if not isinstance(data, list):
            raise serializers.ValidationError(ASKED_HELP)
        values = super().to_internal_value(data)
        if any(not re.search(r"[A-Za-z0-9]", v) for v in values):
            raise serializers.ValidationError(ASKED_HELP)
        return [" ".join(v.split()) for v in values]


class ToolSerializer(StrictSerializer):
    name = serializers.RegexField(r"^[A-Za-z0-9_.:/-]{1,200}$")
    labels = LabelsField(help_text='Free strings conditions read as tool.labels, e.g. ["untrusted", "external"]; '
                                   '"untrusted": its output is text others wrote.')
    untrusted_fields = serializers.ListField(
        child=StringField(max_length=200), max_length=100, required=False, default=list,
        help_text="Keys of the output others wrote, wherever they occur; empty: all of an untrusted tool's output.")
    asked = AskedField()
    tier = serializers.ChoiceField(choices=Tier.choices)
    description = serializers.CharField(required=False, allow_blank=True, default="", max_length=5000)
    cost_weight = serializers.DecimalField(max_digits=12, decimal_places=4, min_value=0, default=1,
                                           coerce_to_string=False)
    irreversible = serializers.BooleanField(required=False, allow_null=True, default=None)
    annotations = AnnotationsSerializer(required=False)
    compensation = CompensationDescriptorSerializer(required=False, allow_null=True)
    pre_image = serializers.JSONField(
        required=False, allow_null=True, default=None,
        help_text="A compensable tool's before read and restore (effects/preimages.py): "
                  '{"before": {"tool", "args"}, "restore": {"tool", "args"}, "absent_when", "restore_absent", '
                  '"check", "after", "max_bytes", "over_bound": "hold"|"refuse"}.')
    approval = ApprovalMetaSerializer(required=False, allow_null=True)
    executor = ExecutorSerializer(required=False, allow_null=True)

    def validate(self, attrs: dict) -> dict:
        tier = attrs["tier"]
        if tier == Tier.COMPENSABLE and not attrs.get("compensation"):
            raise serializers.ValidationError({"compensation": ["A compensable tool needs a compensation "
                                                                "descriptor (fn_name, fn_version, args)."]})
        if tier != Tier.COMPENSABLE and attrs.get("compensation"):
            raise serializers.ValidationError({"compensation": [f"A {tier} tool has no compensation."]})
        if attrs.get("pre_image") is not None:
            if tier != Tier.COMPENSABLE:
                raise serializers.ValidationError({"pre_image": [f"Only compensable tools take a pre-image, not "
                                                                 f"{tier} ones."]})
            problems = preimages.declaration_problems(attrs["pre_image"], settings.UNDOLOG_PRE_IMAGE_MAX_BYTES)
            if problems:
                raise serializers.ValidationError({key: [message] for key, message in problems.items()})
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
        "annotations": tool.annotations, "labels": tool.labels, "untrusted_fields": tool.untrusted_fields,
        "asked": tool.asked,
    }
    if tool.tier == Tier.COMPENSABLE and tool.compensation_fn:
        body["compensation"] = {"fn_name": tool.compensation_fn.fn_name,
                                "fn_version": tool.compensation_fn.fn_version,
                                "args": tool.compensation_args, "max_retries": tool.max_retries,
                                "retry_backoff_ms": tool.retry_backoff_ms}
        if tool.pre_image is not None:
            body["pre_image"] = tool.pre_image
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
        "labels": list(dict.fromkeys(spec.get("labels") or [])),
        "untrusted_fields": list(dict.fromkeys(spec.get("untrusted_fields") or [])),
        "asked": list(dict.fromkeys(spec.get("asked") or [])),
        "compensation_fn": fns.get((compensation.get("fn_name"), compensation.get("fn_version"))),
        "compensation_args": compensation.get("args", {}),
        "max_retries": compensation.get("max_retries", 3),
        "retry_backoff_ms": compensation.get("retry_backoff_ms", 1000),
        "pre_image": spec.get("pre_image"),
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
                   responses={**ok(shapes.ToolListDict), **errors(409, codes={409: ["tool_scope_conflict"]})})
    def post(self, request: Request) -> Response:
        """Register or update a list of tools: all of them, or none."""
        org = self.org
        specs = validated(ToolListSerializer, request.data)["tools"]
        fns = self._compensation_functions(org, specs)
        with transaction.atomic():
            self._keep_upstreams(org, specs, fns)
            saved = []
            for spec in specs:
                tool, _ = Tool.objects.update_or_create(org=org, name=spec["name"], defaults=_tool_fields(spec, fns))
                saved.append(tool)
        return Response({"tools": [tool_dict(tool) for tool in saved]})

    @staticmethod
    def _keep_upstreams(org, specs: list[dict], fns: dict[tuple[str, str], CompensationFunction]) -> None:
        """A compensable tool whose undo one upstream runs (a scoped agent function) is not re-pointed at
        another upstream's: the first gateway's calls would get undos the second one claims and runs on
        its own upstream (two gateways of an org exposing one tool name from two upstreams)."""
        wanted = {spec["name"]: fns[(spec["compensation"]["fn_name"], spec["compensation"]["fn_version"])]
                  for spec in specs if spec.get("compensation")}
        agent = CompensationFunction.Handler.AGENT
        # Locked: two gateways registering at once are ordered, the second sees the first's function.
        tools = (Tool.objects.select_for_update().select_related("compensation_fn")
                 .filter(org=org, name__in=wanted, compensation_fn__handler=agent).exclude(compensation_fn__scope=""))
        for tool in tools:
            fn, old = wanted[tool.name], tool.compensation_fn
            if fn.handler == agent and fn.scope != old.scope:
                raise Conflict(f"Tool {tool.name!r} is undone on the upstream {old.scope!r} ({old}); this "
                               f"registration would undo it on {fn.scope or 'no upstream'!r} ({fn}): two gateways "
                               "of this org expose one tool name from two upstreams, and one would run the "
                               "other's undos. Keep each tool name on one upstream; if it is the same upstream, "
                               f"set identity = {old.scope!r} in its [servers.<name>] table.",
                               code="tool_scope_conflict", tool=tool.name, scope=old.scope)

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
