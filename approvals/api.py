"""Reviewer API: the approval queue and its decisions, stats, org settings, org webhooks.

People only (session with CSRF, or `Authorization: Token`): agent keys get 403 here, so an
agent can never decide on its own calls. Viewers read; reviewers and admins decide; admins
change settings and webhooks. Everything is scoped to the caller's org: another org's ids 404.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from approvals import events, shapes
from approvals.models import EVENT_KINDS, ApprovalRequest, OrgWebhook
from core.outbound import check_target
from core.schema import errors, ok
from effects.models import EffectTransition
from orgs.auth import IsAdmin, IsMember, IsReviewer
from orgs.models import validate_time_zone
from orgs.views import OrgScopedAPIView, OrgScopedViewSet
from undolog_site.errors import Invalid
from undolog_site.validation import StrictSerializer, validated

MAX_WEBHOOKS_PER_ORG = 20


def flag(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("", "0", "false", "no", "off"):
        return False
    raise Invalid({name: "Must be true or false."}, f"{name} must be true or false.")


# ---------------------------------------------------------------- approvals


class ApproveSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    args_digest = serializers.RegexField(r"^[0-9a-f]{64}$", required=False, allow_blank=True, default="",
                                         error_messages={"invalid": "Must be the request's args_digest "
                                                                    "(64 lowercase hex characters)."})


class RejectSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=2000)


class ExtendSerializer(StrictSerializer):
    minutes = serializers.IntegerField(min_value=1, max_value=7 * 24 * 60)


def approval_item(approval: ApprovalRequest) -> dict[str, Any]:
    """A queue row: everything but the (possibly large) agent context."""
    body: dict[str, Any] = dict(events.approval_payload(approval))
    del body["agent_context"]
    body["reasoning"] = approval.effect.reasoning.strip().splitlines()[0][:300] if approval.effect.reasoning else ""
    body["seconds_left"] = _seconds_left(approval)
    return body


def approval_detail(approval: ApprovalRequest) -> dict[str, Any]:
    """The request with its full context, the effect and session as they are now, and history."""
    return {
        **events.approval_payload(approval),
        "reasoning": approval.effect.reasoning,
        "seconds_left": _seconds_left(approval),
        "decided_args_digest": approval.decided_args_digest or None,
        "effect_state": approval.effect.state,
        "session_state": approval.session.state,
        "session_step_index": approval.session.step_index,
        "history": [t.as_dict() for t in EffectTransition.objects.filter(effect_id=approval.effect_id)],
    }


def _seconds_left(approval: ApprovalRequest) -> int | None:
    if approval.state != ApprovalRequest.State.PENDING:
        return None
    return max(0, int((approval.timeout_at - timezone.now()).total_seconds()))


DECISION_ERRORS = errors(404, 409, codes={
    404: ["approval_not_found"],
    409: ["already_decided", "deadline_passed", "args_digest_mismatch", "session_not_awaiting_approval"]})


class ApprovalViewSet(OrgScopedViewSet):
    """The approval queue: list, read, approve, reject (and roll back), extend, stats."""

    queryset = ApprovalRequest.objects.select_related("effect__tool", "session__agent")
    not_found = ("approval_not_found", "No such approval request.")

    def get_permissions(self):
        if self.action in ("approve", "reject", "extend"):
            return [IsReviewer()]
        return [IsMember()]

    @extend_schema(operation_id="v1_approvals_list", parameters=[
        OpenApiParameter("state", str, enum=[*ApprovalRequest.State.values, ""],
                         description="pending: oldest deadline first; otherwise newest decision first."),
        OpenApiParameter("limit", int, description="At most this many (default 100, at most 500).")],
        summary="The approval queue", tags=["approvals"], responses=ok(shapes.ApprovalListDict))
    def list(self, request: Request) -> Response:
        approvals = self.get_queryset()
        state = request.query_params.get("state", "")
        if state and state not in ApprovalRequest.State.values:
            raise Invalid({"state": f"Must be one of {', '.join(ApprovalRequest.State.values)}."},
                          f"state must be one of {', '.join(ApprovalRequest.State.values)}.")
        if state:
            approvals = approvals.filter(state=state)
        approvals = approvals.order_by("timeout_at", "created") if state == ApprovalRequest.State.PENDING \
            else approvals.order_by("-created")
        limit = _limit(request)
        return Response({"approvals": [approval_item(a) for a in approvals[:limit]]})

    @extend_schema(summary="Read an approval request with its context and history", tags=["approvals"],
                   responses={**ok(shapes.ApprovalDetailDict), **errors(404, codes={404: ["approval_not_found"]})})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(approval_detail(self.get_object()))

    @extend_schema(summary="Approve: the call may run", tags=["approvals"], request=ApproveSerializer,
                   responses={**ok(shapes.ApprovalBodyDict), **DECISION_ERRORS},
                   examples=[OpenApiExample("approve", request_only=True, value={
                       "reason": "Checked: the account is a test account.",
                       "args_digest": "3f7a" * 16})])
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str) -> Response:
        data = validated(ApproveSerializer, request.data)
        approval = self.get_object()
        approval.approve(self.caller.user, data["reason"].strip(), data["args_digest"] or None)
        return Response({"approval": approval_detail(self.get_object())})

    @extend_schema(summary="Reject (and optionally roll the run back)", tags=["approvals"], request=RejectSerializer,
                   responses={**ok(shapes.ApprovalBodyDict), **DECISION_ERRORS},
                   parameters=[OpenApiParameter("rollback", bool, description="Also fail the session, so its "
                                                "undo stack is walked.")])
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str) -> Response:
        data = validated(RejectSerializer, request.data)
        rollback = flag(request, "rollback")
        approval = self.get_object()
        approval.reject(self.caller.user, data["reason"], rollback=rollback)
        return Response({"approval": approval_detail(self.get_object())})

    @extend_schema(summary="Extend the deadline", tags=["approvals"], request=ExtendSerializer,
                   responses={**ok(shapes.ApprovalBodyDict), **DECISION_ERRORS})
    @action(detail=True, methods=["post"])
    def extend(self, request: Request, pk: str) -> Response:
        data = validated(ExtendSerializer, request.data)
        approval = self.get_object()
        approval.extend(data["minutes"], by=self.caller.user)
        return Response({"approval": approval_detail(self.get_object())})

    @extend_schema(summary="Approval stats of the last 7 days", tags=["approvals"],
                   responses=ok(shapes.ApprovalStatsDict))
    @action(detail=False, methods=["get"])
    def stats(self, request: Request) -> Response:
        return Response(ApprovalRequest.objects.for_org(self.org).stats(self.org))


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit", "100")
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= 500:
        raise Invalid({"limit": "Must be a whole number from 1 to 500."}, "limit must be from 1 to 500.")
    return limit


# ---------------------------------------------------------------- org settings


def time_zone(value: str) -> str:
    try:
        validate_time_zone(value)
    except DjangoValidationError as exc:
        raise serializers.ValidationError(exc.messages[0]) from None
    return value


class OrgSettingsSerializer(StrictSerializer):
    approval_timeout_s = serializers.IntegerField(min_value=1, max_value=30 * 86400, required=False)
    auto_approve_on_timeout = serializers.BooleanField(required=False)
    context_window = serializers.IntegerField(min_value=0, max_value=100, required=False)
    email_notifications = serializers.BooleanField(required=False)
    time_zone = serializers.CharField(max_length=64, required=False, validators=[time_zone])
    rate_limit_per_key = serializers.IntegerField(
        min_value=1, max_value=10_000_000, required=False, allow_null=True,
        help_text="API requests per minute per key or person; null: the server's default.")
    rate_limit_per_org = serializers.IntegerField(
        min_value=1, max_value=100_000_000, required=False, allow_null=True,
        help_text="API requests per minute for the whole org; null: the server's default.")


SETTINGS_FIELDS = list(OrgSettingsSerializer._declared_fields)


def settings_dict(org) -> dict[str, Any]:
    return {"org": org.slug, "name": org.name, **{name: getattr(org, name) for name in SETTINGS_FIELDS}}


class OrgSettingsView(OrgScopedAPIView):
    """The org's approval defaults and notification switches; admins change them."""

    def get_permissions(self):
        return [IsAdmin()] if self.request.method == "PATCH" else [IsMember()]

    @extend_schema(summary="Read the org's settings", tags=["org"], responses=ok(shapes.OrgSettingsDict))
    def get(self, request: Request) -> Response:
        return Response(settings_dict(self.org))

    @extend_schema(summary="Change the org's settings (admins)", tags=["org"], request=OrgSettingsSerializer,
                   responses=ok(shapes.OrgSettingsDict))
    def patch(self, request: Request) -> Response:
        data = validated(OrgSettingsSerializer, request.data, partial=True)
        org = self.org
        for name, value in data.items():
            setattr(org, name, value)
        if data:
            org.save(update_fields=list(data))
        return Response(settings_dict(org))


