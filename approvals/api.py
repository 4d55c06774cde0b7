"""Reviewer API: the approval queue and its decisions, stats, org settings, org webhooks.

People only (session with CSRF, or `Authorization: Token`): agent keys get 403 here, so an
agent can never decide on its own calls. Viewers read; reviewers and admins decide; admins
change settings and webhooks. Everything is scoped to the caller's org: another org's ids 404.
"""

from __future__ import annotations

import statistics
import uuid
from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Count, Q
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import permissions, serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.viewsets import ViewSet

from approvals import events
from approvals.models import EVENT_KINDS, TIMEOUT_LABEL, ApprovalRequest, OrgWebhook
from approvals.webhooks import check_target
from effects.models import EffectTransition
from orgs.auth import AgentPrincipal, caller_of, role_required
from orgs.models import validate_time_zone
from undolog_site.errors import Invalid, NotFound
from undolog_site.validation import StrictSerializer, validated

UUID_PATTERN = "[0-9a-fA-F-]{36}"
STATS_DAYS = 7
MAX_WEBHOOKS_PER_ORG = 20


class IsMember(permissions.BasePermission):
    """A person with any role in the org (viewer and up); never an agent key."""

    message = "This endpoint is for the organization's people, not agent keys."

    def has_permission(self, request, view) -> bool:
        user = request.user
        if user is None or isinstance(user, AgentPrincipal) or not user.is_authenticated:
            return False
        return caller_of(request).membership is not None


IsReviewer = role_required("reviewer")
IsAdmin = role_required("admin")


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


class ApprovalViewSet(ViewSet):
    """The approval queue: list, read, approve, reject (and roll back), extend, stats."""

    lookup_value_regex = UUID_PATTERN

    def get_permissions(self):
        if self.action in ("approve", "reject", "extend"):
            return [IsReviewer()]
        return [IsMember()]

    def queryset(self, request: Request):
        # Tenancy, once: every lookup below starts from the caller's org.
        return (ApprovalRequest.objects.for_org(caller_of(request).org)
                .select_related("effect__tool", "session__agent"))

    def _get(self, request: Request, pk: str) -> ApprovalRequest:
        try:
            uuid.UUID(pk)
        except ValueError:
            raise NotFound("No such approval request.", code="approval_not_found") from None
        approval = self.queryset(request).filter(pk=pk).first()
        if approval is None:
            raise NotFound("No such approval request.", code="approval_not_found")
        return approval

    @extend_schema(operation_id="v1_approvals_list", parameters=[
        OpenApiParameter("state", str, enum=list(ApprovalRequest.State.values),
                         description="pending: oldest deadline first; otherwise newest decision first."),
        OpenApiParameter("limit", int, description="At most this many (default 100, at most 500).")],
        responses={200: dict})
    def list(self, request: Request) -> Response:
        approvals = self.queryset(request)
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

    @extend_schema(responses={200: dict})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(approval_detail(self._get(request, pk)))

    @extend_schema(request=ApproveSerializer, responses={200: dict, 409: dict})
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str) -> Response:
        data = validated(ApproveSerializer, request.data)
        approval = self._get(request, pk)
        approval.approve(caller_of(request).user, data["reason"].strip(), data["args_digest"] or None)
        return Response({"approval": approval_detail(self._get(request, pk))})

    @extend_schema(request=RejectSerializer, responses={200: dict, 409: dict},
                   parameters=[OpenApiParameter("rollback", bool, description="Also fail the session, so its "
                                                "undo stack is walked.")])
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str) -> Response:
        data = validated(RejectSerializer, request.data)
        rollback = flag(request, "rollback")
        approval = self._get(request, pk)
        approval.reject(caller_of(request).user, data["reason"], rollback=rollback)
        return Response({"approval": approval_detail(self._get(request, pk))})

    @extend_schema(request=ExtendSerializer, responses={200: dict, 409: dict})
    @action(detail=True, methods=["post"])
    def extend(self, request: Request, pk: str) -> Response:
        data = validated(ExtendSerializer, request.data)
        approval = self._get(request, pk)
        approval.extend(data["minutes"], by=caller_of(request).user)
        return Response({"approval": approval_detail(self._get(request, pk))})

    @extend_schema(responses={200: dict})
    @action(detail=False, methods=["get"])
    def stats(self, request: Request) -> Response:
        return Response(approval_stats(caller_of(request).org))


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit", "100")
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= 500:
        raise Invalid({"limit": "Must be a whole number from 1 to 500."}, "limit must be from 1 to 500.")
    return limit


