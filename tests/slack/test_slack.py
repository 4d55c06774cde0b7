"""Slack approvals end to end: a fake of Slack's Web API (a real local HTTP server) receives the
worker's Block Kit message; signed button presses decide through the same verbs; bad or stale
signatures are 401, unknown Slack users 403 (and a failed press is told to the presser alone);
a decision made anywhere updates the message."""

from __future__ import annotations

import json
import time
from urllib.parse import urlencode

import pytest
from slack_sdk.signature import SignatureVerifier

from approvals.models import ApprovalRequest, SlackConnection, SlackMessage, SlackUserLink, unseal
from approvals.slack import message as slack_message
from budgets.models import Refusal
from tests.approvals.conftest import hold
from tests.slack.conftest import BOT_TOKEN, SIGNING_SECRET

pytestmark = pytest.mark.django_db(transaction=True)


def connect(persona, **extra) -> dict:
    response = persona.admin.put("/api/v1/org/slack", {"bot_token": BOT_TOKEN, "signing_secret": SIGNING_SECRET,
                                                       "channel": "C0APPROVALS", **extra}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def slack_user(fake, persona, slack_id: str = "U0REVIEWER", *, role: str = "reviewer", confirmed: bool = True):
    user = getattr(persona, role).user
    user.email = f"{user.username}@acme.example"
    user.save(update_fields=["email"])
    fake.users[slack_id] = {"id": slack_id, "is_email_confirmed": confirmed, "deleted": False,
                            "profile": {"email": user.email.upper()}}  # Slack's case need not be ours


def press(client, connection_id: str, payload: dict, *, secret: str = SIGNING_SECRET, age_s: int = 0):
    """POST what Slack posts: a form field `payload`, signed with the app's signing secret."""
    body = urlencode({"payload": json.dumps(payload)})
    timestamp = str(int(time.time()) - age_s)
    signature = SignatureVerifier(secret).generate_signature(timestamp=timestamp, body=body)
    return client.post(f"/slack/interactions/{connection_id}", body, content_type="application/x-www-form-urlencoded",
                       HTTP_X_SLACK_REQUEST_TIMESTAMP=timestamp, HTTP_X_SLACK_SIGNATURE=signature)


def button(approval: ApprovalRequest, action: str, slack_id: str = "U0REVIEWER", respond_to: str = "") -> dict:
    value = f"{approval.pk}:{approval.args_digest}" if action == "undolog_approve" else str(approval.pk)
    return {"type": "block_actions", "user": {"id": slack_id}, "trigger_id": "T-123.456",
            **({"response_url": respond_to} if respond_to else {"channel": {"id": "C0APPROVALS"}}),
            "actions": [{"action_id": action, "value": value, "type": "button"}]}


def posted_for(fake, approval_id: str, method: str = "chat.postMessage", timeout: float = 15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        calls = [c for c in fake.called(method) if approval_id in json.dumps(c.args)]
        if calls:
            return calls
        time.sleep(0.05)
    raise AssertionError(f"no {method} for {approval_id}: {[c.method for c in fake.calls]}")


def test_connecting_seals_the_secrets_and_never_shows_them(acme, client):
    body = connect(acme)

    assert body["connected"] and body["channel"] == "C0APPROVALS" and body["bot_token_hint"] == "…oken"
    assert BOT_TOKEN not in json.dumps(body) and SIGNING_SECRET not in json.dumps(body)
    row = SlackConnection.objects.get()
    assert BOT_TOKEN not in row.sealed_bot_token and unseal(row.sealed_bot_token) == BOT_TOKEN
    assert row.signing_secret == SIGNING_SECRET
    assert body["interactions_url"].endswith(f"/slack/interactions/{row.pk}")
    assert BOT_TOKEN not in acme.admin.get("/api/v1/org/slack").content.decode()
    # A change of channel keeps the secrets; write-only fields are not required again.
    assert acme.admin.put("/api/v1/org/slack", {"channel": "C0OTHER"}, format="json").json()["channel"] == "C0OTHER"
    assert SlackConnection.objects.get().bot_token == BOT_TOKEN


def test_connecting_is_for_admins_and_refuses_bad_input(acme, outsider):
    assert acme.reviewer.put("/api/v1/org/slack", {"channel": "C1"}, format="json").status_code == 403
    assert acme.api.get("/api/v1/org/slack").status_code == 403
    first = acme.admin.put("/api/v1/org/slack", {"channel": "C1"}, format="json")
    assert first.status_code == 400 and set(first.json()["fields"]) == {"bot_token", "signing_secret"}
    bad = acme.admin.put("/api/v1/org/slack", {"bot_token": "hunter2", "signing_secret": SIGNING_SECRET,
                                               "channel": "C1"}, format="json")
    assert bad.status_code == 400 and "bot_token" in bad.json()["fields"]
    assert not SlackConnection.objects.exists()
    connect(acme)
    assert outsider.admin.get("/api/v1/org/slack").json()["connected"] is False
    assert acme.admin.delete("/api/v1/org/slack").status_code == 204
    assert not SlackConnection.objects.exists()


def test_the_worker_posts_a_new_request_with_approve_and_reject_buttons(acme, worker, fake_slack):
    connect(acme)
    approval_id = hold(acme, args={"account_id": "acct-7"})["approval"]["id"]

    call = posted_for(fake_slack, approval_id)[0]

    assert call.token == BOT_TOKEN and call.args["channel"] == "C0APPROVALS"
    assert "cleanup asks to run delete_account" in call.args["text"]
    actions = next(b for b in call.args["blocks"] if b["type"] == "actions")["elements"]
    approval = ApprovalRequest.objects.get(pk=approval_id)
    assert [(a["action_id"], a["value"]) for a in actions] == [
        ("undolog_approve", f"{approval_id}:{approval.args_digest}"), ("undolog_reject", approval_id)]
    assert "acct-7" in json.dumps(call.args["blocks"])
    deadline = time.monotonic() + 10
    while not SlackMessage.objects.filter(approval_id=approval_id).exclude(ts="").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert SlackMessage.objects.get(approval_id=approval_id).shown_state == "pending"


def test_a_signed_approve_press_decides_and_the_message_names_who(acme, worker, fake_slack, client):
    connection_id = connect(acme)["interactions_url"].rsplit("/", 1)[-1]
    approval_id = hold(acme)["approval"]["id"]
    posted_for(fake_slack, approval_id)
    slack_user(fake_slack, acme)

    response = press(client, connection_id, button(ApprovalRequest.objects.get(pk=approval_id), "undolog_approve"))

    assert response.status_code == 200, response.content
    approval = ApprovalRequest.objects.get(pk=approval_id)
    assert (approval.state, approval.decided_by_label) == ("approved", "acme-reviewer")
    assert approval.decided_args_digest == approval.args_digest
    assert SlackUserLink.objects.get(slack_user="U0REVIEWER").learned
    update = posted_for(fake_slack, approval_id, "chat.update")[0]
    assert update.args["ts"] and "acme-reviewer" in json.dumps(update.args["blocks"])
    assert not any(b["type"] == "actions" for b in update.args["blocks"])  # no buttons once decided


def test_a_decision_made_in_the_dashboard_updates_the_slack_message(acme, worker, fake_slack):
    connect(acme)
    approval_id = hold(acme)["approval"]["id"]
    posted_for(fake_slack, approval_id)
    deadline = time.monotonic() + 10
    while not SlackMessage.objects.filter(approval_id=approval_id).exclude(ts="").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)

    acme.reviewer.post(f"/api/v1/approvals/{approval_id}/reject", {"reason": "open invoice"}, format="json")

    update = posted_for(fake_slack, approval_id, "chat.update")[0]
    text = json.dumps(update.args["blocks"])
    assert "Rejected" in text and "acme-reviewer" in text and "open invoice" in text


def test_reject_opens_a_modal_and_its_submission_rejects_with_the_reason(acme, client, fake_slack):
    row = SlackConnection(org=acme.org, channel="C0APPROVALS")
    row.set_secrets(BOT_TOKEN, SIGNING_SECRET)
    row.save()
    approval = ApprovalRequest.objects.get(pk=hold(acme)["approval"]["id"])
    slack_user(fake_slack, acme)

    opened = press(client, row.pk, button(approval, "undolog_reject"))

    assert opened.status_code == 200, opened.content
    view = fake_slack.called("views.open")[0].args
    assert view["trigger_id"] == "T-123.456" and view["view"]["private_metadata"] == str(approval.pk)
    assert ApprovalRequest.objects.get(pk=approval.pk).state == "pending"
    submitted = {"type": "view_submission", "user": {"id": "U0REVIEWER"},
                 "view": {"callback_id": "undolog_reject_reason", "private_metadata": str(approval.pk),
                          "state": {"values": {"reason": {"reason": {"type": "plain_text_input",
                                                                     "value": "The ticket was closed."}}}}}}
    assert press(client, row.pk, submitted).status_code == 200
    approval.refresh_from_db()
    assert (approval.state, approval.decided_by_label, approval.decision_reason) == (
        "rejected", "acme-reviewer", "The ticket was closed.")
    assert Refusal.objects.get().decided_by == "acme-reviewer"
    # An empty reason is said in the modal, and decides nothing.
    other = ApprovalRequest.objects.get(pk=hold(acme)["approval"]["id"])
    submitted["view"]["private_metadata"] = str(other.pk)
    submitted["view"]["state"]["values"]["reason"]["reason"]["value"] = ""
    answer = press(client, row.pk, submitted).json()
    assert answer["response_action"] == "errors" and "reason" in answer["errors"]
    assert ApprovalRequest.objects.get(pk=other.pk).state == "pending"


@pytest.mark.parametrize("forgery", ["wrong secret", "stale", "unsigned"])
def test_a_bad_or_stale_signature_is_401_and_decides_nothing(acme, client, fake_slack, forgery):
    row = SlackConnection(org=acme.org, channel="C0APPROVALS")
    row.set_secrets(BOT_TOKEN, SIGNING_SECRET)
    row.save()
    approval = ApprovalRequest.objects.get(pk=hold(acme)["approval"]["id"])
    slack_user(fake_slack, acme)
    payload = button(approval, "undolog_approve")

    if forgery == "wrong secret":
        response = press(client, row.pk, payload, secret="0" * 32)
    elif forgery == "stale":
        response = press(client, row.pk, payload, age_s=6 * 60)  # Slack's window is 5 minutes
    else:
        response = client.post(f"/slack/interactions/{row.pk}", urlencode({"payload": json.dumps(payload)}),
                                content_type="application/x-www-form-urlencoded")

    assert response.status_code == 401 and response.json()["error"] == "bad_signature"
    assert ApprovalRequest.objects.get(pk=approval.pk).state == "pending"
    assert fake_slack.called("users.info") == []


@pytest.mark.parametrize("who", ["not in slack's answer", "email not verified", "a viewer", "another org"])
def test_an_unknown_slack_user_is_refused(acme, outsider, client, fake_slack, who):
    row = SlackConnection(org=acme.org, channel="C0APPROVALS")
    row.set_secrets(BOT_TOKEN, SIGNING_SECRET)
    row.save()
    approval = ApprovalRequest.objects.get(pk=hold(acme)["approval"]["id"])
    if who == "email not verified":
        slack_user(fake_slack, acme, confirmed=False)
    elif who == "a viewer":
        slack_user(fake_slack, acme, role="viewer")
    elif who == "another org":
        slack_user(fake_slack, outsider)

    response = press(client, row.pk, button(approval, "undolog_approve"))

    assert response.status_code == 403 and response.json()["error"] == "slack_user_unknown"
    assert ApprovalRequest.objects.get(pk=approval.pk).state == "pending"
    assert not SlackUserLink.objects.exists()


def test_an_explicit_link_needs_no_email_and_another_orgs_request_is_404(acme, outsider, client, fake_slack):
    row = SlackConnection(org=acme.org, channel="C0APPROVALS")
    row.set_secrets(BOT_TOKEN, SIGNING_SECRET)
    row.save()
    SlackUserLink.objects.create(org=acme.org, slack_user="U0LINKED", user=acme.admin.user)
    foreign = ApprovalRequest.objects.get(pk=hold(outsider)["approval"]["id"])
    assert press(client, row.pk, button(foreign, "undolog_approve", "U0LINKED")).status_code == 404
    assert ApprovalRequest.objects.get(pk=foreign.pk).state == "pending"

    approval = ApprovalRequest.objects.get(pk=hold(acme)["approval"]["id"])
    assert press(client, row.pk, button(approval, "undolog_approve", "U0LINKED")).status_code == 200
    assert ApprovalRequest.objects.get(pk=approval.pk).decided_by_label == "acme-admin"
    assert fake_slack.called("users.info") == []
    again = press(client, row.pk, button(approval, "undolog_approve", "U0LINKED"))
    assert again.status_code == 409 and again.json()["error"] == "already_decided"


def test_the_admin_and_the_settings_page_take_the_secrets_and_never_show_them(acme, client):
    from django.contrib.auth import get_user_model

    staff = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(staff)
    added = client.post("/admin/approvals/slackconnection/add/", {
        "org": acme.org.pk, "channel": "C0ADMIN", "active": "on", "bot_token": BOT_TOKEN,
        "signing_secret": SIGNING_SECRET})
    assert added.status_code == 302, added.content.decode()[:2000]
    row = SlackConnection.objects.get()
    assert (row.bot_token, row.signing_secret) == (BOT_TOKEN, SIGNING_SECRET)
    change = client.get(f"/admin/approvals/slackconnection/{row.pk}/change/").content.decode()
    assert BOT_TOKEN not in change and SIGNING_SECRET not in change and row.sealed_bot_token not in change
    client.post(f"/admin/approvals/slackconnection/{row.pk}/change/", {
        "org": acme.org.pk, "channel": "C0NEW", "active": "on", "bot_token": "", "signing_secret": ""})
    row.refresh_from_db()
    assert (row.channel, row.bot_token) == ("C0NEW", BOT_TOKEN)  # blank: unchanged

    client.force_login(acme.admin.user)
    page = client.get("/settings/").content.decode()
    assert "C0NEW" in page and f"/slack/interactions/{row.pk}" in page and BOT_TOKEN not in page


def connected(persona) -> SlackConnection:
    row = SlackConnection(org=persona.org, channel="C0APPROVALS")
    row.set_secrets(BOT_TOKEN, SIGNING_SECRET)
    row.save()
    return row


def told(fake, method: str = "respond") -> list[str]:
    return [c.args.get("text", "") for c in fake.called(method)]


def test_a_failed_press_is_explained_to_the_presser_alone(acme, client, fake_slack):
    row = connected(acme)
    approval = ApprovalRequest.objects.get(pk=hold(acme)["approval"]["id"])

    unknown = press(client, row.pk, button(approval, "undolog_approve", "U0STRANGER", fake_slack.response_url))

    assert (unknown.status_code, unknown.json()["error"]) == (403, "slack_user_unknown")
    [said] = told(fake_slack)
    assert "not a reviewer of the organization" in said
    assert fake_slack.called("respond")[0].args["response_type"] == "ephemeral"
    assert fake_slack.called("respond")[0].args["replace_original"] is False

    slack_user(fake_slack, acme)
    assert press(client, row.pk, button(approval, "undolog_approve")).status_code == 200
    late = press(client, row.pk, button(approval, "undolog_reject", respond_to=fake_slack.response_url))

    assert (late.status_code, late.json()["error"]) == (409, "already_decided")
    assert told(fake_slack)[-1] == ":warning: This request was already approved."


def test_without_a_response_url_the_explanation_is_a_chat_ephemeral(acme, client, fake_slack):
    row = connected(acme)
    approval = ApprovalRequest.objects.get(pk=hold(acme)["approval"]["id"])

    press(client, row.pk, button(approval, "undolog_approve", "U0STRANGER"))

    [call] = fake_slack.called("chat.postEphemeral")
    assert (call.args["channel"], call.args["user"]) == ("C0APPROVALS", "U0STRANGER")
    assert "not a reviewer" in call.args["text"]


def test_a_reviewer_outside_the_requests_group_is_refused_in_slack_too(acme, client, fake_slack):
    row = connected(acme)
    hold(acme)  # registers the tools
    group = acme.admin.post("/api/v1/reviewer-groups", {"name": "finance", "members": ["acme-admin"]}, format="json")
    assert group.status_code == 201, group.content
    rule = acme.admin.post("/api/v1/rules", {"name": "to-finance", "condition": "true", "outcome": "require",
                                             "reviewer_group": "finance"}, format="json")
    assert rule.status_code == 201, rule.content
    approval = ApprovalRequest.objects.get(pk=hold(acme)["approval"]["id"])
    assert "from *finance*" in json.dumps(slack_message(approval))
    slack_user(fake_slack, acme)

    response = press(client, row.pk, button(approval, "undolog_approve", respond_to=fake_slack.response_url))

    assert (response.status_code, response.json()["error"]) == (403, "not_in_reviewer_group")
    assert "reviewer group 'finance'" in told(fake_slack)[-1]
    assert ApprovalRequest.objects.get(pk=approval.pk).state == "pending"
