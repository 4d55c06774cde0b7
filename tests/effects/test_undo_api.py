"""The compensation endpoints: undo a completed session; list, retry and resolve undo entries."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from effects.models import Effect, Session, UndoAttempt, UndoEntry
from orgs.models import Event
from tests.conftest import open_session
from tests.effects.conftest import build_stack, register_undo

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]


class Switch:
    """A receiver behaviour a test can break and repair."""

    def __init__(self) -> None:
        self.broken = True

    def __call__(self, delivery) -> tuple[int, float]:
        return (500 if self.broken else 200), 0.0


@pytest.fixture
def switch(receiver) -> Switch:
    receiver.behaviour = Switch()
    return receiver.behaviour


@pytest.fixture
def failed(stack_of, switch):
    """Three entries; the top one failed (no retries) and waits for a person."""
    stack = stack_of(3, max_retries=0)
    stack.fail()
    assert stack.session.state == "compensation_failed"
    switch.broken = False
    return stack


# ---------------------------------------------------------------- POST sessions/{id}/undo


def completed(stack) -> str:
    assert stack.persona.api.post(f"/api/v1/sessions/{stack.session_id}/complete").status_code == 200
    return stack.session_id


def test_an_admin_undoes_a_completed_session(acme, stack_of, receiver):
    stack = stack_of(3)
    session_id = completed(stack)

    response = acme.admin.post(f"/api/v1/sessions/{session_id}/undo")

    assert response.status_code == 200
    assert response.json()["session"]["id"] == session_id
    assert receiver.order == list(reversed(stack.entries))
    session = Session.objects.get(pk=session_id)
    assert session.state == "compensated"
    assert [t.to_state for t in session.transitions.all()][-3:] == ["completed", "compensating", "compensated"]
    assert session.transitions.get(to_state="compensating").actor == "acme-admin"


def test_undoing_a_completed_session_without_effects_ends_compensated(acme, receiver):
    register_undo(acme, receiver.url)
    session_id = open_session(acme)
    acme.api.post(f"/api/v1/sessions/{session_id}/complete")

    response = acme.admin.post(f"/api/v1/sessions/{session_id}/undo")

    assert response.status_code == 200
    assert response.json()["session"]["state"] == "compensated"


def test_only_a_completed_session_can_be_undone(acme, stack_of, receiver):
    stack = stack_of(1)

    response = acme.admin.post(f"/api/v1/sessions/{stack.session_id}/undo")

    assert response.status_code == 409
    assert (response.json()["error"], response.json()["state"]) == ("session_state_conflict", "running")
    assert receiver.log == []


@pytest.mark.parametrize("who", ["reviewer", "viewer", "api"])
def test_only_an_admin_may_undo_a_session(acme, stack_of, receiver, who):
    session_id = completed(stack_of(1))

    response = getattr(acme, who).post(f"/api/v1/sessions/{session_id}/undo")

    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"
    assert Session.objects.get(pk=session_id).state == "completed"


def test_undo_needs_credentials(stack_of):
    session_id = completed(stack_of(1))

    response = APIClient().post(f"/api/v1/sessions/{session_id}/undo")

    assert response.status_code == 401


def test_another_orgs_admin_cannot_undo_a_session(stack_of, outsider, receiver):
    session_id = completed(stack_of(1))

    response = outsider.admin.post(f"/api/v1/sessions/{session_id}/undo")

    assert response.status_code == 404
    assert response.json()["error"] == "session_not_found"
    assert receiver.log == []


def test_undo_answers_405_to_get(acme, stack_of):
    session_id = completed(stack_of(1))

    assert acme.admin.get(f"/api/v1/sessions/{session_id}/undo").status_code == 405


# ---------------------------------------------------------------- GET undo-entries


def test_it_lists_the_entries_waiting_for_a_person(acme, failed, outsider):
    build_stack(outsider, "https://hooks.example.com/undo", 1)

    response = acme.viewer.get("/api/v1/undo-entries?state=compensation_failed")

    assert response.status_code == 200
    (entry,) = response.json()["undo_entries"]
    assert entry["id"] == failed.entries[2]
    assert (entry["state"], entry["tool"], entry["agent"], entry["session"]) == \
        ("compensation_failed", "send_email", "cleanup", failed.session_id)
    assert entry["session_state"] == "compensation_failed"
    assert entry["last_status_code"] == 500 and "HTTP 500" in entry["last_error"]
    assert [a["outcome"] for a in entry["attempt_log"]] == ["retry"]


def test_it_lists_a_sessions_entries_and_never_another_orgs(acme, failed, outsider):
    other = build_stack(outsider, "https://hooks.example.com/undo", 2)

    mine = acme.reviewer.get(f"/api/v1/undo-entries?session={failed.session_id}").json()["undo_entries"]
    theirs = acme.reviewer.get(f"/api/v1/undo-entries?session={other.session_id}").json()["undo_entries"]

    assert sorted(e["id"] for e in mine) == sorted(failed.entries)
    assert theirs == []


@pytest.mark.parametrize("query", ["state=broken", "session=not-a-uuid"])
def test_the_list_refuses_a_bad_filter(acme, query):
    response = acme.viewer.get(f"/api/v1/undo-entries?{query}")

    assert response.status_code == 400
    assert response.json()["error"] == "invalid"


def test_the_list_is_for_people_not_agents(acme):
    assert acme.api.get("/api/v1/undo-entries").status_code == 403
    assert APIClient().get("/api/v1/undo-entries").status_code == 401
    assert acme.viewer.post("/api/v1/undo-entries", {}, format="json").status_code == 405


def test_it_shows_one_entry_with_its_attempts(acme, failed, outsider):
    response = acme.viewer.get(f"/api/v1/undo-entries/{failed.entries[2]}")

    assert response.status_code == 200
    assert response.json()["undo_entry"]["attempt_log"][0]["status_code"] == 500
    assert outsider.viewer.get(f"/api/v1/undo-entries/{failed.entries[2]}").status_code == 404


def test_the_session_shows_its_undo_stack_with_attempts(acme, failed):
    body = acme.viewer.get(f"/api/v1/sessions/{failed.session_id}").json()

    assert [e["id"] for e in body["undo_stack"]] == list(reversed(failed.entries))
    assert body["undo_stack"][0]["attempt_log"][0]["outcome"] == "retry"


# ---------------------------------------------------------------- POST undo-entries/{id}/retry


def test_a_reviewer_retries_a_failed_entry_and_the_walk_resumes_from_it(acme, failed, receiver):
    response = acme.reviewer.post(f"/api/v1/undo-entries/{failed.entries[2]}/retry")

    assert response.status_code == 200
    body = response.json()
    assert body["undo_entry"]["id"] == failed.entries[2]
    assert [a["outcome"] for a in body["undo_entry"]["attempt_log"]] == ["retry", "success"]
    assert body["session"]["state"] == "compensated"
    assert receiver.order == list(reversed(failed.entries))
    assert {e.state for e in UndoEntry.objects.filter(session_id=failed.session_id)} == {"compensated"}
    effect = Effect.objects.get(pk=failed.effects[2])
    assert [t.to_state for t in effect.transitions.all()][-3:] == \
        ["compensation_failed", "compensating", "compensated"]
    assert effect.transitions.get(to_state="compensating", actor="acme-reviewer")


def test_a_retry_gets_a_fresh_round_of_attempts(acme, stack_of, switch):
    stack = stack_of(1, max_retries=1)
    stack.fail()
    assert stack.entry(0).attempts == 2

    acme.admin.post(f"/api/v1/undo-entries/{stack.entries[0]}/retry")  # still broken

    entry = stack.entry(0)
    assert (entry.state, entry.attempts, entry.round_start) == ("compensation_failed", 4, 2)
    assert list(UndoAttempt.objects.filter(entry=entry).values_list("number", flat=True)) == [1, 2, 3, 4]
    assert Event.objects.filter(kind="compensation.failed").count() == 2


def test_only_a_failed_entry_can_be_retried(acme, failed):
    response = acme.reviewer.post(f"/api/v1/undo-entries/{failed.entries[0]}/retry")  # still pending

    assert response.status_code == 409
    assert (response.json()["error"], response.json()["state"]) == ("undo_entry_state_conflict", "pending")


@pytest.mark.parametrize("action", ["retry", "resolve"])
def test_a_viewer_or_an_agent_cannot_retry_or_resolve(acme, failed, action):
    url = f"/api/v1/undo-entries/{failed.entries[2]}/{action}"

    assert acme.viewer.post(url, {"note": "x"}, format="json").status_code == 403
    assert acme.api.post(url, {"note": "x"}, format="json").status_code == 403
    assert APIClient().post(url, {"note": "x"}, format="json").status_code == 401
    assert failed.entry(2).state == "compensation_failed"


@pytest.mark.parametrize("action", ["retry", "resolve"])
def test_another_orgs_entries_are_404(failed, outsider, action):
    response = outsider.reviewer.post(f"/api/v1/undo-entries/{failed.entries[2]}/{action}", {"note": "x"},
                                      format="json")

    assert response.status_code == 404
    assert response.json()["error"] == "undo_entry_not_found"
    assert failed.entry(2).state == "compensation_failed"


@pytest.mark.parametrize("action", ["retry", "resolve"])
def test_retry_and_resolve_answer_405_to_get(acme, failed, action):
    assert acme.reviewer.get(f"/api/v1/undo-entries/{failed.entries[2]}/{action}").status_code == 405


def test_an_unknown_entry_is_404(acme):
    assert acme.reviewer.post("/api/v1/undo-entries/00000000-0000-0000-0000-000000000000/retry").status_code == 404
    assert acme.reviewer.post("/api/v1/undo-entries/nope/retry").status_code == 404


# ---------------------------------------------------------------- POST undo-entries/{id}/resolve


def test_resolving_by_hand_resumes_the_walk_below_the_entry(acme, failed, receiver):
    response = acme.reviewer.post(f"/api/v1/undo-entries/{failed.entries[2]}/resolve",
                                  {"note": "Sent the apology by hand"}, format="json")

    assert response.status_code == 200
    entry = response.json()["undo_entry"]
    assert (entry["state"], entry["resolution_note"], entry["resolved_by"]) == \
        ("resolved", "Sent the apology by hand", "acme-reviewer")
    assert response.json()["session"]["state"] == "compensated"
    assert receiver.order == [failed.entries[1], failed.entries[0]]  # never the resolved one again
    effect = Effect.objects.get(pk=failed.effects[2])
    assert effect.state == "compensated"
    assert effect.transitions.last().reason == "resolved by hand: Sent the apology by hand"


def test_resolving_the_last_entry_ends_the_session_compensated(acme, stack_of, switch):
    stack = stack_of(1, max_retries=0)
    stack.fail()

    response = acme.admin.post(f"/api/v1/undo-entries/{stack.entries[0]}/resolve", {"note": "done"}, format="json")

    assert response.json()["session"]["state"] == "compensated"


@pytest.mark.parametrize("body", [{}, {"note": ""}, {"note": "   "}, {"note": "ok", "extra": 1}, ["note"]])
def test_resolve_needs_a_note(acme, failed, body):
    response = acme.reviewer.post(f"/api/v1/undo-entries/{failed.entries[2]}/resolve", body, format="json")

    assert response.status_code == 400
    assert response.json()["error"] == "invalid"
    assert failed.entry(2).state == "compensation_failed"


def test_resolve_refuses_malformed_json(acme, failed):
    response = acme.reviewer.post(f"/api/v1/undo-entries/{failed.entries[2]}/resolve", "{nope",
                                  content_type="application/json")

    assert response.status_code == 400
    assert response.json()["error"] == "malformed_json"


def test_only_a_failed_entry_can_be_resolved(acme, failed):
    response = acme.reviewer.post(f"/api/v1/undo-entries/{failed.entries[1]}/resolve", {"note": "x"},
                                  format="json")

    assert response.status_code == 409
    assert failed.entry(1).state == "pending"
