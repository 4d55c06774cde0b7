"""Telling people, through the outbox: every recorded event goes to the org's dashboards
(Channels group), its webhooks and, for alerts, its reviewers' inboxes, exactly once.

The `Event` row is the outbox: it is written in the transaction of the change it records,
with `fanned_out_at` empty. `dispatch` turns it into delivery rows (one per subscribed
webhook, one email) in one transaction that also claims it, so a second dispatcher finds
nothing to do. It runs right after the change commits, in the process that made it (the
fast path: a dashboard sees a new request within milliseconds); should that process die
first, the beat's `sweep_events` finds the event and dispatches it from the worker. A crash
after a commit delays a notification; it never loses one.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection, transaction
from django.dispatch import receiver
from django.utils import timezone

from approvals import events, slack
from approvals.models import ApprovalRequest, OrgWebhook, SlackMessage
from core import faults
from deliveries.models import Delivery
from orgs.models import Event, Membership, Recorded, event_recorded, events_recorded

log = logging.getLogger(__name__)

# What reaches reviewers' inboxes: what needs a person, not every decision.
EMAIL_KINDS = frozenset({"approval.requested", "approval.expired", "compensation.failed",
                         "budget.exceeded", "agent.suspended", "session.abandoned"})


def approval_requested(approval: ApprovalRequest) -> None:
    Event.record(approval.org, "approval.requested", agent=approval.session.agent,
                 session_id=approval.session_id, **requested_data(approval))


def requested_data(approval: ApprovalRequest) -> dict:
    """The data of an `approval.requested` event (the fast approval path writes it in its statement)."""
    return {"approval": approval.summary(), "tool": approval.tool_name, "effect": str(approval.effect_id)}


@receiver(event_recorded, dispatch_uid="approvals.fan_out")
def fan_out(sender, event: Event, approval: ApprovalRequest | None = None, hooks: list[OrgWebhook] | None = None,
            slack: bool = True, **kwargs) -> None:
    """After the event's transaction committed (so never for a rolled-back change): dispatch it
    now. A failure here is logged and never turns a committed decision into an error: the
    event stays undispatched and the sweep takes it. What the sender already holds (the fast
    approval path: the request, the org's active webhooks, whether a Slack row can be due) is
    passed on to `dispatch`, which then reads none of it again."""
    faults.hit("event.committed", event.kind)  # tests only: die between the commit and the fan-out
    try:
        dispatch(event, approval=approval, hooks=hooks, slack=slack)
    except Exception:
        log.exception("could not dispatch event %s; the sweep will", event.pk)


@receiver(events_recorded, dispatch_uid="approvals.fan_out_many")
def fan_out_many(sender, recorded: list[Recorded], **kwargs) -> None:
    """`fan_out` for a batch of committed events (the fast approval path's, gathered after their
    answers): `dispatch_recorded`, a failure logged and left to the sweep."""
    for one in recorded:
        faults.hit("event.committed", one.event.kind)
    try:
        dispatch_recorded(recorded)
    except Exception:
        log.exception("could not dispatch %d events; the sweep will", len(recorded))


def dispatch_recorded(recorded: list[Recorded]) -> int:
    """Fan a batch of events out, each exactly once; how many this call fanned out.

    1. Build each payload (from the request its sender wrote) and, given the webhooks, its rows.
    2. An event with a delivery row or a Slack row to write goes through `dispatch`, one by one
       (its claim and its rows are one transaction).
    3. The rest, the common case, are claimed in one statement: of this call and any sweep, each
       event goes to one.
    4. Publish what this call claimed: one group message per org (`events.publish_many`).
    """
    simple: list[tuple[Event, events.EventPayload]] = []
    done = 0
    for one in recorded:
        payload, rows, slack_due = _plan(one.event, one.approval, one.hooks, one.slack)
        if rows == [] and not slack_due:
            simple.append((one.event, payload))
        elif _dispatch(one.event, payload, rows, slack_due) is not None:
            done += 1
    claimed = _claim([event for event, _ in simple])
    by_org: dict = {}
    for event, payload in simple:
        if event.pk in claimed:
            by_org.setdefault(event.org_id, []).append(events.Message(type=event.kind, payload=payload))
    for org_id, messages in by_org.items():
        events.publish_many(org_id, messages)
    return done + len(claimed)


def dispatch(event: Event, *, approval: ApprovalRequest | None = None, hooks: list[OrgWebhook] | None = None,
             slack: bool = True) -> list[Delivery] | None:
    """Fan one event out, exactly once; its delivery rows, or None if someone else did.

    1. Build the typed payload once (the approval as it is now, or `approval` as its sender
       just wrote it).
    2. Claim the event (a guarded UPDATE of `fanned_out_at`: of the request that recorded it and
       any number of sweeps, exactly one passes) and, in the claim's transaction, write its
       delivery rows: one per active webhook that wants the kind (`hooks`, or read now), one
       email if the org wants one; and an approval event's Slack message row (`approvals.slack`;
       `slack=False`: the sender knows none is due). With nothing to write, the claim is one
       statement in its own transaction.
    3. After that commit: publish to the org's Channels group and enqueue each row (a lost
       message is found by the deliveries sweep).
    """
    return _dispatch(event, *_plan(event, approval, hooks, slack))


def _plan(event: Event, approval: ApprovalRequest | None, hooks: list[OrgWebhook] | None,
          slack: bool) -> tuple[events.EventPayload, list[Delivery] | None, bool]:
    """The event's payload, its delivery rows when the webhooks are given (None: read them in the
    claim's transaction), and whether a Slack row can be due."""
    payload = events.payload_for(event, approval)
    rows = None if hooks is None else _webhook_rows(event, payload, hooks) + _email_rows(event, payload)
    return payload, rows, slack and event.kind in SLACK_KINDS


