"""Pre-images (issue 42): the declaration in the registry, the before read kept sealed with the
call's undo entry, its bounds (hold or refuse: never run without its undo), the claim that hands
it back for a compare-and-restore, the seal's rotation, and dropping after the undo window."""

from __future__ import annotations

import io
import json
import threading
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from approvals.models import ApprovalRequest
from core import seal
from effects.models import Effect, PreImage, Session, UndoEntry
from effects.preimages import digest
from ops import retention
from orgs.models import Event
from tests.conftest import agent_client, eventually, intercept, open_session

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]

SECRET = "the-file's-secret-content-7f3a"
DECLARATION = {
    "before": {"tool": "read_text_file", "args": {"path": "{path}"}},
    "absent_when": "ENOENT",
    "restore": {"tool": "write_file", "args": {"path": "{path}", "content": "{before.content}"}},
    "restore_absent": {"delete": "{path}"},
    "after": {"content": "{content}"},
    "max_bytes": 2048,
    "over_bound": "hold",
}


def register(persona, declaration=None, *, name: str = "write_file") -> dict:
    persona.api.post("/api/v1/compensations", {"fn_name": "fs.restore", "fn_version": "1.0.0",
                                               "handler": "agent"}, format="json")
    return persona.api.post("/api/v1/tools", {"tools": [
        {"name": name, "tier": "compensable",
         "compensation": {"fn_name": "fs.restore", "fn_version": "1.0.0", "args": {}},
         "pre_image": DECLARATION if declaration is None else declaration}]}, format="json")


def call(persona, session_id: str, step: int, content: str = "new") -> dict:
    response = intercept(persona, session_id, "write_file", {"path": "/w/a.txt", "content": content}, step)
    assert response.status_code == 201, response.content
    return response.json()["effect"]


def keep(persona, effect: dict, **body):
    return persona.api.post(f"/api/v1/effects/{effect['id']}/pre-image", body, format="json")


# ---------------------------------------------------------------- the declaration


def test_a_declaration_is_registered_and_listed(acme):
    response = register(acme)
    assert response.status_code == 200, response.content
    assert response.json()["tools"][0]["pre_image"] == DECLARATION
    assert acme.api.get("/api/v1/tools").json()["tools"][0]["pre_image"] == DECLARATION


@pytest.mark.parametrize("change, field", [
    ({"before": {"tool": "read_text_file", "args": {"path": "{before.path}"}}}, "pre_image.before.args"),
    ({"before": {"tool": "x", "fn": "y"}}, "pre_image.before"),
    ({"before": None}, "pre_image.before"),
    ({"restore": {"tool": "write_file", "args": {"content": "{result.content}"}}}, "pre_image.restore.args"),
    ({"restore": {"tool": "", "args": {}}}, "pre_image.restore.tool"),
    ({"restore_absent": {"delete": 3}}, "pre_image.restore_absent.delete"),
    ({"max_bytes": 0}, "pre_image.max_bytes"),
    ({"max_bytes": 10**12}, "pre_image.max_bytes"),
    ({"over_bound": "ignore"}, "pre_image.over_bound"),
    ({"surprise": 1}, "pre_image.surprise"),
    ({"absent_when": ""}, "pre_image.absent_when"),
])
def test_a_bad_declaration_is_a_400_naming_the_field_and_writes_nothing(acme, change, field):
    response = register(acme, {**DECLARATION, **change})
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["error"] == "invalid"
    assert field in json.dumps(body["fields"]), body
    assert acme.api.get("/api/v1/tools").json()["tools"] == []


def test_only_a_compensable_tool_takes_a_pre_image(acme):
    response = acme.api.post("/api/v1/tools", {"tools": [
        {"name": "read", "tier": "safe", "pre_image": DECLARATION}]}, format="json")
    assert response.status_code == 400
    assert "pre_image" in json.dumps(response.json()["fields"])


# ---------------------------------------------------------------- keeping it, sealed


def test_the_pre_image_is_kept_sealed_and_only_its_digest_shows(acme):
    register(acme)
    session_id = open_session(acme)
    effect = call(acme, session_id, 1)
    response = keep(acme, effect, value={"content": SECRET}, after_digest=digest({"content": "new"}))
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["decision"] == "execute"
    assert body["pre_image"]["before_digest"] == digest({"content": SECRET})
    assert SECRET not in response.content.decode()

    kept = PreImage.objects.get()
    assert kept.value() == {"content": SECRET}
    assert kept.size == len(json.dumps({"content": SECRET}, separators=(",", ":")))
    # No table holds it in clear: every column of every row, as the database has it.
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f'SELECT * FROM "{table}"')
            for row in cursor.fetchall():
                assert SECRET not in repr(row), table
                assert SECRET.encode() not in b"".join(bytes(v) for v in row if isinstance(v, bytes | memoryview))
    acme.api.post(f"/api/v1/effects/{effect['id']}/commit", {"result": {"content": "ok"}}, format="json")
    acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "x"}, format="json")
    for event in Event.objects.all():
        assert SECRET not in json.dumps(event.data)


