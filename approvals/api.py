"""Reviewer API: the approval queue and its decisions, stats, org settings, org webhooks.

People only (session with CSRF, or `Authorization: Token`): agent keys get 403 here, so an
agent can never decide on its own calls. Viewers read; reviewers and admins decide; admins
change settings and webhooks. Everything is scoped to the caller's org: another org's ids 404.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from approvals import events, shapes, slack
from approvals.models import EVENT_KINDS, MAX_GRANT_MINUTES, ApprovalRequest, Grant, OrgWebhook, SlackConnection
from core.errors import DomainError, Invalid
from core.outbound import check_target
from core.schema import errors, ok
from core.validation import StrictSerializer, validated
from effects.models import EffectTransition, Session, Tool
from orgs.auth import IsAdmin, IsMember, IsReviewer
from orgs.models import Agent, validate_time_zone
from orgs.views import OrgScopedAPIView, OrgScopedViewSet

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
    # Edit before approving: the call runs with these instead (checked by the model verb, so the
    # dashboard and Slack get the same limits).
    args = serializers.JSONField(required=False, default=None)


class RejectSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=2000)


MAX_BATCH = 100


class BatchSerializer(StrictSerializer):
    ids = serializers.ListField(child=serializers.UUIDField(), min_length=1, max_length=MAX_BATCH)
    decision = serializers.ChoiceField(choices=["approve", "reject"])
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    # Each id's digest as the reviewer saw it (optional): a request whose args differ is refused alone.
    args_digests = serializers.DictField(child=serializers.RegexField(r"^[0-9a-f]{64}$"), required=False,
                                         default=dict)


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


DECISION_ERRORS = errors(400, 403, 404, 409, codes={
    400: ["invalid"],
    403: ["run_starter_cannot_approve"],
    404: ["approval_not_found"],
    409: ["already_decided", "deadline_passed", "args_digest_mismatch", "session_not_awaiting_approval",
          "already_approved_by_you", "edit_needs_single_approver"]})


class ApprovalViewSet(OrgScopedViewSet):
    """The approval queue: list, read, approve, reject (and roll back), extend, stats."""

    queryset = ApprovalRequest.objects.select_related("effect__tool", "session__agent")
    not_found = ("approval_not_found", "No such approval request.")

    def get_permissions(self):
        if self.action in ("approve", "reject", "extend", "batch"):
            return [IsReviewer()]
        return [IsMember()]

    @extend_schema(operation_id="v1_approvals_list", parameters=[
        OpenApiParameter("state", str, enum=[*ApprovalRequest.State.values, ""],
                         description="pending: oldest deadline first; otherwise newest decision first."),
        OpenApiParameter("flagged", bool, description="true: only flagged calls (ran at once, review after; reject "
                                                      "undoes them); false: only held calls (waiting to run). "
                                                      "Absent: both."),
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
        if request.query_params.get("flagged", "") != "":
            approvals = approvals.filter(flagged=flag(request, "flagged"))
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
                       "args_digest": "3f7a" * 16}),
                       OpenApiExample("approve edited args", request_only=True, value={
                           "reason": "Capped the refund at the order's total.", "args_digest": "3f7a" * 16,
                           "args": {"order": "A-1001", "amount": 40}})])
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str) -> Response:
        data = validated(ApproveSerializer, request.data)
        approval = self.get_object()
        approval.approve(self.caller.user, data["reason"].strip(), data["args_digest"] or None, args=data["args"])
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

    @extend_schema(summary="Approve or reject several requests, each on its own", tags=["approvals"],
                   request=BatchSerializer, responses={**ok(shapes.BatchResultDict), **errors(400)},
                   examples=[OpenApiExample("batch", request_only=True, value={
                       "ids": ["0b1e…", "5c2d…"], "decision": "reject", "reason": "Not during the freeze."})])
    @action(detail=False, methods=["post"])
    def batch(self, request: Request) -> Response:
        """Each request is decided in its own transaction, bound to its own digest: one that was
        decided meanwhile (or whose args changed) is reported in its row, the others still go."""
        data = validated(BatchSerializer, request.data)
        if data["decision"] == "reject" and not data["reason"].strip():
            raise Invalid({"reason": "A reason is required to reject (each agent is told it)."},
                          "A reason is required to reject.")
        found = {a.pk: a for a in self.get_queryset().filter(pk__in=data["ids"])}
        results = [self._decide_one(found.get(pk), pk, data) for pk in dict.fromkeys(data["ids"])]
        return Response({"decision": data["decision"], "results": results,
                         "decided": sum(r["ok"] for r in results), "failed": sum(not r["ok"] for r in results)})

    def _decide_one(self, approval: ApprovalRequest | None, pk, data: dict) -> dict[str, Any]:
        if approval is None:
            return {"id": str(pk), "ok": False, "error": "approval_not_found", "message": "No such approval request."}
        try:
            if data["decision"] == "approve":
                digest = data["args_digests"].get(str(pk)) or approval.args_digest
                approval.approve(self.caller.user, data["reason"].strip(), digest)
            else:
                approval.reject(self.caller.user, data["reason"])
        except DomainError as exc:
            return {"id": str(pk), "ok": False, "error": exc.code, "message": exc.message}
        return {"id": str(pk), "ok": True, "state": approval.state, "decided_args_digest":
                approval.decided_args_digest or None}

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


# ---------------------------------------------------------------- grants


class GrantSerializer(StrictSerializer):
    agent = serializers.CharField(max_length=200)
    tool = serializers.CharField(max_length=200)
    session = serializers.UUIDField(required=False, default=None)
    minutes = serializers.IntegerField(min_value=1, max_value=MAX_GRANT_MINUTES, required=False, default=None)
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class GrantViewSet(OrgScopedViewSet):
    """Standing approvals of one tool for one agent (a run, or some minutes): listed, issued and
    revoked by reviewers. The intercept consults them only for calls that would wait for a person."""

    queryset = Grant.objects.select_related("agent")
    not_found = ("grant_not_found", "No such grant.")

    def get_permissions(self):
        return [IsMember()] if self.action == "list" else [IsReviewer()]

    @extend_schema(operation_id="v1_grants_list", summary="The org's grants, newest first", tags=["grants"],
                   parameters=[OpenApiParameter("live", bool, description="Only grants in force now.")],
                   responses=ok(shapes.GrantListDict))
    def list(self, request: Request) -> Response:
        grants = self.get_queryset().live() if flag(request, "live") else self.get_queryset()
        return Response({"grants": [g.as_dict() for g in grants[:200]]})

    @extend_schema(summary="Issue a grant: this tool for this agent, for a run or for some minutes",
                   tags=["grants"], request=GrantSerializer,
                   responses={**ok(shapes.GrantBodyDict, 201), **errors(400)},
                   examples=[OpenApiExample("for 30 minutes", request_only=True,
                                            value={"agent": "cleanup", "tool": "delete_account", "minutes": 30}),
                             OpenApiExample("for the rest of a run", request_only=True,
                                            value={"agent": "cleanup", "tool": "delete_account",
                                                   "session": "6f1c9b2e-0d3a-4c55-9a51-2f3e1d0c7b8a"})])
    def create(self, request: Request) -> Response:
        data = validated(GrantSerializer, request.data)
        org = self.org
        agent = Agent.objects.for_org(org).filter(name=data["agent"]).first()
        if agent is None:
            raise Invalid({"agent": "No agent of this name in your organization."}, "No such agent.")
        if not Tool.objects.for_org(org).filter(name=data["tool"]).exists():
            raise Invalid({"tool": "No tool of this name is registered in your organization."}, "No such tool.")
        session = None
        if data["session"] is not None:
            session = Session.objects.filter(pk=data["session"], agent=agent).first()
            if session is None:
                raise Invalid({"session": "No run of this agent with this id."}, "No such run of this agent.")
        grant = Grant.issue(org, agent, data["tool"], self.caller.user, session=session, minutes=data["minutes"],
                            reason=data["reason"].strip())
        return Response({"grant": grant.as_dict()}, status=201)

    @extend_schema(summary="Revoke a grant (the row stays: past decisions name it)", tags=["grants"],
                   responses={204: None, **errors(404, 409, codes={404: ["grant_not_found"], 409: ["grant_revoked"]})})
    def destroy(self, request: Request, pk: str) -> Response:
        self.get_object().revoke(self.caller.user)
        return Response(status=204)


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
    # Quorum by risk tag: {"payments": 2} — a call whose tool carries the tag needs two approvers.
    approvals_by_risk_tag = serializers.DictField(child=serializers.IntegerField(min_value=1, max_value=10),
                                                  required=False)

    def validate_approvals_by_risk_tag(self, value: dict[str, int]) -> dict[str, int]:
        if len(value) > 50 or any(not tag or len(tag) > 50 for tag in value):
            raise serializers.ValidationError("At most 50 risk tags of at most 50 characters each.")
        return value
    # Abandoned runs (lifecycle/abandon.py): 0 never; an agent may override it.
    run_idle_timeout_s = serializers.IntegerField(min_value=0, max_value=30 * 86400, required=False)
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


# ---------------------------------------------------------------- the org's webhook secret


class RotateSecretSerializer(StrictSerializer):
    overlap_s = serializers.IntegerField(
        min_value=0, max_value=30 * 86400, required=False, default=None, allow_null=True,
        help_text="How long the old secret keeps signing beside the new one (default: "
                  "UNDOLOG_KEY_ROTATION_GRACE_S, 24 h); 0 cuts it off at once.")


def secret_dict(org) -> dict[str, Any]:
    overlapping = len(org.signing_secrets()) == 2
    return {"secret": org.webhook_secret, "signing_secrets": len(org.signing_secrets()),
            "previous_secret_expires_at": org.previous_webhook_secret_expires_at if overlapping else None}


class OrgWebhookSecretView(OrgScopedAPIView):
    """The secret the org's compensation webhooks, executors and escalations are signed with
    (admins): what a receiver verifies `Undolog-Signature` against."""

    permission_classes = [IsAdmin]

    @extend_schema(summary="Read the org's webhook signing secret (admins)", tags=["org"],
                   responses=ok(shapes.WebhookSecretDict))
    def get(self, request: Request) -> Response:
        return Response(secret_dict(self.org))


class RotateWebhookSecretView(OrgScopedAPIView):
    permission_classes = [IsAdmin]

    @extend_schema(summary="Rotate the org's webhook signing secret (admins)", tags=["org"],
                   description="A new secret signs at once; the old one signs beside it (a second `v1=` "
                               "in `Undolog-Signature`) until `previous_secret_expires_at`, so a receiver "
                               "holding either verifies meanwhile, and only the new one after.",
                   request=RotateSecretSerializer,
                   responses={**ok(shapes.WebhookSecretDict),
                              **errors(400, 409, codes={409: ["webhook_secret_rotated"]})})
    def post(self, request: Request) -> Response:
        data = validated(RotateSecretSerializer, request.data)
        overlap = None if data["overlap_s"] is None else timedelta(seconds=data["overlap_s"])
        org = self.org
        org.rotate_webhook_secret(overlap)
        return Response(secret_dict(org))


# ---------------------------------------------------------------- Slack


class SlackSerializer(StrictSerializer):
    # Write-only: stored sealed, never returned (only the token's last four characters).
    bot_token = serializers.RegexField(r"^xox[a-z]-[A-Za-z0-9-]{8,250}$", required=False, write_only=True,
                                       error_messages={"invalid": "Must be the app's bot token (xoxb-…)."})
    signing_secret = serializers.RegexField(r"^[0-9a-f]{16,128}$", required=False, write_only=True,
                                            error_messages={"invalid": "Must be the app's signing secret (hex)."})
    channel = serializers.RegexField(r"^[#A-Za-z0-9._-]{1,100}$", required=False,
                                     error_messages={"invalid": "Must be a channel ID (C0123…) or name."})
    active = serializers.BooleanField(required=False)


def slack_dict(connection: SlackConnection | None, request: Request) -> dict[str, Any]:
    if connection is None:
        return {"connected": False, "channel": None, "active": False, "bot_token_hint": None,
                "interactions_url": None}
    return {"connected": True, "channel": connection.channel, "active": connection.active,
            "bot_token_hint": connection.bot_token_hint,
            "interactions_url": slack.interactions_url(connection, request)}


class SlackView(OrgScopedAPIView):
    """The org's Slack app (admins): connect with a bot token, signing secret and channel; the
    secrets are write-only. New approval requests then go to the channel with Approve / Reject."""

    permission_classes = [IsAdmin]

    @extend_schema(summary="Read the org's Slack connection (never its secrets)", tags=["org"],
                   responses=ok(shapes.SlackDict))
    def get(self, request: Request) -> Response:
        return Response(slack_dict(SlackConnection.objects.filter(org=self.org).first(), request))

    @extend_schema(summary="Connect or change the org's Slack app", tags=["org"], request=SlackSerializer,
                   responses={**ok(shapes.SlackDict), **errors(400)},
                   examples=[OpenApiExample("connect", request_only=True, value={
                       "bot_token": "xoxb-1234-5678-abcdefgh", "signing_secret": "8f742231b10e8888abcd990000111a5",
                       "channel": "C0123ABCDEF"})])
    def put(self, request: Request) -> Response:
        data = validated(SlackSerializer, request.data)
        connection = SlackConnection.objects.filter(org=self.org).first() or SlackConnection(org=self.org)
        if connection._state.adding:
            missing = {name: "Required to connect Slack." for name in ("bot_token", "signing_secret", "channel")
                       if not data.get(name)}
            if missing:
                raise Invalid(missing, "Connecting Slack takes the bot token, the signing secret and a channel.")
        connection.set_secrets(data.get("bot_token"), data.get("signing_secret"))
        for name in ("channel", "active"):
            if name in data:
                setattr(connection, name, data[name])
        connection.updated = timezone.now()
        connection.save()
        return Response(slack_dict(connection, request))

    @extend_schema(summary="Disconnect Slack (its secrets are deleted)", tags=["org"], responses={204: None})
    def delete(self, request: Request) -> Response:
        SlackConnection.objects.filter(org=self.org).delete()
        return Response(status=204)


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