def _dispatch(event: Event, payload: events.EventPayload, rows: list[Delivery] | None,
              slack_due: bool) -> list[Delivery] | None:
    # Given the webhooks, the rows are known before the claim: with none to write (nor Slack's),
    # the claim needs no transaction of its own.
    if rows == [] and not slack_due:
        if not _claim([event]):
            return None
        events.publish(event.org_id, event.kind, payload)
        return rows
    with transaction.atomic():
        if not _claim([event]):
            return None
        if rows is None:
            rows = _webhook_rows(event, payload) + _email_rows(event, payload)
        Delivery.objects.bulk_create(rows, ignore_conflicts=True)
        for row in rows:
            row.enqueue_after_commit()
        message = _slack_message(event) if slack_due else None
        if message is not None:
            transaction.on_commit(lambda: slack.message_due.send(sender=SlackMessage, message_id=str(message.pk)))
        transaction.on_commit(lambda: events.publish(event.org_id, event.kind, payload))
    return rows


def _claim(batch: list[Event]) -> set:
    """The events of `batch` this call claimed, in one guarded UPDATE: of the request that recorded
    them and any number of sweeps, exactly one gets each. Written out (the ORM's update compiled
    in ~0.3 ms of CPU)."""
    if not batch:
        return set()
    fields = Event._meta
    now = fields.get_field("fanned_out_at").get_db_prep_value(timezone.now(), connection)
    ids = [fields.pk.get_db_prep_value(event.pk, connection) for event in batch]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {fields.db_table} SET fanned_out_at = %s WHERE fanned_out_at IS NULL "
                       f"AND id IN ({', '.join(['%s'] * len(ids))}) RETURNING id", [now, *ids])
        mine = {str(row[0]).replace("-", "") for row in cursor.fetchall()}
    return {event.pk for event in batch if event.pk.hex in mine}


