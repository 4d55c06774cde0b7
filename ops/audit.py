"""The audit chain: audit-worthy events, sealed per org in order into hash-linked records.

Each record holds the event's canonical JSON (RFC 8785: sorted keys, no spaces, one spelling
of every number and string) and `hash = sha256(prev_hash + canonical)`; the first record's
prev_hash is 64 zeros. Editing, deleting or reordering anything sealed breaks a link that
`verify` names.

Sealed after commit, in batches, by a beat task (`ops.tasks.seal_audit`, every
UNDOLOG_AUDIT_SEAL_S), not inside the transaction that records the event: chaining in that
transaction would lock the org's chain head in every decision, refusal and switch, so two
agents of an org refused at once would queue on one row (and the intercept that refuses a call
would wait for it). Sealing later costs nothing on those paths; the price is that a record is
sealed a few seconds after its event, which the dashboard and `audit verify` show as the backlog.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import rfc8785
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ops.models import GENESIS, AuditChain, AuditRecord
from orgs.models import Event, Organization

# The kinds of event that are sealed: decisions, refusals, policy and rule changes, incident
# switches, compensations and resolutions by hand, agents suspended and resumed, keys. A kind
# added later under one of these prefixes (rule.created, grant.revoked) is covered without a change.
AUDITED_PREFIXES = ("approval.", "rule.", "grant.", "policy.", "incident.", "compensation.", "undo_entry.",
                    "agent.", "key.", "budget.", "reviewer_group.")
AUDITED_KINDS = frozenset({"permission_denied", "session.abandoned", "session.compensated", "session.rewound"})
# An event committed this long after its `created` stamp is still sealed (the seal re-reads this window).
SLACK = timedelta(minutes=10)
BATCH = 500


def is_audited(kind: str) -> bool:
    return kind in AUDITED_KINDS or kind.startswith(AUDITED_PREFIXES)


def audited() -> Q:
    q = Q(kind__in=AUDITED_KINDS)
    for prefix in AUDITED_PREFIXES:
        q |= Q(kind__startswith=prefix)
    return q


def canonical(event: Event) -> str:
    """The event as RFC 8785 JSON: every column a person could edit to rewrite history."""
    return rfc8785.dumps({
        "id": str(event.id), "org": str(event.org_id), "kind": event.kind,
        "agent": str(event.agent_id) if event.agent_id else None,
        "session": str(event.session_id) if event.session_id else None,
        "data": event.data, "created": event.created.astimezone(dt.UTC).isoformat(),
    }).decode()


def link(prev_hash: str, text: str) -> str:
    return hashlib.sha256((prev_hash + text).encode()).hexdigest()


# ---------------------------------------------------------------- sealing

def seal(org_id: uuid.UUID, batch: int = BATCH) -> int:
    """Append the org's unsealed audit-worthy events to its chain; how many were sealed.

    1. Lock the org's chain head (one sealer per org at a time: a second one, finding it locked,
       leaves the org to the first; other orgs go on).
    2. Read the events not yet sealed since the last sealed one's time (minus SLACK), oldest first.
    3. Link each to the previous hash; write the records and the new head in the same transaction.
    """
    AuditChain.objects.get_or_create(org_id=org_id)
    total = 0
    while True:
        sealed = _seal_batch(org_id, batch)
        total += sealed
        if sealed < batch:
            return total


def _seal_batch(org_id: uuid.UUID, batch: int) -> int:
    with transaction.atomic():
        # SKIP LOCKED: another sealer holds this org's head, so it seals what is there (what it
        # misses, the next beat's run does). Waiting for it would only queue sealers up, each
        # holding one of the workers' slots that the undo walks and the sweeps need.
        chain = AuditChain.objects.select_for_update(skip_locked=True).filter(pk=org_id).first()
        if chain is None:
            return 0
        events = list(_unsealed(chain)[:batch])
        if not events:
            return 0
        now, prev, records = timezone.now(), chain.head, []
        for n, event in enumerate(events, start=chain.seq + 1):
            text = canonical(event)
            records.append(AuditRecord(org_id=org_id, seq=n, event_id=event.id, kind=event.kind,
                                       occurred=event.created, canonical=text, prev_hash=prev,
                                       hash=link(prev, text), sealed_at=now))
            prev = records[-1].hash
        AuditRecord.objects.bulk_create(records)
        chain.seq, chain.head, chain.sealed_at = records[-1].seq, prev, now
        chain.save(update_fields=["seq", "head", "sealed_at"])
    return len(events)


def _unsealed(chain: AuditChain):
    events = Event.objects.filter(audited(), org_id=chain.org_id)
    last = AuditRecord.objects.filter(org_id=chain.org_id).order_by("-seq").values_list("occurred", flat=True).first()
    if last is not None:
        since = last - SLACK
        events = events.filter(created__gte=since).exclude(
            id__in=AuditRecord.objects.filter(org_id=chain.org_id, occurred__gte=since).values("event_id"))
    return events.order_by("created", "id")


def orgs_to_seal(now: datetime | None = None) -> list[uuid.UUID]:
    """Orgs with an audit-worthy event recent enough that it may not be sealed yet."""
    since = (now or timezone.now()) - SLACK
    # order_by() clears Event's Meta ordering (-created): left in, DISTINCT would be over
    # (org_id, created), one org per event, and the beat's task would seal each org once per
    # recent event (seen: 1,454 seals of one org per run, each locking its chain head, the
    # tasks piling up on that lock until they held every worker and no undo walk ran).
    return list(Event.objects.filter(audited(), created__gte=since).order_by().values_list(
        "org_id", flat=True).distinct())


def backlog(org: Organization) -> int:
    chain = AuditChain.objects.filter(org=org).first()
    return _unsealed(chain).count() if chain else Event.objects.filter(audited(), org=org).count()


# ---------------------------------------------------------------- verifying

@dataclass
class Broken:
    seq: int
    reason: str
    event_id: str | None = None

    def __str__(self) -> str:
        event = f" (event {self.event_id})" if self.event_id else ""
        return f"record #{self.seq}{event}: {self.reason}"


def verify(org: Organization, *, record: bool = True) -> Broken | None:
    """Re-walk the org's chain from the first record; the first broken link, or None.

    Each record: its number follows the previous one, its prev_hash is the previous hash, its hash
    is sha256(prev_hash + canonical), and its event, while kept, still has that canonical JSON
    (an event gone that retention did not delete counts as deleted by hand)."""
    found = _walk(org)
    if record:
        AuditChain.objects.filter(org=org).update(
            verified_at=timezone.now(), verified_ok=found is None, broken_seq=found.seq if found else None,
            broken_reason=str(found) if found else "")
    return found


def _walk(org: Organization) -> Broken | None:
    chain = AuditChain.objects.filter(org=org).first() or AuditChain(org=org)
    prev, expected = GENESIS, 1
    for records in _chunks(AuditRecord.objects.filter(org=org).order_by("seq")):
        events = Event.objects.in_bulk([r.event_id for r in records])
        for r in records:
            broken = _check(r, expected, prev, events.get(r.event_id))
            if broken is not None:
                return broken
            prev, expected = r.hash, r.seq + 1
    if expected - 1 != chain.seq or prev != chain.head:
        return Broken(expected, f"the chain ends at #{expected - 1} but its head says #{chain.seq}: "
                                "records at the end were deleted or added by hand")
    return None


def _check(r: AuditRecord, expected: int, prev: str, event: Event | None) -> Broken | None:
    event_id = str(r.event_id)
    if r.seq != expected:
        return Broken(expected, f"record #{expected} is missing (the next one is #{r.seq})")
    if r.prev_hash != prev:
        return Broken(r.seq, "its prev_hash is not the previous record's hash", event_id)
    if link(prev, r.canonical) != r.hash:
        return Broken(r.seq, "its hash does not match its content", event_id)
    if event is None:
        if r.event_purged_at is None:
            return Broken(r.seq, f"its {r.kind} event was deleted, not by retention", event_id)
        return None
    if canonical(event) != r.canonical:
        return Broken(r.seq, f"its {r.kind} event was changed after it was sealed", event_id)
    return None


def _chunks(queryset, size: int = 1000) -> Iterator[list[AuditRecord]]:
    last = 0
    while True:
        chunk = list(queryset.filter(seq__gt=last)[:size])
        if not chunk:
            return
        yield chunk
        last = chunk[-1].seq


# ---------------------------------------------------------------- export

def page(org: Organization, *, since: datetime | None, after: int, limit: int) -> tuple[list[AuditRecord], int | None]:
    """One page of records after cursor `after` (a record number), and the next cursor (None: the end)."""
    records = AuditRecord.objects.filter(org=org, seq__gt=after).order_by("seq")
    if since is not None:
        records = records.filter(occurred__gte=since)
    found = list(records[: limit + 1])
    more = len(found) > limit
    found = found[:limit]
    return found, (found[-1].seq if more else None)


def export_line(r: AuditRecord) -> dict[str, Any]:
    return {"seq": r.seq, "kind": r.kind, "occurred": r.occurred.isoformat(), "sealed_at": r.sealed_at.isoformat(),
            "prev_hash": r.prev_hash, "hash": r.hash, "record": json.loads(r.canonical)}