def test_a_second_keep_of_one_call_keeps_the_first(acme):
    register(acme)
    effect = call(acme, open_session(acme), 1)
    assert keep(acme, effect, value={"content": "first"}).status_code == 201
    again = keep(acme, effect, value={"content": "second"})
    assert again.status_code == 200 and again.json()["decision"] == "execute"
    assert PreImage.objects.get().value() == {"content": "first"}


def test_absent_is_kept_as_null(acme):
    register(acme)
    effect = call(acme, open_session(acme), 1)
    response = keep(acme, effect, absent=True)
    assert response.status_code == 201
    assert response.json()["pre_image"]["absent"] is True
    assert response.json()["pre_image"]["before_digest"] == digest(None)
    assert keep(acme, call(acme, open_session(acme), 1), absent=True, value={"x": 1}).status_code == 400


def test_a_tool_without_a_declaration_keeps_nothing(acme):
    register(acme)
    acme.api.post("/api/v1/tools", {"tools": [{"name": "write_file", "tier": "compensable", "compensation": {
        "fn_name": "fs.restore", "fn_version": "1.0.0", "args": {}}}]}, format="json")
    effect = call(acme, open_session(acme), 1)
    response = keep(acme, effect, value={"content": "x"})
    assert response.status_code == 409 and response.json()["error"] == "no_pre_image_declared"


def test_another_orgs_effect_is_a_404(acme, outsider):
    register(acme)
    effect = call(acme, open_session(acme), 1)
    assert keep(outsider, effect, value={"content": "x"}).status_code == 404
    assert acme.viewer.post(f"/api/v1/effects/{effect['id']}/pre-image", {}, format="json").status_code == 403


def test_a_committed_call_keeps_no_pre_image_after_the_fact(acme):
    register(acme)
    effect = call(acme, open_session(acme), 1)
    acme.api.post(f"/api/v1/effects/{effect['id']}/commit", {"result": {}}, format="json")
    response = keep(acme, effect, value={"content": "x"})
    assert response.status_code == 409 and response.json()["error"] == "effect_state_conflict"


# ---------------------------------------------------------------- bounds


def test_over_its_bound_with_refuse_the_call_fails_without_running_and_nothing_is_kept(acme):
    register(acme, {**DECLARATION, "over_bound": "refuse"})
    session_id = open_session(acme)
    effect = call(acme, session_id, 1)
    response = keep(acme, effect, value={"content": "x" * 3000})
    assert response.status_code == 409, response.content
    assert response.json()["error"] == "pre_image_over_bound"
    assert "was not run" in response.json()["message"]
    assert Effect.objects.get(pk=effect["id"]).state == "failed"
    assert UndoEntry.objects.get(effect_id=effect["id"]).state == "skipped"
    assert not PreImage.objects.exists()


def test_too_big_to_send_is_refused_even_with_hold(acme):
    register(acme)
    effect = call(acme, open_session(acme), 1)
    response = keep(acme, effect, size=10**9, over_bound=True)
    assert response.status_code == 409 and response.json()["error"] == "pre_image_over_bound"
    assert Effect.objects.get(pk=effect["id"]).state == "failed"


def test_over_its_bound_with_hold_the_call_waits_for_a_person_with_its_undo_kept(acme):
    register(acme)
    session_id = open_session(acme)
    effect = call(acme, session_id, 1)
    response = keep(acme, effect, value={"content": "x" * 3000})
    assert response.status_code == 202, response.content
    assert response.json()["decision"] == "await_approval"
    assert Effect.objects.get(pk=effect["id"]).state == "pending"
    assert Session.objects.get(pk=session_id).state == "awaiting_approval"
    approval = ApprovalRequest.objects.get(effect_id=effect["id"])
    assert "pre-image is 3014 bytes, over its bound of 2048" in approval.why[0]["message"]
    assert PreImage.objects.get().held

    decided = acme.reviewer.post(f"/api/v1/approvals/{approval.id}/approve", {}, format="json")
    assert decided.status_code == 200, decided.content
    assert acme.api.post(f"/api/v1/effects/{effect['id']}/start").status_code == 200
    again = keep(acme, effect, value={"content": "x" * 3000})  # the approved call: kept already
    assert again.status_code == 200 and again.json()["decision"] == "execute"


