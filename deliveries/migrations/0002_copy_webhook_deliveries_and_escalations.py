"""Copy the rows of the three mechanisms into the one: approvals' WebhookDelivery (events and
executors) with their attempts, and budgets' Escalation. Ids are kept, so the Idempotency-Key a
receiver already saw (delivery id, escalation id, effect id) stays the same on a retry.

An escalation that was `sending` becomes `pending` with its claim kept: the lease decides, as it
does for every delivery (a worker that still holds it finishes; a dead one's row is swept)."""

from django.db import migrations

FIELDS = ("id", "org_id", "purpose", "webhook_id", "event_id", "effect_id", "kind", "url", "body", "timeout_ms",
          "state", "attempts", "max_attempts", "next_attempt_at", "claimed_at", "last_status_code", "last_error",
          "delivered_at", "created")
ATTEMPT_FIELDS = ("number", "started_at", "duration_ms", "ok", "status_code", "error")


def copy(apps, schema_editor):
    Delivery = apps.get_model("deliveries", "Delivery")
    Attempt = apps.get_model("deliveries", "DeliveryAttempt")
    OldDelivery = apps.get_model("approvals", "WebhookDelivery")
    OldAttempt = apps.get_model("approvals", "DeliveryAttempt")
    Escalation = apps.get_model("budgets", "Escalation")
    for old in OldDelivery.objects.iterator(chunk_size=1000):
        Delivery.objects.create(**{name: getattr(old, name) for name in FIELDS})
    for old in OldAttempt.objects.iterator(chunk_size=1000):
        Attempt.objects.create(delivery_id=old.delivery_id, **{name: getattr(old, name) for name in ATTEMPT_FIELDS})
    for old in Escalation.objects.iterator(chunk_size=1000):
        Delivery.objects.create(
            id=old.id, org_id=old.org_id, purpose="escalation", agent_id=old.agent_id, session_id=old.session_id,
            kind="budget.exceeded", url=old.url, body=old.payload, timeout_ms=10_000,
            state="pending" if old.state == "sending" else old.state, attempts=old.attempts, max_attempts=8,
            next_attempt_at=old.next_attempt_at, claimed_at=old.claimed_at, last_status_code=old.status_code,
            last_error=old.last_error, delivered_at=old.delivered_at, created=old.created)


class Migration(migrations.Migration):

    dependencies = [
        ("deliveries", "0001_initial"),
        ("approvals", "0002_decisions_and_webhooks"),
        ("budgets", "0002_budgets_policies_counters_outcomes"),
    ]

    operations = [migrations.RunPython(copy, migrations.RunPython.noop)]