def approval_stats(org) -> dict[str, Any]:
    """Pending now; over the last 7 days: decisions, approval rate, median time to decide
    (people's decisions only: a deadline is not a decision time), expiries, and the same
    per calendar day in the org's time zone (for the dashboard's chart)."""
    now = timezone.now()
    since = now - timedelta(days=STATS_DAYS)
    approvals = ApprovalRequest.objects.for_org(org)
    # Both counts in one pass over the pending rows (the dashboard's queue renders these too).
    pending = approvals.pending().aggregate(pending=Count("id"), overdue=Count("id", filter=Q(timeout_at__lte=now)))
    rows = list(approvals.decided_since(since).values_list("state", "decided_by_label", "created", "decided_at"))
    count: dict[str, int] = defaultdict(int)
    days = {_day(now - timedelta(days=n), org): {"approved": 0, "rejected": 0, "expired": 0, "waits": []}
            for n in range(STATS_DAYS, -1, -1)}
    waits = []
    for state, label, created, decided_at in rows:
        day = days.get(_day(decided_at, org)) or {"approved": 0, "rejected": 0, "expired": 0, "waits": []}
        count[state] += 1
        day[state] += 1
        if label == TIMEOUT_LABEL:
            count["auto_approved"] += state == ApprovalRequest.State.APPROVED
        else:
            waits.append((decided_at - created).total_seconds())
            day["waits"].append(waits[-1])
    decided = len(rows)
    return {
        "pending": pending["pending"],
        "overdue": pending["overdue"],
        "window_days": STATS_DAYS,
        "since": since.isoformat(),
        "decided": decided,
        "approved": count["approved"],
        "auto_approved": count["auto_approved"],
        "rejected": count["rejected"],
        "expired": count["expired"],
        "approval_rate": round(count["approved"] / decided, 4) if decided else None,
        "median_time_to_decide_s": _median(waits),
        "per_day": [{"date": date, "approved": day["approved"], "rejected": day["rejected"],
                     "expired": day["expired"], "median_time_to_decide_s": _median(day["waits"])}
                    for date, day in days.items()],
    }


def _day(moment, org) -> str:
    return moment.astimezone(org.tz).date().isoformat()


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


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


SETTINGS_FIELDS = list(OrgSettingsSerializer._declared_fields)


def settings_dict(org) -> dict[str, Any]:
    return {"org": org.slug, "name": org.name, **{name: getattr(org, name) for name in SETTINGS_FIELDS}}


class OrgSettingsView(APIView):
    """The org's approval defaults and notification switches; admins change them."""

    def get_permissions(self):
        return [IsAdmin()] if self.request.method == "PATCH" else [IsMember()]

    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        return Response(settings_dict(caller_of(request).org))

    @extend_schema(request=OrgSettingsSerializer, responses={200: dict})
    def patch(self, request: Request) -> Response:
        data = validated(OrgSettingsSerializer, request.data, partial=True)
        org = caller_of(request).org
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


class WebhookViewSet(ViewSet):
    """Where an org's events go. Admins only: a webhook's URL and secret are sensitive."""

    lookup_value_regex = UUID_PATTERN
    permission_classes = [IsAdmin]

    def _get(self, request: Request, pk: str) -> OrgWebhook:
        try:
            uuid.UUID(pk)
        except ValueError:
            raise NotFound("No such webhook.", code="webhook_not_found") from None
        hook = OrgWebhook.objects.for_org(caller_of(request).org).filter(pk=pk).first()
        if hook is None:
            raise NotFound("No such webhook.", code="webhook_not_found")
        return hook

    @extend_schema(operation_id="v1_webhooks_list", responses={200: dict})
    def list(self, request: Request) -> Response:
        hooks = OrgWebhook.objects.for_org(caller_of(request).org)
        return Response({"webhooks": [webhook_dict(hook) for hook in hooks]})

    @extend_schema(request=WebhookSerializer, responses={201: dict})
    def create(self, request: Request) -> Response:
        data = validated(WebhookSerializer, request.data)
        org = caller_of(request).org
        if OrgWebhook.objects.for_org(org).count() >= MAX_WEBHOOKS_PER_ORG:
            raise Invalid({"url": f"An organization has at most {MAX_WEBHOOKS_PER_ORG} webhooks."},
                          f"An organization has at most {MAX_WEBHOOKS_PER_ORG} webhooks; delete one first.")
        hook = OrgWebhook.objects.create(org=org, **data)
        return Response(webhook_dict(hook, with_secret=True), status=201)

    @extend_schema(responses={200: dict})
    def retrieve(self, request: Request, pk: str) -> Response:
        hook = self._get(request, pk)
        deliveries = hook.deliveries.prefetch_related("attempt_log").order_by("-created")[:50]
        return Response({**webhook_dict(hook), "deliveries": [
            {**d.as_dict(), "attempt_log": [a.as_dict() for a in d.attempt_log.all()]} for d in deliveries]})

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, pk: str) -> Response:
        self._get(request, pk).delete()
        return Response(status=204)