@override_settings(UNDOLOG_PRE_IMAGE_RUN_MAX_BYTES=100)
def test_the_runs_bound_counts_every_pre_image_it_keeps(acme):
    register(acme, {**DECLARATION, "over_bound": "refuse"})
    session_id = open_session(acme)
    assert keep(acme, call(acme, session_id, 1), value={"content": "a" * 60}).status_code == 201
    response = keep(acme, call(acme, session_id, 2, "other"), value={"content": "b" * 60})
    assert response.status_code == 409
    assert "over the run's bound of 100" in response.json()["message"]


@override_settings(UNDOLOG_PRE_IMAGE_RUN_MAX_BYTES=100)
def test_two_calls_of_one_run_keeping_pre_images_at_once_cannot_both_pass_the_runs_bound(acme):
    """Real concurrent clients: both requests wait on the run's row (held here) with their
    statements begun, so a bound checked against a sum read before the wait lets both in."""
    register(acme, {**DECLARATION, "over_bound": "refuse"})
    session_id = open_session(acme)
    effects = [call(acme, session_id, step, f"content {step}") for step in (1, 2, 3)]
    keep(acme, effects[0], value={"content": "warm"})  # the key is remembered: the fast path answers
    kept_before = Session.objects.get(pk=session_id).pre_image_bytes
    holding, release = threading.Event(), threading.Event()

    def hold_the_run() -> None:
        with transaction.atomic():
            Session.objects.select_for_update().get(pk=session_id)
            holding.set()
            release.wait(30)
        connection.close()

    holder = threading.Thread(target=hold_the_run)
    holder.start()
    assert holding.wait(30)
    answers: list = []

    def post(n: int) -> None:
        answers.append(agent_client(acme.key).post(f"/api/v1/effects/{effects[n + 1]['id']}/pre-image",
                                                   {"value": {"content": "x" * 60}}, format="json"))
        connection.close()

    clients = [threading.Thread(target=post, args=(n,)) for n in range(2)]
    for client in clients:
        client.start()
    waiting_on_the_run(2)
    release.set()
    for thread in (holder, *clients):
        thread.join(60)

    assert sorted(a.status_code for a in answers) == [201, 409], [a.content for a in answers]
    refused = next(a for a in answers if a.status_code == 409).json()
    assert refused["error"] == "pre_image_over_bound" and "over the run's bound of 100" in refused["message"]
    kept = PreImage.objects.filter(session_id=session_id)
    assert kept.count() == 2
    assert Session.objects.get(pk=session_id).pre_image_bytes == sum(p.size for p in kept) == kept_before + 74


def test_the_same_calls_pre_image_sent_twice_at_once_is_kept_once_and_both_are_answered(acme):
    """Both requests read "none kept" and then wait on the run's row: the second's insert meets the
    first's, and it is answered as a retry (200), not with an error."""
    register(acme)
    session_id = open_session(acme)
    keep(acme, call(acme, session_id, 1, "warm"), value={"content": "warm"})  # the key is remembered
    effect = call(acme, session_id, 2)
    holding, release = threading.Event(), threading.Event()

    def hold_the_run() -> None:
        with transaction.atomic():
            Session.objects.select_for_update().get(pk=session_id)
            holding.set()
            release.wait(30)
        connection.close()

    holder = threading.Thread(target=hold_the_run)
    holder.start()
    assert holding.wait(30)
    answers: list = []

    def post() -> None:
        answers.append(agent_client(acme.key).post(f"/api/v1/effects/{effect['id']}/pre-image",
                                                   {"value": {"content": SECRET}}, format="json"))
        connection.close()

    clients = [threading.Thread(target=post) for _ in range(2)]
    for client in clients:
        client.start()
    waiting_on_the_run(2)
    release.set()
    for thread in (holder, *clients):
        thread.join(60)

    assert sorted(a.status_code for a in answers) == [200, 201], [a.content for a in answers]
    assert {a.json()["decision"] for a in answers} == {"execute"}
    assert PreImage.objects.filter(entry__effect_id=effect["id"]).count() == 1
    assert Session.objects.get(pk=session_id).pre_image_bytes == sum(p.size for p in PreImage.objects.all())


def waiting_on_the_run(count: int) -> None:
    """Until `count` requests wait on a lock (PostgreSQL), or a moment (SQLite: its writers wait on
    the database's one write lock, which nothing here can observe)."""
    if connection.vendor != "postgresql":
        time.sleep(1)
        return
    eventually(lambda: _lock_waiters() >= count)


