"""Telling people: every recorded event goes to the org's dashboards (Channels group), its
webhooks (a delivery row each, sent by the worker) and, for alerts, its reviewers' inboxes."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.dispatch import receiver

from approvals import events
from approvals.models import ApprovalRequest, OrgWebhook, WebhookDelivery
from core.enqueue import enqueue
from orgs.models import Event, Membership, event_recorded

log = logging.getLogger(__name__)

# What reaches reviewers' inboxes: what needs a person, not every decision.
EMAIL_KINDS = frozenset({"approval.requested", "approval.expired", "compensation.failed",
                         "budget.exceeded", "agent.suspended"})


def approval_requested(approval: ApprovalRequest) -> None:
    Event.record(approval.org, "approval.requested", agent=approval.session.agent,
                 session_id=approval.session_id, approval=approval.summary(),
                 tool=approval.tool_name, effect=str(approval.effect_id))


@receiver(event_recorded, dispatch_uid="approvals.fan_out")
def fan_out(sender, event: Event, **kwargs) -> None:
    """After the event's transaction committed (so never for a rolled-back change):

    1. build the typed payload once;
    2. publish it to the org's Channels group (dashboards, within a second);
    3. write one delivery row per subscribed webhook and enqueue each (the row survives a lost message);
    4. enqueue the email to the org's reviewers if the org wants email for this kind.

    Runs in the request (or task) that recorded the event, after its commit: a failure here
    is logged and never turns a committed decision into an error.
    """
    try:
        payload = events.payload_for(event)
    except Exception:
        log.exception("could not build the payload of event %s", event.pk)
        return
    events.publish(event.org_id, event.kind, payload)
    try:
        queue_webhooks(event, payload)
    except Exception:
        log.exception("could not queue webhooks for event %s", event.pk)
    try:
        if event.kind in EMAIL_KINDS and event.org.email_notifications:
            from approvals import tasks

            enqueue(tasks.email_event, str(event.pk))
    except Exception:
        log.exception("could not queue the email for event %s", event.pk)


def queue_webhooks(event: Event, payload: events.EventPayload) -> list[WebhookDelivery]:
    hooks = [hook for hook in OrgWebhook.objects.for_org(event.org_id).active() if hook.wants(event.kind)]
    if not hooks:
        return []
    message = events.Message(type=event.kind, payload=payload)
    rows = [WebhookDelivery(org_id=event.org_id, purpose=WebhookDelivery.Purpose.EVENT, webhook=hook,
                            event=event, kind=event.kind, url=hook.url,
                            body=events.slack_body(payload) if hook.slack else message,
                            max_attempts=settings.UNDOLOG_WEBHOOK_MAX_ATTEMPTS,
                            timeout_ms=settings.UNDOLOG_WEBHOOK_TIMEOUT_MS)
            for hook in hooks]
    with transaction.atomic():
        WebhookDelivery.objects.bulk_create(rows, ignore_conflicts=True)
        for row in rows:
            row.enqueue_after_commit()
    return rows


def reviewers_emails(org_id) -> list[str]:
    memberships = Membership.objects.filter(org_id=org_id, role__in=[Membership.Role.REVIEWER, Membership.Role.ADMIN],
                                            user__is_active=True).exclude(user__email="")
    return sorted(set(memberships.values_list("user__email", flat=True)))


def email(event: Event) -> int:
    """Send the event to the org's reviewers; the number of recipients (0: nothing sent)."""
    if event.kind not in EMAIL_KINDS or not event.org.email_notifications:
        return 0
    recipients = reviewers_emails(event.org_id)
    if not recipients:
        return 0
    payload = events.payload_for(event)
    line = events.describe(payload)
    body = [line, "", f"Event: {event.kind}", f"Organization: {event.org.name}",
            f"Agent: {payload['agent'] or '-'}", f"Session: {payload['session'] or '-'}"]
    approval = payload.get("approval")
    if approval is not None:
        body += [f"Tool: {approval['tool']}", f"Reason: {approval['reason']}",
                 f"Risk tags: {', '.join(approval['risk_tags']) or '-'}",
                 f"Estimated impact: {approval['estimated_impact'] or '-'}",
                 f"Deadline: {approval['timeout_at']}", "",
                 f"Decide with: POST /api/v1/approvals/{approval['id']}/approve or /reject"]
    send_mail(f"[undolog] {line[:150]}", "\n".join(body), settings.DEFAULT_FROM_EMAIL, recipients)
    return len(recipients)
