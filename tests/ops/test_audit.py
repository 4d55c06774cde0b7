"""The audit chain: sealed in order, verified link by link, tampering named, exported once per record."""

from __future__ import annotations

import hashlib
import json
import threading
import time

import pytest
import rfc8785
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from ops import audit
from ops.models import GENESIS, AuditChain, AuditRecord
from orgs.models import Event

pytestmark = pytest.mark.django_db(transaction=True)


def refusals(persona, n: int) -> list[Event]:
    """Audit-worthy events as the guard writes them (permission_denied), plus one that is not audited."""
    Event.record(persona.org, "session.updated", note="not audit-worthy")
    return [Event.record(persona.org, "permission_denied", agent=persona.agent, kind="budget",
                         limit="max_tool_calls_per_run", step_index=step) for step in range(n)]


def test_it_seals_audit_worthy_events_in_order_each_hash_covering_the_previous(acme):
    events = refusals(acme, 3)
    Event.record(acme.org, "incident.changed", on=True, by="admin")

    assert audit.seal(acme.org.id) == 4

    records = list(AuditRecord.objects.filter(org=acme.org).order_by("seq"))
    assert [r.seq for r in records] == [1, 2, 3, 4]
    assert [r.event_id for r in records[:3]] == [e.id for e in events]
    assert records[0].prev_hash == GENESIS
    for prev, record in zip([GENESIS] + [r.hash for r in records], records, strict=False):
        assert record.prev_hash == prev
        assert record.hash == hashlib.sha256((prev + record.canonical).encode()).hexdigest()
        assert record.canonical == rfc8785.dumps(json.loads(record.canonical)).decode()
    chain = AuditChain.objects.get(org=acme.org)
    assert (chain.seq, chain.head) == (4, records[-1].hash)
    assert audit.seal(acme.org.id) == 0  # nothing new: nothing sealed twice


def test_it_keeps_each_org_on_its_own_chain(acme, outsider):
    refusals(acme, 2)
    refusals(outsider, 1)

    audit.seal(acme.org.id)
    audit.seal(outsider.org.id)

    assert list(AuditRecord.objects.filter(org=outsider.org).values_list("seq", "prev_hash")) == [(1, GENESIS)]
    assert AuditRecord.objects.filter(org=acme.org).count() == 2


def test_verify_passes_an_untouched_chain(acme, capsys):
    refusals(acme, 3)
    audit.seal(acme.org.id)

    call_command("audit", "verify", "--org", "acme")

    assert "acme: ok, 3 record(s)" in capsys.readouterr().out
    assert AuditChain.objects.get(org=acme.org).verified_ok is True


def test_editing_one_event_row_in_the_database_makes_verify_name_it(acme, capsys):
    events = refusals(acme, 3)
    audit.seal(acme.org.id)
    tampered = events[1]
    with connection.cursor() as cursor:  # behind the application's back, as a person with SQL access would
        cursor.execute("UPDATE orgs_event SET data = %s WHERE id = %s",
                       [json.dumps({"kind": "budget", "limit": "none", "step_index": 1}), tampered.id.hex
                        if connection.vendor == "sqlite" else str(tampered.id)])

    with pytest.raises(CommandError):
        call_command("audit", "verify", "--org", "acme")

    out = capsys.readouterr().out
    assert f"record #2 (event {tampered.id}): its permission_denied event was changed after it was sealed" in out
    chain = AuditChain.objects.get(org=acme.org)
    assert (chain.verified_ok, chain.broken_seq) == (False, 2)


def test_verify_names_a_record_rewritten_in_place_and_a_deleted_one(acme):
    refusals(acme, 4)
    audit.seal(acme.org.id)
    AuditRecord.objects.filter(org=acme.org, seq=3).update(canonical='{"forged":true}')

    assert (audit.verify(acme.org).seq, audit.verify(acme.org).reason) == (3, "its hash does not match its content")

    AuditRecord.objects.filter(org=acme.org, seq=3).delete()

    assert str(audit.verify(acme.org)) == "record #3: record #3 is missing (the next one is #4)"


def test_verify_names_an_event_deleted_by_hand(acme):
    events = refusals(acme, 2)
    audit.seal(acme.org.id)
    Event.objects.filter(pk=events[0].pk).delete()

    broken = audit.verify(acme.org)

    assert (broken.seq, broken.event_id) == (1, str(events[0].id))
    assert "deleted, not by retention" in broken.reason


def test_the_beat_task_seals_every_org_with_recent_events(acme, outsider):
    from ops.tasks import seal_audit

    refusals(acme, 2)
    refusals(outsider, 3)

    assert seal_audit() == 5
    assert seal_audit() == 0