def _lock_waiters() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = "
                       "current_database()")
        return cursor.fetchone()[0]


# ---------------------------------------------------------------- the claim and the after-image


def test_the_claimer_gets_the_pre_image_the_call_args_and_both_digests(acme):
    register(acme)
    session_id = open_session(acme)
    effect = call(acme, session_id, 1, content="mine")
    keep(acme, effect, value={"content": SECRET})
    acme.api.post(f"/api/v1/effects/{effect['id']}/commit", {"result": {}}, format="json")
    after = acme.api.post(f"/api/v1/effects/{effect['id']}/after-image", {"digest": digest({"content": "mine"})},
                          format="json")
    assert after.status_code == 200 and after.json()["recorded"]
    again = acme.api.post(f"/api/v1/effects/{effect['id']}/after-image", {"digest": digest("other")}, format="json")
    assert not again.json()["recorded"]  # the first one counts
    assert acme.api.post(f"/api/v1/effects/{effect['id']}/after-image", {"digest": "md5:x"},
                         format="json").status_code == 400

    acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "x"}, format="json")
    [entry] = acme.api.post("/api/v1/undo-entries/claim", {}, format="json").json()["entries"]
    assert entry["pre_image"]["value"] == {"content": SECRET}
    assert entry["pre_image"]["call_args"] == {"path": "/w/a.txt", "content": "mine"}
    assert entry["pre_image"]["before_digest"] == digest({"content": SECRET})
    assert entry["pre_image"]["after_digest"] == digest({"content": "mine"})
    # The dashboard's view of the entry carries no pre-image.
    listed = acme.viewer.get("/api/v1/undo-entries", {"session": session_id})
    assert SECRET not in listed.content.decode()


# ---------------------------------------------------------------- the seal's rotation


def test_a_key_rotation_keeps_old_pre_images_restorable(acme):
    register(acme)
    with override_settings(UNDOLOG_SEAL_KEY="key-one-0123456789", UNDOLOG_SEAL_KEYS_OLD=[]):
        keep(acme, call(acme, open_session(acme), 1), value={"content": SECRET})
        sealed = bytes(PreImage.objects.get().sealed)
    with override_settings(UNDOLOG_SEAL_KEY="key-two-0123456789", UNDOLOG_SEAL_KEYS_OLD=["key-one-0123456789"]):
        assert PreImage.objects.get().value() == {"content": SECRET}
        assert seal.unseal(seal.reseal(sealed)) == seal.unseal(sealed)
    with override_settings(UNDOLOG_SEAL_KEY="key-two-0123456789", UNDOLOG_SEAL_KEYS_OLD=[]), \
            pytest.raises(seal.SealError):
        PreImage.objects.get().value()


def test_a_rotation_then_reseal_then_dropping_the_old_key_keeps_every_entry_restorable(acme):
    register(acme)
    one, two = "key-one-0123456789-0123456789-0123", "key-two-0123456789-0123456789-0123"
    with override_settings(UNDOLOG_SEAL_KEY=one, UNDOLOG_SEAL_KEYS_OLD=[]):
        session_id = open_session(acme)
        for step in (1, 2, 3):
            effect = call(acme, session_id, step, f"mine {step}")
            keep(acme, effect, value={"content": f"{SECRET} {step}"})
            acme.api.post(f"/api/v1/effects/{effect['id']}/commit", {"result": {}}, format="json")
        legacy = PreImage.objects.order_by("pk").last()  # sealed as before AES-GCM: a Fernet token
        legacy.sealed = seal._configured().fernet().encrypt(json.dumps({"value": {"content": "legacy"}}).encode())
        legacy.save(update_fields=["sealed"])
    with override_settings(UNDOLOG_SEAL_KEY=two, UNDOLOG_SEAL_KEYS_OLD=[one]):
        out = io.StringIO()
        call_command("reseal_preimages", stdout=out)
        assert out.getvalue().startswith("resealed 3 pre-images; 0 under the current key"), out.getvalue()
        again = io.StringIO()
        call_command("reseal_preimages", stdout=again)  # run twice: nothing left to do
        assert again.getvalue().startswith("resealed 0 pre-images; 3 under the current key"), again.getvalue()
    with override_settings(UNDOLOG_SEAL_KEY=two, UNDOLOG_SEAL_KEYS_OLD=[]):  # the old key dropped
        values = [kept.value() for kept in PreImage.objects.order_by("pk")]
        assert values == [{"content": f"{SECRET} 1"}, {"content": f"{SECRET} 2"}, {"content": "legacy"}]
        acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "roll back"}, format="json")
        restored = []
        for _ in values:  # the walk hands them out one by one, newest first
            [entry] = acme.api.post("/api/v1/undo-entries/claim", {}, format="json").json()["entries"]
            restored.append(entry["pre_image"]["value"])
            acme.api.post(f"/api/v1/undo-entries/{entry['id']}/report", {"ok": True}, format="json")
        assert restored == values[::-1]
    assert all(SECRET not in bytes(kept.sealed).decode("latin-1") for kept in PreImage.objects.all())


