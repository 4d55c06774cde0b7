"""A fleet rollback's record: the `agent.rolled_back` event carries the counts and a bounded sample
of the runs; every run it took is listed by `GET /api/v1/agents/{name}/rollbacks/{id}` (a page at
a time), and `GET /api/v1/agents/{name}/rollbacks` lists the agent's rollbacks with their progress."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from lifecycle import api, rollback
from orgs.models import Agent, Event
from tests.effects.conftest import build_stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]


def roll_back(persona, agent: str = "cleanup") -> dict:
    response = persona.admin.post(f"/api/v1/agents/{agent}/rollback", {
        "since": (timezone.now() - timedelta(minutes=5)).isoformat(), "reason": "prompt injection"}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def detail(persona, rollback_id: str, agent: str = "cleanup", role: str = "viewer", **params):
    return getattr(persona, role).get(f"/api/v1/agents/{agent}/rollbacks/{rollback_id}", params)


def test_the_event_carries_the_counts_and_a_bounded_sample_and_the_api_lists_every_run(acme, receiver, monkeypatch):
    monkeypatch.setattr(rollback, "SAMPLE", 2)
    stacks = [build_stack(acme, receiver.url, 1) for _ in range(3)]

    made = roll_back(acme)

    event = Event.objects.get(kind="agent.rolled_back")
    assert made["id"] == str(event.pk)
    assert event.data["runs"] == 3 and len(event.data["sample"]) == 2 and "sessions" not in event.data
    assert set(event.data["sample"]) < {stack.session_id for stack in stacks}
    answer = detail(acme, made["id"]).json()
    assert answer | {"created": None, "since": None} == {
        "id": made["id"], "created": None, "by": acme.admin.user.username, "reason": "prompt injection",
        "since": None, "runs": 3, "entries": 3, "running": 3, "ended": 0,
        "in_progress": {"runs": 0, "entries_left": 0}, "next": None,
        "sessions": sorted(({"id": stack.session_id, "state": "compensated"} for stack in stacks),
                           key=lambda run: run["id"])}


def test_the_runs_come_a_page_at_a_time(acme, receiver, monkeypatch):
    monkeypatch.setattr(api.AgentRollbackDetailView, "PAGE", 2)
    stacks = [build_stack(acme, receiver.url, 1) for _ in range(3)]
    made = roll_back(acme)

    first = detail(acme, made["id"]).json()
    second = detail(acme, made["id"], after=first["next"]).json()

    assert len(first["sessions"]) == 2 and first["next"] == first["sessions"][-1]["id"]
    assert len(second["sessions"]) == 1 and second["next"] is None
    assert {run["id"] for run in first["sessions"] + second["sessions"]} == {stack.session_id for stack in stacks}


def test_the_list_shows_each_rollback_newest_first_with_what_it_has_left(acme, receiver, monkeypatch):
    build_stack(acme, receiver.url, 1)
    older = roll_back(acme)
    monkeypatch.setattr(rollback, "enqueue_walks", lambda ids: None)  # no walk yet: the entries stay open
    build_stack(acme, receiver.url, 2)
    build_stack(acme, receiver.url, 1)
    newer = roll_back(acme)

    listed = acme.viewer.get("/api/v1/agents/cleanup/rollbacks").json()["rollbacks"]

    assert [(r["id"], r["runs"], r["in_progress"]) for r in listed] == [
        (newer["id"], 2, {"runs": 2, "entries_left": 3}), (older["id"], 1, {"runs": 0, "entries_left": 0})]
    assert detail(acme, newer["id"]).json()["in_progress"] == {"runs": 2, "entries_left": 3}


def test_another_orgs_or_agents_rollback_is_a_404_and_a_bad_cursor_a_400(acme, outsider, receiver):
    build_stack(acme, receiver.url, 1)
    made = roll_back(acme)
    Agent.objects.create(org=acme.org, name="billing")

    assert detail(outsider, made["id"], role="admin").json()["error"] == "rollback_not_found"  # its own cleanup
    assert detail(acme, made["id"], agent="billing").json()["error"] == "rollback_not_found"
    assert detail(acme, "not-a-uuid").status_code == 404
    assert detail(acme, "00000000-0000-0000-0000-000000000000").json()["error"] == "rollback_not_found"
    assert detail(acme, made["id"], agent="nobody").json()["error"] == "agent_not_found"
    assert outsider.admin.get("/api/v1/agents/cleanup/rollbacks").json() == {"rollbacks": []}
    bad = detail(acme, made["id"], after="yesterday")
    assert bad.status_code == 400 and "after" in bad.json()["fields"]


@pytest.mark.parametrize("who, status", [("viewer", 200), ("admin", 200), ("api", 403)])
def test_members_read_rollbacks_and_agents_do_not(acme, receiver, who, status):
    build_stack(acme, receiver.url, 1)
    made = roll_back(acme)
    assert getattr(acme, who).get("/api/v1/agents/cleanup/rollbacks").status_code == status
    assert detail(acme, made["id"], role=who).status_code == status


def test_the_rollback_record_is_read_only(acme, client):
    assert acme.admin.post("/api/v1/agents/cleanup/rollbacks", {}, format="json").status_code == 405
    assert client.get("/api/v1/agents/cleanup/rollbacks").status_code in (401, 403)
