"""Slack approvals: new requests posted to an org's channel with Approve / Reject buttons, the
buttons deciding through the same model verbs as the dashboard, and every message kept in step
with its request's state.

Posting and updating are the worker's (`tasks.sync_slack`, the
`sweep_slack` beat), from `SlackMessage` rows: nothing here runs in the intercept. The
interaction endpoint (`POST /slack/interactions/<connection id>`) runs in Slack's request:

1. verify Slack's signature and timestamp with the org's signing secret (else 401);
2. map the Slack user to a reviewer of the org: an explicit link, else the user's verified
   email (users.info), learned as a link (else 403 `slack_user_unknown`);
3. Approve: `ApprovalRequest.approve` bound to the digest the message showed; Reject: a modal
   asks for the reason (views.open), and its submission calls `ApprovalRequest.reject`;
4. the decision's `approval.decided` event brings the worker to update the message;
5. a press that fails (an unknown user, a decided request, someone outside the request's
   reviewer group) keeps its status code and is also told to the presser alone, as an
   ephemeral message: Slack itself shows a failed press only as a warning icon.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings
from django.db import transaction
from django.dispatch import Signal
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.webhook import WebhookClient

from approvals.events import why_text
from approvals.models import ApprovalRequest, SlackConnection, SlackMessage, SlackUserLink
from core.errors import DomainError
from orgs.models import Event, Membership

log = logging.getLogger(__name__)

# A message row out of step with its request was written (`message_id`), sent after commit: its
# receiver (approvals/apps.py) enqueues `tasks.sync_slack`, whose module imports the fan-out that
# sends this. Lost, it loses nothing: `sweep_slack` finds rows not in step.
message_due = Signal()

APPROVE, REJECT, REJECT_MODAL = "undolog_approve", "undolog_reject", "undolog_reject_reason"
MAX_ARGS_SHOWN = 2500  # a section's text is at most 3000 characters


def interactions_url(connection: SlackConnection, request: HttpRequest) -> str:
    """Where Slack posts the buttons' presses: under UNDOLOG_PUBLIC_URL, else under the address
    the person reached this server at (what the settings page and the API show)."""
    base = settings.UNDOLOG_PUBLIC_URL or request.build_absolute_uri("/").rstrip("/")
    return f"{base}/slack/interactions/{connection.pk}"


def client(connection: SlackConnection) -> WebClient:
    return WebClient(token=connection.bot_token, base_url=settings.UNDOLOG_SLACK_API_URL, timeout=10)


# ---------------------------------------------------------------- the message


def message(approval: ApprovalRequest) -> dict[str, Any]:
    """`text` and Block Kit `blocks` for the request as it is now: buttons while pending, who
    decided once decided. Load with `select_related("session__agent", "effect")`."""
    agent = approval.session.agent.name
    text = f"{agent} asks to run {approval.tool_name}"
    args = json.dumps(approval.proposed_args, indent=1, sort_keys=True, ensure_ascii=False)
    if len(args) > MAX_ARGS_SHOWN:
        args = args[: MAX_ARGS_SHOWN - 1] + "…"
    fields = [f"*Agent*\n{agent}", f"*Tool*\n{approval.tool_name}",
              f"*Risk*\n{', '.join(approval.risk_tags) or '-'}",
              f"*Impact*\n{approval.estimated_impact or '-'}"]
    if approval.reviewer_group_name or approval.approvals_required > 1:
        who = f"from *{approval.reviewer_group_name}*" if approval.reviewer_group_name else "distinct reviewers"
        fields.append(f"*Needs*\n{approval.approvals_required} {who} ({approval.quorum} so far)")
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*{text}*\n{approval.reason}"}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in fields]},
        {"type": "section", "text": {"type": "mrkdwn", "text": f"```{args}```"}},
    ]
    why = why_text(approval.why)
    if why:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"*Why it waits*\n{why[:2900]}"}})
    reasoning = (approval.effect.reasoning or "").strip()
    if reasoning:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": reasoning[:1500]}]})
    if approval.state == ApprovalRequest.State.PENDING:
        blocks.append({"type": "actions", "block_id": f"undolog:{approval.pk}", "elements": [
            _button(APPROVE, "Approve", "primary", f"{approval.pk}:{approval.args_digest}"),
            _button(REJECT, "Reject", "danger", str(approval.pk))]})
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": _deadline(approval)}]})
    else:
        blocks.append({"type": "section", "block_id": f"undolog:{approval.pk}",
                       "text": {"type": "mrkdwn", "text": decided_line(approval)}})
        text = f"{text}: {approval.state}"
    return {"text": text, "blocks": blocks}


def _button(action_id: str, text: str, style: str, value: str) -> dict[str, Any]:
    # The approve button carries the digest shown: the decision binds to the args in the message.
    return {"type": "button", "action_id": action_id, "style": style, "value": value,
            "text": {"type": "plain_text", "text": text}}


def decided_line(approval: ApprovalRequest) -> str:
    mark = {"approved": ":white_check_mark:", "rejected": ":no_entry:", "expired": ":hourglass:"}[approval.state]
    who = "when the deadline passed" if approval.decided_by_label == "timeout" else f"by *{approval.decided_by_label}*"
    edited = " with edited arguments" if approval.effect.approved_args is not None else ""
    why = f": “{approval.decision_reason}”" if approval.decision_reason else ""
    return f"{mark} *{approval.state.capitalize()}*{edited} {who}{why}"


def _deadline(approval: ApprovalRequest) -> str:
    link = f" · <{settings.UNDOLOG_PUBLIC_URL}/approvals/{approval.pk}/|open in undolog>" \
        if settings.UNDOLOG_PUBLIC_URL else ""
    then = "approved automatically" if approval.auto_approve_on_timeout else "it expires"
    return f"Decide by {approval.timeout_at.astimezone(approval.org.tz):%a %H:%M %Z}; then {then}{link}"


# ---------------------------------------------------------------- the worker's side


def on_event(event: Event) -> SlackMessage | None:
    """An approval event of an org with Slack: a request gets its message row (once); a
    decision or an expiry re-syncs the message the request already has (a message is synced
    when its request's state is not the one it shows: an extension or a partial quorum does not
    change the state, so the deadline and "1 of 2" in Slack are those of when it was posted)."""
    approval_id = (event.data.get("approval") or {}).get("id")
    if not approval_id:
        return None
    if event.kind == "approval.requested":
        connection = SlackConnection.objects.filter(org_id=event.org_id, active=True).first()
        if connection is None:
            return None
        row, _ = SlackMessage.objects.get_or_create(approval_id=approval_id, defaults={"connection": connection})
        return row
    return SlackMessage.objects.filter(approval_id=approval_id).first()


def sync(message_id: Any) -> str:
    """Post the message, or update it to the request's state. Idempotent: a claim holds the row,
    and the state shown is saved with the ts, so a second run finds nothing to do."""
    row = SlackMessage.objects.select_related("connection", "approval__session__agent", "approval__effect",
                                              "approval__org").filter(pk=message_id).first()
    if row is None or not row.claim():
        return "held"
    approval = row.approval
    if row.ts and row.shown_state == approval.state:
        SlackMessage.objects.filter(pk=row.pk).update(claimed_at=None)
        return "in step"
    body = message(approval)
    try:
        web = client(row.connection)
        if row.ts:
            answer = web.chat_update(channel=row.channel, ts=row.ts, **body)
        else:
            answer = web.chat_postMessage(channel=row.connection.channel, **body)
    except (SlackApiError, SlackClientError, OSError) as exc:
        error = exc.response.get("error") if isinstance(exc, SlackApiError) else str(exc)
        log.warning("Slack message of approval %s not sent: %s", approval.pk, error)
        SlackMessage.objects.filter(pk=row.pk).update(claimed_at=None, attempts=row.attempts + 1,
                                                      last_error=str(error)[:2000])
        return "failed"
    SlackMessage.objects.filter(pk=row.pk).update(
        claimed_at=None, attempts=0, last_error="", ts=answer.get("ts") or row.ts,
        channel=answer.get("channel") or row.channel, shown_state=approval.state)
    return "updated" if row.ts else "posted"


# ---------------------------------------------------------------- Slack's requests


class Unauthenticated(DomainError):
    status_code = 401
    code = "bad_signature"


def handle(connection: SlackConnection, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """One interaction request from Slack: (status, JSON body)."""
    verifier = SignatureVerifier(connection.signing_secret)
    if not verifier.is_valid(body, headers.get("X-Slack-Request-Timestamp"), headers.get("X-Slack-Signature")):
        raise Unauthenticated("Slack's signature or timestamp did not verify (wrong secret, or older than 5 minutes).")
    try:
        payload = json.loads(parse_qs(body.decode())["payload"][0])
    except (KeyError, ValueError, UnicodeDecodeError):
        return 400, {"error": "invalid", "message": "Expected a form field `payload` holding JSON."}
    kind = payload.get("type")
    if kind == "block_actions":
        try:
            return _pressed(connection, payload)
        except DomainError as exc:
            # Slack shows a failed button press only as a warning icon: say why, to the presser alone.
            tell(connection, payload, f":warning: {exc.message}")
            raise
    if kind == "view_submission" and (payload.get("view") or {}).get("callback_id") == REJECT_MODAL:
        return _reason_given(connection, payload)
    return 200, {}  # other interactions (shortcuts, closing a modal) need nothing from us


def _pressed(connection: SlackConnection, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    action = next((a for a in payload.get("actions") or [] if a.get("action_id") in (APPROVE, REJECT)), None)
    if action is None:
        return 200, {}
    approval_id, _, digest = str(action.get("value") or "").partition(":")
    approval = _approval(connection, approval_id)
    user = reviewer_for(connection, (payload.get("user") or {}).get("id", ""))
    if action["action_id"] == APPROVE:
        approval.approve(user, "Approved in Slack.", digest or None)
        return 200, {"ok": True, "approval": str(approval.pk), "state": approval.state}
    if approval.state != ApprovalRequest.State.PENDING:
        raise DomainError(f"This request was already {approval.state}.", code="already_decided", status_code=409)
    client(connection).views_open(trigger_id=payload.get("trigger_id"), view=reject_modal(approval))
    return 200, {"ok": True, "approval": str(approval.pk), "state": approval.state, "modal": True}


def reject_modal(approval: ApprovalRequest) -> dict[str, Any]:
    return {
        "type": "modal", "callback_id": REJECT_MODAL, "private_metadata": str(approval.pk),
        "title": {"type": "plain_text", "text": "Reject the call"},
        "submit": {"type": "plain_text", "text": "Reject"}, "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn",
                                         "text": f"*{approval.tool_name}* for *{approval.session.agent.name}*"}},
            {"type": "input", "block_id": "reason",
             "label": {"type": "plain_text", "text": "Reason (the agent is told)"},
             "element": {"type": "plain_text_input", "action_id": "reason", "multiline": True, "max_length": 2000}},
        ],
    }


def _reason_given(connection: SlackConnection, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    view = payload["view"]
    reason = (((view.get("state") or {}).get("values") or {}).get("reason") or {}).get("reason", {}).get("value")
    try:
        approval = _approval(connection, view.get("private_metadata", ""))
        user = reviewer_for(connection, (payload.get("user") or {}).get("id", ""))
        approval.reject(user, reason or "")
    except DomainError as exc:
        # Said in the modal, next to the reason (Slack keeps it open).
        return 200, {"response_action": "errors", "errors": {"reason": exc.message}}
    return 200, {}


def tell(connection: SlackConnection, payload: dict[str, Any], text: str) -> None:
    """An ephemeral reply to whoever pressed: through the interaction's `response_url` (signed
    with the payload, so it is Slack's), else chat.postEphemeral. Best effort, a few seconds at
    most: Slack wants the interaction answered within three."""
    user = (payload.get("user") or {}).get("id", "")
    try:
        if payload.get("response_url"):
            WebhookClient(payload["response_url"], timeout=2).send(text=text, response_type="ephemeral",
                                                                   replace_original=False)
        elif (payload.get("channel") or {}).get("id") and user:
            client(connection).chat_postEphemeral(channel=payload["channel"]["id"], user=user, text=text)
    except (SlackApiError, SlackClientError, OSError) as exc:
        log.info("could not tell %s why their press failed: %s", user, exc)


def _approval(connection: SlackConnection, approval_id: str) -> ApprovalRequest:
    try:
        pk = uuid.UUID(str(approval_id))
    except ValueError:
        pk = None
    approval = pk and (ApprovalRequest.objects.select_related("session__agent", "effect", "org")
                       .filter(org_id=connection.org_id, pk=pk).first())
    if not approval:
        raise DomainError("No such approval request in this organization.", code="approval_not_found",
                          status_code=404)
    return approval


class UnknownSlackUser(DomainError):
    status_code = 403
    code = "slack_user_unknown"


def reviewer_for(connection: SlackConnection, slack_user: str):
    """The org's reviewer (or admin) behind a Slack user: an explicit link, else a member whose
    email is the Slack user's verified one (learned as a link). Anyone else is refused."""
    link = SlackUserLink.objects.select_related("user").filter(org_id=connection.org_id, slack_user=slack_user).first()
    user = link.user if link is not None else _by_verified_email(connection, slack_user)
    membership = Membership.objects.filter(org_id=connection.org_id, user=user).first() if user else None
    if membership is None or not user.is_active or not membership.has_role(Membership.Role.REVIEWER):
        raise UnknownSlackUser("This Slack user is not a reviewer of the organization: link them in undolog "
                               "(admin) or give them a reviewer role under their verified email.",
                               slack_user=slack_user)
    return user