def test_reseal_says_which_pre_images_no_configured_key_opens(acme):
    register(acme)
    with override_settings(UNDOLOG_SEAL_KEY="key-one-0123456789-0123456789-0123", UNDOLOG_SEAL_KEYS_OLD=[]):
        keep(acme, call(acme, open_session(acme), 1), value={"content": SECRET})
    kept = PreImage.objects.get()
    with override_settings(UNDOLOG_SEAL_KEY="key-two-0123456789-0123456789-0123", UNDOLOG_SEAL_KEYS_OLD=[]), \
            pytest.raises(CommandError, match=f"no configured seal key opens pre-images {kept.pk}"):
        call_command("reseal_preimages", stdout=io.StringIO())
    assert bytes(PreImage.objects.get().sealed) == bytes(kept.sealed)  # left as it was


def test_reseal_leaves_a_dropped_pre_image_dropped(acme):
    register(acme)
    with override_settings(UNDOLOG_SEAL_KEY="key-one-0123456789-0123456789-0123", UNDOLOG_SEAL_KEYS_OLD=[]):
        keep(acme, call(acme, open_session(acme), 1), value={"content": SECRET})
    kept = PreImage.objects.get()
    PreImage.objects.filter(pk=kept.pk).update(sealed=b"", dropped_at=timezone.now())  # dropped meanwhile
    with override_settings(UNDOLOG_SEAL_KEY="key-two-0123456789-0123456789-0123",
                           UNDOLOG_SEAL_KEYS_OLD=["key-one-0123456789-0123456789-0123"]):
        assert kept.reseal() is False
    assert bytes(PreImage.objects.get().sealed) == b""


# ---------------------------------------------------------------- dropping


def test_retention_drops_the_pre_images_of_ended_runs_after_the_undo_window(acme):
    register(acme)
    done, going = open_session(acme), open_session(acme)
    for session_id in (done, going):
        effect = call(acme, session_id, 1)
        keep(acme, effect, value={"content": SECRET})
        acme.api.post(f"/api/v1/effects/{effect['id']}/commit", {"result": {}}, format="json")
    acme.api.post(f"/api/v1/sessions/{done}/complete", format="json")

    assert retention.purge(acme.org)["pre_images"] == 0  # within the window (72 h by default)
    later = timezone.now() + timedelta(hours=73)
    assert retention.purge(acme.org, dry_run=True, now=later)["pre_images"] == 1
    assert retention.purge(acme.org, now=later)["pre_images"] == 1

    dropped = PreImage.objects.get(session_id=done)
    assert dropped.dropped_at and bytes(dropped.sealed) == b"" and dropped.before_digest
    assert PreImage.objects.get(session_id=going).value() == {"content": SECRET}  # still running: kept


def test_keeping_one_within_its_bounds_is_one_statement_on_postgresql(acme):
    from django.test.utils import CaptureQueriesContext

    register(acme)
    session_id = open_session(acme)
    effect = call(acme, session_id, 1)
    keep(acme, call(acme, session_id, 2, "warm"), value={"content": "x"})  # the key is remembered now
    with CaptureQueriesContext(connection) as queries:
        response = keep(acme, effect, value={"content": SECRET}, after_digest=digest({"content": "new"}))
    assert response.status_code == 201, response.content
    assert response.json() == {"decision": "execute", "effect": {"id": effect["id"], "state": "executing"},
                               "pre_image": {"before_digest": digest({"content": SECRET}),
                                             "after_digest": digest({"content": "new"}), "size": 44,
                                             "absent": False, "dropped": False}}
    kept = PreImage.objects.get(entry__effect_id=effect["id"])
    assert kept.value() == {"content": SECRET} and not kept.held and kept.session_id == kept.entry.session_id
    statements = [q["sql"] for q in queries.captured_queries if "effects_preimage" in q["sql"]]
    # PostgreSQL: the fast path's one statement; SQLite: the view's read and insert (the run's
    # bytes are a counter on its row, raised by an update of effects_session: no sum).
    assert len(statements) == (1 if connection.vendor == "postgresql" else 2), statements
