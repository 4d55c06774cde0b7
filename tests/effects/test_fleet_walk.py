"""A chunk of a fleet rollback's runs walked side by side (`rollback.walk_fleet`): PostgreSQL only
(SQLite walks each run on its own), so this file is collected by the PostgreSQL run only."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from lifecycle import rollback
from tests.effects.conftest import Stack, build_stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]


def complete(stack: Stack) -> Stack:
    assert stack.persona.api.post(f"/api/v1/sessions/{stack.session_id}/complete").status_code == 200
    return stack


def test_a_chunks_walk_is_two_statements_a_round_whatever_the_number_of_runs(acme, receiver, monkeypatch):
    def statements(runs: int) -> list[str]:
        walks: list = []
        monkeypatch.setattr(rollback, "enqueue_walks", walks.extend)
        stacks = [complete(build_stack(acme, receiver.url, 3)) for _ in range(runs)]
        rollback.rollback(acme.agent, timezone.now() - timedelta(minutes=5), "incident", "test")
        with CaptureQueriesContext(connection) as queries:
            assert rollback.walk_fleet(walks) == []
        assert all(stack.session.state == "compensated" for stack in stacks)
        return [q["sql"].split()[0] for q in queries.captured_queries
                if not q["sql"].startswith(("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT"))]

    few, many = statements(2), statements(5)

    assert few == many
    # The tops and the compensation functions once; per round (3 entries a run) the claim and the
    # record, which reads the next tops; then the runs finished in one statement, their events
    # written in one, and fanned out in one batch (claimed, marked, the org's webhooks read).
    assert few == ["SELECT", "SELECT"] + ["WITH"] * 6 + ["WITH", "INSERT", "SELECT", "UPDATE", "SELECT"]
