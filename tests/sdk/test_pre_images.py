"""`@undolog_tool(tier=COMPENSABLE, before=read_record, restore=restore_record)` against the real
server (issue 42): the before read is kept before the call runs, a rollback restores it through
`serve_compensations` as a compare-and-restore, a record someone else changed is not
overwritten (a person decides, with both digests), a replay reads nothing again, and a failed
before read never lets the call run."""

from __future__ import annotations

import threading

import pytest
from undolog import ToolTier, undolog_tool
from undolog.preimages import ABSENT, digest, handlers

from effects.models import Effect, PreImage, UndoEntry
from tests.conftest import eventually
from tests.sdk.conftest import agent_client

pytestmark = pytest.mark.django_db(transaction=True)

RECORDS: dict[str, dict] = {}
READS: list[str] = []


def read_record(record_id: str):
    READS.append(record_id)
    if record_id == "unreadable":
        raise ConnectionError("the CRM is down")
    return dict(RECORDS[record_id]) if record_id in RECORDS else ABSENT


def restore_record(record_id: str, before: dict) -> None:
    RECORDS[record_id] = dict(before)


def delete_record(record_id: str) -> None:
    RECORDS.pop(record_id, None)


@undolog_tool(tier=ToolTier.COMPENSABLE, before=read_record, restore=restore_record, restore_absent=delete_record,
              after=lambda record_id, fields, before: {**(before or {}), **fields})
def update_record(record_id: str, fields: dict) -> dict:
    RECORDS[record_id] = {**RECORDS.get(record_id, {}), **fields}
    return {"ok": True}


@undolog_tool(tier=ToolTier.COMPENSABLE, before=read_record, restore=restore_record, max_bytes=64,
              over_bound="refuse", name="update_record_small")
def update_small(record_id: str, fields: dict) -> dict:
    RECORDS[record_id] = {**RECORDS.get(record_id, {}), **fields}
    return {"ok": True}


@pytest.fixture
def client(acme, server):
    RECORDS.clear()
    READS.clear()
    RECORDS.update({"c1": {"name": "Ana", "tier": "gold"}, "c2": {"name": "Ben", "tier": "silver"}})
    client = agent_client(acme, server)
    client.register(update_record, update_small)
    yield client
    client.close()


def serve_until(client, session_id: str, state: str) -> None:
    """The agent side: claim and restore until the run is `state`."""
    stop = threading.Event()
    thread = threading.Thread(target=client.serve_compensations, args=(handlers(update_record, update_small),),
                              kwargs={"stop": stop, "poll_s": 0.1}, daemon=True)
    thread.start()
    try:
        eventually(lambda: client.get_session(session_id)["state"] == state, timeout=30)
    finally:
        stop.set()
        thread.join(10)


def test_a_rollback_puts_every_record_back_and_removes_the_created_one(client, worker):
    with pytest.raises(RuntimeError), client.session(agent="cleanup") as s:
        update_record("c1", {"tier": "platinum"})
        update_record("c1", {"name": "Ana Lopez"})
        update_record("c3", {"name": "Cy"})  # did not exist
        raise RuntimeError("the model went astray")
    assert RECORDS["c3"] == {"name": "Cy"}
    serve_until(client, s.id, "compensated")
    assert RECORDS == {"c1": {"name": "Ana", "tier": "gold"}, "c2": {"name": "Ben", "tier": "silver"}}
    kept = PreImage.objects.filter(session_id=s.id).order_by("entry__step_index")
    assert [p.before_digest for p in kept] == [digest({"name": "Ana", "tier": "gold"}),
                                              digest({"name": "Ana", "tier": "platinum"}), digest(None)]


def test_a_record_someone_else_changed_is_not_overwritten(client, worker):
    with pytest.raises(RuntimeError), client.session(agent="cleanup") as s:
        update_record("c2", {"tier": "gold"})
        RECORDS["c2"] = {"name": "Ben", "tier": "bronze"}  # a person edits it meanwhile
        raise RuntimeError("x")
    serve_until(client, s.id, "compensation_failed")
    assert RECORDS["c2"] == {"name": "Ben", "tier": "bronze"}  # theirs stands
    entry = UndoEntry.objects.get(session_id=s.id)
    assert entry.state == "compensation_failed"
    assert digest({"name": "Ben", "tier": "gold"}) in entry.last_error  # what this run wrote
    assert digest({"name": "Ben", "tier": "bronze"}) in entry.last_error  # what is there now
    assert "Ben" not in entry.last_error and "bronze" not in entry.last_error


def test_a_replayed_call_reads_nothing_again(client):
    from undolog.decorator import declared_tool

    with client.session(agent="cleanup") as s:
        first = update_record("c1", {"tier": "platinum"})
        # The same run, resumed by another process (a crash): the committed call replays.
        resumed = client.resume_session(s.id)
        resumed._open(client._http.send(resumed._open_call()))
        again = resumed.call(declared_tool(update_record), ("c1", {"tier": "platinum"}), {})
    assert again == first
    assert READS == ["c1"]  # one before read, for the call that ran
    assert PreImage.objects.filter(session_id=s.id).count() == 1


def test_a_failed_before_read_never_lets_the_call_run(client):
    with client.session(agent="cleanup") as s:
        with pytest.raises(Exception, match="before read failed"):
            update_record("unreadable", {"x": 1})
        assert "unreadable" not in RECORDS
    effect = Effect.objects.get(session_id=s.id)
    assert effect.state == "failed" and "before read failed" in effect.error


def test_over_its_bound_with_refuse_the_call_does_not_run(client):
    RECORDS["big"] = {"notes": "x" * 200}
    with client.session(agent="cleanup"), pytest.raises(Exception, match="pre-image is"):
        update_small("big", {"notes": "short"})
    assert RECORDS["big"] == {"notes": "x" * 200}
