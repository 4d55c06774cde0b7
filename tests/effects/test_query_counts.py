"""The hot paths' SQL, pinned: a regression here is a latency regression for every agent."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.conftest import intercept

TRANSACTION_CONTROL = ("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT", "BEGIN", "COMMIT")


def statements(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(TRANSACTION_CONTROL)]


def test_a_compensable_intercept_takes_eight_queries(acme, session_id):
    intercept(acme, session_id, "send_email", {"to": "first@x.io"}, 1)  # stamps the key's last use

    with CaptureQueriesContext(connection) as queries:
        response = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 2)

    assert response.status_code == 201
    # key lookup, session lock, tools, signature lookup, budget policy, effect, undo entry,
    # session counters (a daily limit adds one guarded UPDATE: tests/budgets/test_hot_path.py)
    assert len(statements(queries)) == 8, statements(queries)


def test_a_commit_takes_three_queries_after_the_key_lookup(acme, session_id):
    effect = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1).json()["effect"]

    with CaptureQueriesContext(connection) as queries:
        response = acme.api.post(f"/api/v1/effects/{effect['id']}/commit", {"result": {"id": 1}}, format="json")

    assert response.status_code == 200
    # key lookup, then: the effect, its guarded update, its history row
    assert len(statements(queries)) == 4, statements(queries)


def test_a_replay_takes_four_queries(acme, session_id):
    intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1)

    with CaptureQueriesContext(connection) as queries:
        response = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1)

    assert response.json()["decision"] == "replay"
    # key lookup, session lock, tools, signature lookup
    assert len(statements(queries)) == 4, statements(queries)