def dispatch_many(recorded: list[Event]) -> int:
    """`dispatch` for a batch of events recorded together (a fleet rollback's `session.compensated`,
    one per run): one claim and one read of each org's webhooks for all of them, instead of a
    transaction each. Approval events are not batched (their payload reads the request): they go
    one by one. Returns how many this call fanned out."""
    single = [event for event in recorded if event.kind in events.APPROVAL_KINDS or event.kind in SLACK_KINDS]
    for event in single:
        dispatch(event)
    batch = {event.pk: event for event in recorded if event not in single}
    if not batch:
        return len(single)
    with transaction.atomic():
        # Locked, then claimed: of this call and any sweep racing it, each event goes to one.
        mine = list(Event.objects.filter(pk__in=list(batch), fanned_out_at__isnull=True)
                    .select_for_update(skip_locked=True).values_list("pk", flat=True))
        Event.objects.filter(pk__in=mine).update(fanned_out_at=timezone.now())
        hooks: dict = {}
        rows: list[Delivery] = []
        payloads = []
        for pk in mine:
            event = batch[pk]
            payload = events.payload_for(event)
            if event.org_id not in hooks:
                hooks[event.org_id] = list(OrgWebhook.objects.for_org(event.org_id).active())
            rows += _webhook_rows(event, payload, hooks[event.org_id]) + _email_rows(event, payload)
            payloads.append((event.org_id, event.kind, payload))
        Delivery.objects.bulk_create(rows, ignore_conflicts=True)
        for row in rows:
            row.enqueue_after_commit()
        transaction.on_commit(lambda: [events.publish(*published) for published in payloads])
    return len(single) + len(mine)


def _webhook_rows(event: Event, payload: events.EventPayload, active: list[OrgWebhook] | None = None) -> list[Delivery]:
    if active is None:
        active = list(OrgWebhook.objects.for_org(event.org_id).active())
    hooks = [hook for hook in active if hook.wants(event.kind)]
    message = events.Message(type=event.kind, payload=payload)
    return [Delivery(org_id=event.org_id, purpose=Delivery.Purpose.EVENT, webhook=hook, event=event,
                     kind=event.kind, url=hook.url, body=events.slack_body(payload) if hook.slack else message,
                     max_attempts=settings.UNDOLOG_WEBHOOK_MAX_ATTEMPTS, timeout_ms=settings.UNDOLOG_WEBHOOK_TIMEOUT_MS)
            for hook in hooks]


def _email_rows(event: Event, payload: events.EventPayload) -> list[Delivery]:
    if event.kind not in EMAIL_KINDS or not event.org.email_notifications:
        return []
    recipients = reviewers_emails(event.org_id)
    if not recipients:
        return []
    subject, message = email_text(event, payload)
    return [Delivery(org_id=event.org_id, purpose=Delivery.Purpose.EMAIL, event=event, kind=event.kind, url="",
                     body={"subject": subject, "message": message, "recipients": recipients},
                     max_attempts=settings.UNDOLOG_WEBHOOK_MAX_ATTEMPTS)]


SLACK_KINDS = frozenset({"approval.requested", "approval.decided", "approval.expired"})


def _slack_message(event: Event):
    """An approval event of an org with Slack: the request's message row (written once, in the
    claim's transaction, so a crash after it only delays the post: `sweep_slack` finds rows not
    in step). The post itself is the worker's, never this request's."""
    return slack.on_event(event) if event.kind in SLACK_KINDS else None


def reviewers_emails(org_id) -> list[str]:
    memberships = Membership.objects.filter(org_id=org_id, role__in=[Membership.Role.REVIEWER, Membership.Role.ADMIN],
                                            user__is_active=True).exclude(user__email="")
    return sorted(set(memberships.values_list("user__email", flat=True)))


def email_text(event: Event, payload: events.EventPayload) -> tuple[str, str]:
    """The subject and body of an event's email to reviewers."""
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
    return f"[undolog] {line[:150]}", "\n".join(body)
