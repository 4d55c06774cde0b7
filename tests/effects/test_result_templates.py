"""Compensation templates that read the committed result: `{result.number}` rendered at commit,
flagged at commit when they cannot be, and sent to a person when the call never committed."""

from __future__ import annotations

import pytest

from effects.models import UndoEntry
from orgs.models import Event
from tests.conftest import intercept, open_session
from tests.effects import undo_handlers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]

HERE = "tests.effects.undo_handlers"


@pytest.fixture(autouse=True)
def _clear_calls():
    undo_handlers.calls.clear()


def register(persona, args: dict) -> None:
    assert persona.api.post("/api/v1/compensations", {"fn_name": "close_issue", "fn_version": "1.0.0",
                                                      "handler": "python", "target": f"{HERE}.restore"},
                            format="json").status_code == 201
    response = persona.api.post("/api/v1/tools", {"tools": [
        {"name": "create_issue", "tier": "compensable",
         "compensation": {"fn_name": "close_issue", "fn_version": "1.0.0", "args": args, "max_retries": 0}}]},
        format="json")
    assert response.status_code == 200, response.content
    assert response.json()["tools"][0]["compensation"]["args"] == args


def call(persona, session_id: str, step: int, result=None) -> dict:
    answer = intercept(persona, session_id, "create_issue", {"title": f"t{step}", "repo": "acme/web"}, step)
    assert answer.status_code == 201, answer.content
    effect = answer.json()["effect"]
    if result is not None:
        assert persona.api.post(f"/api/v1/effects/{effect['id']}/commit", {"result": result},
                                format="json").status_code == 200
    return effect


def entry_of(effect: dict) -> UndoEntry:
    return UndoEntry.objects.get(effect_id=effect["id"])


def test_it_renders_result_paths_and_args_at_commit_keeping_json_types(acme):
    register(acme, {"number": "{result.number}", "repo": "{repo}", "label": "{result.labels.0}",
                    "note": "closing #{result.number} in {repo}"})
    session_id = open_session(acme)

    effect = call(acme, session_id, 1, result={"number": 42, "labels": ["bug"]})

    assert entry_of(effect).args == {"number": 42, "repo": "acme/web", "label": "bug",
                                     "note": "closing #42 in acme/web"}
    acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "x"}, format="json")
    assert undo_handlers.calls[0][0]["number"] == 42


def test_it_flags_an_entry_whose_template_the_result_cannot_fill_at_commit(acme):
    register(acme, {"number": "{result.number}"})
    session_id = open_session(acme)

    effect = call(acme, session_id, 1, result={"id": 7})

    entry = entry_of(effect)
    assert entry.state == "compensation_failed"
    assert "{result.number}" in entry.last_error and "'number'" in entry.last_error
    assert Event.objects.filter(kind="compensation.failed", data__undo_entry=str(entry.id)).exists()
    listed = acme.viewer.get("/api/v1/undo-entries", {"state": "compensation_failed"}).json()["undo_entries"]
    assert [e["id"] for e in listed] == [str(entry.id)]


def test_a_rollback_stops_at_a_flagged_entry_for_a_person(acme):
    register(acme, {"number": "{result.number}"})
    session_id = open_session(acme)
    good = call(acme, session_id, 1, result={"number": 1})
    call(acme, session_id, 2, result={"id": 7})  # cannot be rendered

    acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "x"}, format="json")

    session = acme.viewer.get(f"/api/v1/sessions/{session_id}").json()
    assert session["state"] == "compensation_failed"
    assert entry_of(good).state == "pending"  # order matters: nothing below it runs
    assert undo_handlers.calls == []


def test_an_effect_that_never_committed_sends_result_entries_to_a_person_and_walks_args_only_ones(acme):
    register(acme, {"number": "{result.number}"})
    acme.api.post("/api/v1/tools", {"tools": [
        {"name": "send_email", "tier": "compensable",
         "compensation": {"fn_name": "close_issue", "fn_version": "1.0.0", "args": {"to": "{to}"}}}]},
        format="json")
    session_id = open_session(acme)
    mail = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1).json()["effect"]
    died = call(acme, session_id, 2)  # the run died mid-call: executing, no result

    acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "crashed"}, format="json")

    entry = entry_of(died)
    assert entry.state == "compensation_failed"
    assert "never committed" in entry.last_error
    assert acme.viewer.get(f"/api/v1/sessions/{session_id}").json()["state"] == "compensation_failed"
    # A person resolves it; the args-only entry below is walked as today.
    answer = acme.reviewer.post(f"/api/v1/undo-entries/{entry.id}/resolve", {"note": "closed #? by hand"},
                                format="json")
    assert answer.status_code == 200, answer.content
    assert [args for args, _ in undo_handlers.calls] == [{"to": "a@x.io"}]
    assert entry_of(mail).state == "compensated"
    assert acme.viewer.get(f"/api/v1/sessions/{session_id}").json()["state"] == "compensated"

