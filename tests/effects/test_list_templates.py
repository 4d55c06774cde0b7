"""The list form of compensation templates: `{entities[*].name}` collects one field of every
item, so the undo of a batch call can be written; a path that resolves to nothing sends the
entry to a person at commit."""

from __future__ import annotations

import pytest

from effects.models import UndoEntry
from effects.templates import TemplateError, needs_result, render_with_result
from orgs.models import Event
from tests.conftest import intercept, open_session
from tests.effects import undo_handlers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]

HERE = "tests.effects.undo_handlers"


@pytest.fixture(autouse=True)
def _clear_calls():
    undo_handlers.calls.clear()


def register(persona, tool: str, args: dict) -> None:
    assert persona.api.post("/api/v1/compensations", {"fn_name": "delete_entities", "fn_version": "1.0.0",
                                                      "handler": "python", "target": f"{HERE}.restore"},
                            format="json").status_code in (200, 201)
    response = persona.api.post("/api/v1/tools", {"tools": [
        {"name": tool, "tier": "compensable",
         "compensation": {"fn_name": "delete_entities", "fn_version": "1.0.0", "args": args, "max_retries": 0}}]},
        format="json")
    assert response.status_code == 200, response.content


def call_and_commit(persona, session_id: str, tool: str, args: dict, step: int, result) -> UndoEntry:
    answer = intercept(persona, session_id, tool, args, step)
    assert answer.status_code == 201, answer.content
    effect = answer.json()["effect"]
    assert persona.api.post(f"/api/v1/effects/{effect['id']}/commit", {"result": result},
                            format="json").status_code == 200
    return UndoEntry.objects.get(effect_id=effect["id"])


ENTITIES = [{"name": "Ada", "entityType": "person", "observations": ["wrote notes"]},
            {"name": "Analytical Engine", "entityType": "machine", "observations": []}]


def test_it_undoes_a_batch_call_with_a_list_collected_from_its_args(acme):
    register(acme, "create_entities", {"entityNames": "{entities[*].name}"})
    session_id = open_session(acme)

    entry = call_and_commit(acme, session_id, "create_entities", {"entities": ENTITIES}, 1, ENTITIES)

    assert entry.state == "pending"
    assert entry.args == {"entityNames": ["Ada", "Analytical Engine"]}
    acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "x"}, format="json")
    assert [args for args, _ in undo_handlers.calls] == [{"entityNames": ["Ada", "Analytical Engine"]}]


def test_it_collects_from_the_result_and_flattens_nested_lists(acme):
    register(acme, "add_observations", {"entities": "{result[*].entityName}",
                                        "added": "{result[*].addedObservations[*]}",
                                        "note": "undo for {result[*].entityName}"})
    session_id = open_session(acme)
    result = [{"entityName": "Ada", "addedObservations": ["a", "b"]},
              {"entityName": "Babbage", "addedObservations": ["c"]}]

    entry = call_and_commit(acme, session_id, "add_observations", {"observations": []}, 1, result)

    assert entry.args == {"entities": ["Ada", "Babbage"], "added": ["a", "b", "c"],
                          "note": 'undo for ["Ada","Babbage"]'}


def test_a_list_path_that_resolves_to_nothing_goes_to_a_person_at_commit(acme):
    register(acme, "create_entities", {"entityNames": "{entities[*].name}"})
    session_id = open_session(acme)
    unnamed = [{"name": "Ada"}, {"entityType": "machine"}]  # the second item has no name

    entry = call_and_commit(acme, session_id, "create_entities", {"entities": unnamed}, 1, {"ok": True})

    assert entry.state == "compensation_failed"
    assert "{entities[*].name}" in entry.last_error and "item 1" in entry.last_error
    assert Event.objects.filter(kind="compensation.failed", data__undo_entry=str(entry.id)).exists()
    acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "x"}, format="json")
    assert undo_handlers.calls == []  # the walk stops there, for a person
    assert acme.viewer.get(f"/api/v1/sessions/{session_id}").json()["state"] == "compensation_failed"


def test_a_result_path_over_something_not_a_list_goes_to_a_person_at_commit(acme):
    register(acme, "create_entities", {"entityNames": "{result.created[*].name}"})
    session_id = open_session(acme)

    entry = call_and_commit(acme, session_id, "create_entities", {"entities": ENTITIES}, 1,
                            {"created": {"name": "Ada"}})

    assert entry.state == "compensation_failed"
    assert "is not a list" in entry.last_error


def test_plain_args_templates_still_render_at_intercept_and_list_ones_only_when_needed():
    assert not needs_result({"to": "{to}"}, {"to": "a@x.io"})
    assert not needs_result({"names": "{entities[*].name}"}, {"entities": [{"name": "a"}]})
    assert needs_result({"names": "{entities[*].name}"}, {"entities": [{"id": 1}]})
    assert needs_result({"names": "{result[*].name}"}, {})
    assert render_with_result({"ids": "{rows[*].id}", "first": "{rows[0].id}"}, {"rows": [{"id": 1}, {"id": 2}]},
                              None) == {"ids": [1, 2], "first": 1}
    assert render_with_result({"ids": "{rows[*].id}"}, {"rows": []}, None) == {"ids": []}
    with pytest.raises(TemplateError, match="has no item 3"):
        render_with_result("{rows[3].id}", {"rows": [{"id": 1}]}, None)
