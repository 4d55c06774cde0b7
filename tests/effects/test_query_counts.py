"""The hot paths' SQL, pinned: a regression here is a latency regression for every agent."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.conftest import intercept

# PostgreSQL answers the common case with one statement (lifecycle/intercept/one_statement.py); SQLite runs the
# pipeline as written.
FAST = connection.vendor == "postgresql"

TRANSACTION_CONTROL = ("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT", "BEGIN", "COMMIT")


def statements(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(TRANSACTION_CONTROL)]


def test_a_compensable_intercept_takes_one_statement_on_postgresql_and_eight_on_sqlite(acme, session_id):
    intercept(acme, session_id, "send_email", {"to": "first@x.io"}, 1)  # stamps the key's last use

    with CaptureQueriesContext(connection) as queries:
        response = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 2,
                             safe_calls=[{"tool": "list_inactive_accounts", "step_index": 3}])

    assert response.status_code == 201
    # SQLite: key lookup, session lock, tools, the SAFE steps seen, the SAFE calls, signature lookup,
    # budget policy, effect, undo entry, session counters (a daily limit adds one guarded UPDATE:
    # tests/budgets/test_hot_path.py). PostgreSQL: all of it in one statement.
    assert len(statements(queries)) == (1 if FAST else 10), statements(queries)


def test_a_commit_takes_one_statement_on_postgresql_and_four_on_sqlite(acme, session_id):
    effect = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1).json()["effect"]

    with CaptureQueriesContext(connection) as queries:
        response = acme.api.post(f"/api/v1/effects/{effect['id']}/commit", {"result": {"id": 1}}, format="json")

    assert response.status_code == 200
    assert response.json()["effect"]["state"] == "committed"
    # key lookup, then: the effect, its guarded update, its history row
    assert len(statements(queries)) == (1 if FAST else 4), statements(queries)


def test_a_replay_takes_one_statement_on_postgresql_and_four_on_sqlite(acme, session_id):
    intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1)

    with CaptureQueriesContext(connection) as queries:
        response = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1)

    assert response.json()["decision"] == "replay"
    # key lookup, session lock, tools, signature lookup
    assert len(statements(queries)) == (1 if FAST else 4), statements(queries)


def test_the_fast_path_answers_exactly_as_the_pipeline_does(acme, session_id):
    """Same shapes, same values, whichever path answered (a key this process has not verified
    yet takes the pipeline)."""
    from orgs import models

    args = {"to": "a@x.io", "nested": {"list": [1, 2.5, None, True, "é"]}}
    models._REMEMBERED.clear()
    slow = intercept(acme, session_id, "send_email", args, 1)
    fast = intercept(acme, session_id, "send_email", {**args, "to": "b@x.io"}, 2)

    assert (slow.get("X-Undolog-Path"), fast.get("X-Undolog-Path")) == (None, "fast" if FAST else None)
    one, two = slow.json(), fast.json()
    assert set(one) == set(two) and set(one["effect"]) == set(two["effect"])
    assert set(one["undo_entry"]) == set(two["undo_entry"])
    varying = {"id", "effect", "created", "updated", "call_signature", "step_index", "args"}
    for name in ("effect", "undo_entry"):
        assert {k: v for k, v in one[name].items() if k not in varying} == \
               {k: v for k, v in two[name].items() if k not in varying}
    assert two["effect"]["args"] == {**args, "to": "b@x.io"} and two["effect"]["state"] == "executing"
    assert two["undo_entry"]["args"] == {**one["undo_entry"]["args"], "to": "b@x.io"}
    assert two["undo_entry"]["effect"] == two["effect"]["id"]
    committed = acme.api.post(f"/api/v1/effects/{two['effect']['id']}/commit", {"result": None}, format="json")
    assert committed.status_code == 200 and committed.json()["effect"]["result"] is None


# What the middleware below undolog_site.middleware.FastPathMiddleware adds that DRF's Response
# alone explains (content negotiation): a fast answer has no DRF Response, so none of these.
DRF_ONLY = {"Vary", "Allow"}


def test_the_fast_answers_carry_every_header_the_whole_middleware_chain_gives_the_pipelines(acme, session_id):
    """The fast path answers before most middleware runs: it must not lose a header (the security
    ones, the request id, Content-Length) that the chain gives the pipeline's answer."""
    from orgs import models

    models._REMEMBERED.clear()
    slow = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1)
    fast = intercept(acme, session_id, "send_email", {"to": "b@x.io"}, 2)
    models._REMEMBERED.clear()
    slow_commit = acme.api.post(f"/api/v1/effects/{slow.json()['effect']['id']}/commit", {"result": None},
                                format="json")
    fast_commit = acme.api.post(f"/api/v1/effects/{fast.json()['effect']['id']}/commit", {"result": None},
                                format="json")

    for pipeline, answer in ((slow, fast), (slow_commit, fast_commit)):
        assert answer.get("X-Undolog-Path") == ("fast" if FAST else None)
        assert set(pipeline.headers) - DRF_ONLY <= set(answer.headers), set(pipeline.headers) - set(answer.headers)
        same = ("X-Content-Type-Options", "Referrer-Policy", "Cross-Origin-Opener-Policy", "X-Frame-Options",
                "Content-Type")
        assert {h: answer.get(h) for h in same} == {h: pipeline.get(h) for h in same}
        assert int(answer["Content-Length"]) == len(answer.content)
        assert answer["X-Request-ID"] and answer["X-Request-ID"] != pipeline["X-Request-ID"]


def test_a_host_the_server_does_not_serve_is_refused_on_the_fast_route_too_and_nothing_is_written(acme, session_id):
    from effects.models import Effect

    intercept(acme, session_id, "send_email", {"to": "first@x.io"}, 1)  # the key is remembered: fast from here

    refused = acme.api.post(f"/api/v1/sessions/{session_id}/intercept",
                            {"tool": "send_email", "args": {"to": "a@x.io"}, "step_index": 2}, format="json",
                            HTTP_HOST="evil.example")

    assert refused.status_code == 400
    assert Effect.objects.filter(session_id=session_id).count() == 1


def test_an_irreversible_intercept_reads_its_agent_and_org_once_with_the_key(acme, session_id):
    intercept(acme, session_id, "send_email", {"to": "first@x.io"}, 1)

    with CaptureQueriesContext(connection) as queries:
        response = intercept(acme, session_id, "delete_account", {"account_id": "a-1"}, 2)

    assert response.json()["decision"] == "await_approval"
    sql = statements(queries)
    # The key's lookup joins its agent and org; the session, the approval request, its agent
    # context and its event reuse them rather than reading either row again.
    assert [s for s in sql if 'FROM "orgs_agent"' in s or 'FROM "orgs_organization"' in s] == []
    # SQLite, the pipeline: key, session lock, tools, signature lookup, budget policy, effect, the
    # org's rules (read once per process and org version, then cached), session counters, agent
    # context (effects, SAFE calls), approval request, grants, session state and its history, event.
    # (The event's fan-out runs after the commit, which a test transaction never reaches.)
    # PostgreSQL, the fast approval path (lifecycle/intercept/two_statements.py): the org's rules (once per
    # process and org version: the compensable call at step 1 took the fast path, which does not
    # read them), then one read and one write (tests/approvals/test_fast_approval.py pins the two).
    assert len(sql) == (3 if FAST else 14), "\n".join(s[:90] for s in sql)