def test_the_beat_task_seals_each_org_once_however_many_events_it_has(acme, outsider):
    """Event's default ordering (-created) once made the DISTINCT one org per event: a run with
    1,454 recent events sealed its org 1,454 times per beat, and the tasks took every worker."""
    from ops.tasks import seal_audit

    refusals(acme, 40)
    refusals(outsider, 3)

    assert sorted(audit.orgs_to_seal(), key=str) == sorted([acme.org.id, outsider.org.id], key=str)
    assert seal_audit() == 43
    refusals(acme, 40)  # 80 recent events of acme's now, 40 of them new
    with CaptureQueriesContext(connection) as queries:
        assert seal_audit() == 40
    assert len(queries) < 25, [q["sql"][:80] for q in queries]


def test_a_second_sealer_leaves_a_locked_chain_to_the_first_instead_of_waiting(acme):
    """On PostgreSQL the beat's sealers never queue on an org's chain head (each would hold a
    worker's slot the walks need): the one that finds it locked returns at once."""
    refusals(acme, 3)
    AuditChain.objects.get_or_create(org_id=acme.org.id)
    locked, release = threading.Event(), threading.Event()

    def first_sealer() -> None:
        try:
            with transaction.atomic():
                AuditChain.objects.select_for_update().get(pk=acme.org.id)
                locked.set()
                release.wait(10)
        finally:
            connection.close()

    holder = threading.Thread(target=first_sealer)
    holder.start()
    assert locked.wait(10)
    if connection.vendor == "postgresql":
        started = time.monotonic()
        assert audit.seal(acme.org.id) == 0
        assert time.monotonic() - started < 1.5
        release.set()
        holder.join(10)
        assert audit.seal(acme.org.id) == 3
    else:  # SQLite: one writer at a time for the whole database; the second waits its turn
        threading.Timer(0.5, release.set).start()
        assert audit.seal(acme.org.id) == 3
        holder.join(10)


# ---------------------------------------------------------------- export

def export(client, **params):
    response = client.get("/api/v1/audit/export", params)
    return response, [json.loads(line) for line in b"".join(response.streaming_content).splitlines()] \
        if response.status_code == 200 else None


def test_the_export_streams_every_record_once_across_pages(acme):
    refusals(acme, 7)
    audit.seal(acme.org.id)
    seen, cursor, pages = [], None, 0

    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        response, lines = export(acme.admin, **params)
        assert response.status_code == 200
        assert response["Content-Type"] == "application/jsonl"
        seen += lines
        pages += 1
        cursor = response.get("X-Next-Cursor")
        if cursor is None:
            assert "Link" not in response
            break
        assert response["Link"].endswith('rel="next"') and f"cursor={cursor}" in response["Link"]

    assert pages == 3
    assert [line["seq"] for line in seen] == [1, 2, 3, 4, 5, 6, 7]
    prev = GENESIS
    for line in seen:  # what a SIEM re-checks from the export alone
        assert line["prev_hash"] == prev
        assert line["hash"] == hashlib.sha256((prev + rfc8785.dumps(line["record"]).decode()).encode()).hexdigest()
        prev = line["hash"]


def test_the_export_filters_by_since(acme):
    events = refusals(acme, 3)
    audit.seal(acme.org.id)

    _, lines = export(acme.admin, since=events[2].created.isoformat())

    assert [line["record"]["id"] for line in lines] == [str(events[2].id)]


def test_the_export_is_for_admins_of_the_org_only(acme, outsider):
    refusals(acme, 1)
    audit.seal(acme.org.id)

    assert acme.reviewer.get("/api/v1/audit/export").status_code == 403
    assert acme.viewer.get("/api/v1/audit/export").status_code == 403
    assert acme.api.get("/api/v1/audit/export").status_code == 403
    _, theirs = export(outsider.admin)
    assert theirs == []


def test_the_export_refuses_a_bad_cursor_or_limit(acme):
    for params, field in (({"cursor": "abc"}, "cursor"), ({"limit": "0"}, "limit"), ({"limit": "10001"}, "limit"),
                          ({"since": "yesterday"}, "since")):
        response = acme.admin.get("/api/v1/audit/export", params)
        assert response.status_code == 400
        assert response.json()["fields"] == {field: response.json()["fields"][field]}


def test_the_export_answers_401_without_credentials(client):
    assert client.get("/api/v1/audit/export").status_code == 401


def test_the_export_answers_whatever_the_client_accepts(acme):
    refusals(acme, 1)
    audit.seal(acme.org.id)

    for accept in ("application/x-ndjson", "application/jsonl", "text/plain", "*/*"):
        response = acme.admin.get("/api/v1/audit/export", HTTP_ACCEPT=accept)
        assert response.status_code == 200
        assert response["Content-Type"] == "application/jsonl"