def _by_verified_email(connection: SlackConnection, slack_user: str):
    if not slack_user:
        return None
    try:
        info = client(connection).users_info(user=slack_user)
    except (SlackApiError, SlackClientError, OSError) as exc:
        log.info("users.info of %s failed: %s", slack_user, exc)
        return None
    person = info.get("user") or {}
    email = (person.get("profile") or {}).get("email") or ""
    if not email or not person.get("is_email_confirmed") or person.get("deleted"):
        return None
    # Only people who may decide are learned: a viewer's press is refused and leaves no link.
    members = list(Membership.objects.select_related("user").filter(
        org_id=connection.org_id, user__email__iexact=email,
        role__in=[Membership.Role.REVIEWER, Membership.Role.ADMIN])[:2])
    if len(members) != 1:
        return None  # nobody, or two accounts share the address: an admin links explicitly
    with transaction.atomic():
        SlackUserLink.objects.get_or_create(org_id=connection.org_id, slack_user=slack_user,
                                            defaults={"user": members[0].user, "learned": True,
                                                      "created": timezone.now()})
    return members[0].user


# ---------------------------------------------------------------- the endpoint


@csrf_exempt
@require_POST
def interactions(request: HttpRequest, connection_id) -> JsonResponse:
    """`POST /slack/interactions/<connection id>`: the Request URL of the org's Slack app."""
    connection = SlackConnection.objects.select_related("org").filter(pk=connection_id, active=True).first()
    if connection is None:
        return JsonResponse({"error": "not_found", "message": "No such Slack connection."}, status=404)
    try:
        status, body = handle(connection, request.body, request.headers)
    except DomainError as exc:
        status, body = exc.status_code, exc.body()
    return JsonResponse(body, status=status)