# ---------------------------------------------------------------- org webhooks


class WebhookSerializer(StrictSerializer):
    url = serializers.CharField(max_length=500)
    event_types = serializers.ListField(child=serializers.ChoiceField(choices=EVENT_KINDS), required=False,
                                        default=list, max_length=len(EVENT_KINDS))
    slack = serializers.BooleanField(required=False, default=False)
    secret = serializers.CharField(min_length=16, max_length=200, required=False)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")

    def validate_url(self, value: str) -> str:
        problem = check_target(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value


def webhook_dict(hook: OrgWebhook, *, with_secret: bool = False) -> dict[str, Any]:
    body = {"id": str(hook.id), "url": hook.url, "event_types": hook.event_types, "slack": hook.slack,
            "description": hook.description, "active": hook.active, "created": hook.created.isoformat(),
            "secret_hint": "…" + hook.secret[-4:]}
    if with_secret:
        body["secret"] = hook.secret
    return body


class WebhookViewSet(OrgScopedViewSet):
    """Where an org's events go. Admins only: a webhook's URL and secret are sensitive."""

    queryset = OrgWebhook.objects.all()
    not_found = ("webhook_not_found", "No such webhook.")
    permission_classes = [IsAdmin]

    @extend_schema(operation_id="v1_webhooks_list", summary="List the org's webhooks", tags=["webhooks"],
                   responses=ok(shapes.WebhookListDict))
    def list(self, request: Request) -> Response:
        hooks = self.get_queryset()
        return Response({"webhooks": [webhook_dict(hook) for hook in hooks]})

    @extend_schema(summary="Add a webhook (its secret is shown once)", tags=["webhooks"], request=WebhookSerializer,
                   responses=ok(shapes.WebhookCreatedDict, 201))
    def create(self, request: Request) -> Response:
        data = validated(WebhookSerializer, request.data)
        org = self.org
        if OrgWebhook.objects.for_org(org).count() >= MAX_WEBHOOKS_PER_ORG:
            raise Invalid({"url": f"An organization has at most {MAX_WEBHOOKS_PER_ORG} webhooks."},
                          f"An organization has at most {MAX_WEBHOOKS_PER_ORG} webhooks; delete one first.")
        hook = OrgWebhook.objects.create(org=org, **data)
        return Response(webhook_dict(hook, with_secret=True), status=201)

    @extend_schema(summary="Read a webhook with its last deliveries", tags=["webhooks"],
                   responses={**ok(shapes.WebhookDetailDict), **errors(404, codes={404: ["webhook_not_found"]})})
    def retrieve(self, request: Request, pk: str) -> Response:
        hook = self.get_object()
        deliveries = hook.deliveries.prefetch_related("attempt_log").order_by("-created")[:50]
        return Response({**webhook_dict(hook), "deliveries": [
            {**d.as_dict(), "attempt_log": [a.as_dict() for a in d.attempt_log.all()]} for d in deliveries]})

    @extend_schema(summary="Delete a webhook", tags=["webhooks"],
                   responses={204: None, **errors(404, codes={404: ["webhook_not_found"]})})
    def destroy(self, request: Request, pk: str) -> Response:
        self.get_object().delete()
        return Response(status=204)
