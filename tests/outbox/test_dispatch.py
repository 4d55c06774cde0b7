"""The outbox's claim: an event is fanned out once, by whoever claims it first: the process that
recorded it right after its commit, or the sweep; never both, never for history."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from approvals import notify, tasks
from deliveries.models import Delivery
from orgs.models import Event


def subscribe(persona, url: str = "https://hooks.example.com/in") -> None:
    response = persona.admin.post("/api/v1/webhooks", {"url": url}, format="json")
    assert response.status_code == 201, response.content


def test_recording_an_event_fans_it_out_right_after_commit(acme, django_capture_on_commit_callbacks):
    subscribe(acme)
    with django_capture_on_commit_callbacks(execute=True):
        event = Event.record(acme.org, "compensation.failed", error="refund failed")

    event.refresh_from_db()
    assert event.fanned_out_at is not None
    assert list(Delivery.objects.filter(event=event).values_list("purpose", "kind")) == [
        ("event", "compensation.failed")]


def test_a_second_dispatch_and_the_sweep_find_the_event_taken(acme):
    subscribe(acme)
    event = Event.objects.create(org=acme.org, kind="compensation.failed", data={},
                                 created=timezone.now() - timedelta(minutes=1))

    assert len(notify.dispatch(event)) == 1
    assert notify.dispatch(event) is None
    assert tasks.sweep_events() == 0
    assert Delivery.objects.filter(event=event).count() == 1


def test_the_sweep_fans_out_what_a_dead_process_left_and_waits_out_the_grace(acme):
    subscribe(acme)
    left = Event.objects.create(org=acme.org, kind="compensation.failed", data={},
                                created=timezone.now() - timedelta(minutes=1))
    fresh = Event.objects.create(org=acme.org, kind="compensation.failed", data={})  # its process is at it

    assert tasks.sweep_events() == 1

    assert Delivery.objects.filter(event=left).count() == 1
    assert not Delivery.objects.filter(event=fresh).exists()


def test_an_email_is_a_delivery_of_its_own(acme):
    acme.org.email_notifications = True
    acme.org.save()
    acme.reviewer.user.email = "rev@example.com"
    acme.reviewer.user.save()
    event = Event.objects.create(org=acme.org, kind="compensation.failed", data={"error": "refund failed"})

    notify.dispatch(event)

    email = Delivery.objects.get(event=event, purpose="email")
    assert email.body["recipients"] == ["rev@example.com"]
    assert "refund failed" in email.body["subject"]
