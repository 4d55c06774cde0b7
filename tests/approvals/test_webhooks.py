"""Every event goes to the org's webhooks through the worker: signed, retried, every attempt
recorded, a Slack-compatible body on request, and nothing lost when a message is."""

from __future__ import annotations

import time
from datetime import timedelta
from email import message_from_bytes

import pytest
from django.utils import timezone

from approvals import webhooks
from deliveries.models import Delivery, DeliveryAttempt
from orgs.models import Event
from tests.approvals.conftest import MAIL_DIR, hold
from tests.approvals.receiver import Receiver
from tests.conftest import Persona, eventually, make_persona

pytestmark = pytest.mark.django_db(transaction=True)


def subscribe(persona: Persona, receiver: Receiver, **fields) -> dict:
    response = persona.admin.post("/api/v1/webhooks", {"url": receiver.url(), **fields}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_a_new_request_is_delivered_signed_with_its_full_context(worker, receiver):
    acme = make_persona("acme")
    hook = subscribe(acme, receiver)

    held = hold(acme, reasoning="inactive for a year")
    [request] = receiver.wait_for(1)

    assert webhooks.verify([hook["secret"]], request.headers["Undolog-Signature"], request.body)
    assert not webhooks.verify(["whsec_other"], request.headers["Undolog-Signature"], request.body)
    body = request.json()
    assert body["type"] == "approval.requested"
    approval = body["payload"]["approval"]
    assert approval["id"] == held["approval"]["id"]
    assert approval["agent_context"]["reasoning"][-1]["text"] == "inactive for a year"
    assert (approval["reason"], approval["proposed_args"]) == ("Deletes an account for good",
                                                               {"account_id": "acct-101"})
    assert request.headers["Undolog-Event"] == "approval.requested"
    delivery = eventually(lambda: Delivery.objects.filter(state="delivered").first())
    assert request.headers["Idempotency-Key"] == str(delivery.pk)
    [attempt] = DeliveryAttempt.objects.filter(delivery=delivery)
    assert (attempt.number, attempt.ok, attempt.status_code) == (1, True, 200)
    shown = acme.admin.get(f"/api/v1/webhooks/{hook['id']}").json()["deliveries"]
    assert [(d["kind"], d["state"], len(d["attempt_log"])) for d in shown] == [("approval.requested", "delivered", 1)]


def test_a_failing_receiver_is_retried_with_growing_delays_until_it_answers(worker):
    receiver = Receiver(statuses=[500, 503, 200])
    acme = make_persona("acme")
    subscribe(acme, receiver)

    hold(acme)
    requests = receiver.wait_for(3)

    delivery = eventually(lambda: Delivery.objects.filter(state="delivered").first())
    assert delivery.attempts == 3
    assert [(a.number, a.status_code, a.ok) for a in DeliveryAttempt.objects.filter(delivery=delivery)] == \
        [(1, 500, False), (2, 503, False), (3, 200, True)]
    assert len({r.headers["Idempotency-Key"] for r in requests}) == 1
    # At least 100 ms, then at least 200 ms between tries (UNDOLOG_WEBHOOK_RETRY_BASE_MS=100).
    assert requests[1].at - requests[0].at >= 0.095
    assert requests[2].at - requests[1].at >= 0.195
    receiver.close()


def test_a_permanent_refusal_is_not_retried(worker):
    receiver = Receiver(statuses=[410])
    acme = make_persona("acme")
    subscribe(acme, receiver)

    hold(acme)

    delivery = eventually(lambda: Delivery.objects.filter(state="failed").first())
    assert (delivery.attempts, delivery.last_status_code) == (1, 410)
    assert len(receiver.requests) == 1
    receiver.close()


def test_a_slack_webhook_gets_text_and_blocks(worker, receiver):
    acme = make_persona("acme")
    subscribe(acme, receiver, slack=True)

    hold(acme)
    [request] = receiver.wait_for(1)

    body = request.json()
    assert set(body) == {"text", "blocks"}
    assert "cleanup asks to run delete_account: account acct-101 and its data" in body["text"]
    assert body["blocks"][0] == {"type": "section", "text": {"type": "mrkdwn", "text": body["text"]}}


def test_a_webhook_gets_only_the_event_types_it_asked_for(worker, receiver):
    acme = make_persona("acme")
    subscribe(acme, receiver, event_types=["approval.decided"])
    held = hold(acme)

    acme.reviewer.post(f"/api/v1/approvals/{held['approval']['id']}/approve", {}, format="json")
    [request] = receiver.wait_for(1)

    assert request.json()["type"] == "approval.decided"
    assert request.json()["payload"]["approval"]["decided_by"] == "acme-reviewer"
    assert Delivery.objects.count() == 1


def test_the_sweep_delivers_a_row_whose_message_was_lost(worker, receiver):
    acme = make_persona("acme")
    hook = subscribe(acme, receiver)
    event = Event.objects.create(org=acme.org, kind="compensation.failed", data={"error": "refund failed"})
    # The row exists (written after the event committed) but its Celery message never arrived.
    Delivery.objects.create(org=acme.org, purpose="event", webhook_id=hook["id"], event=event,
                                   kind=event.kind, url=receiver.url(), body={"type": event.kind, "payload": {}},
                                   next_attempt_at=timezone.now() - timedelta(minutes=1))

    [request] = receiver.wait_for(1, timeout=10)

    assert request.json()["type"] == "compensation.failed"
    assert eventually(lambda: Delivery.objects.get(event=event).state == "delivered")


def test_reviewers_get_an_email_when_the_org_wants_one(worker):
    acme, quiet = make_persona("acme"), make_persona("quiet")
    acme.org.email_notifications = True
    acme.org.save()
    for persona in (acme, quiet):
        for client in (persona.reviewer, persona.admin, persona.viewer):
            client.user.email = f"{client.user.username}@example.com"
            client.user.save()

    hold(quiet)
    hold(acme)

    def mails():
        # The file backend ends each message with a line of dashes: skip a file still being written.
        files = [p.read_bytes() for p in MAIL_DIR.glob("*.log")] if MAIL_DIR.exists() else []
        return [message_from_bytes(data) for data in files if data.rstrip().endswith(b"-" * 79)]

    [mail] = eventually(mails)
    assert sorted(mail["To"].split(", ")) == ["acme-admin@example.com", "acme-reviewer@example.com"]
    assert "cleanup asks to run delete_account" in mail["Subject"]
    assert "Deletes an account for good" in mail.get_payload()
    time.sleep(0.3)
    assert len(mails()) == 1  # the quiet org has email off
