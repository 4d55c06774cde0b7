"""Every dashboard page under load of data: the queue with 500 pending requests, an approval, a
session page, the sessions list, agents, compensation failures, settings, rules, grants, the audit
page (20,000 sealed events) and the org picker, with 10,000 sessions in the database, on PostgreSQL.

Server time is the time Django takes to answer (middleware, view, queries, template), measured
in-process with the test client, so the number is the server's and not the network's. It
prints the median and p95 per page and the page's query count. Aim: under 100 ms.

    python -m bench.dashboard [--sessions 10000] [--pending 500] [--events 20000] [--requests 30]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
import uuid
from datetime import timedelta

# Our own database, so a concurrent `bench.intercept` run (undolog_bench) is not clobbered.
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/undolog_bench_dash")

from bench.common import setup_django

BATCH = 1000
STEPS_IN_SESSION = 60


def seed(sessions: int, pending: int, events: int = 20_000) -> dict[str, str]:
    """The org, an admin, three agents, `sessions` runs (`pending` of them held on an irreversible
    call with their approval request), and one rich run: SAFE calls, committed compensable calls
    with undo entries and attempts, transitions, a refusal and a held irreversible call."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from approvals.models import ApprovalRequest
    from effects.models import CompensationFunction, Effect, Session, Tool
    from orgs.models import Agent, Membership, Organization

    org = Organization.objects.create(slug="bench-dash", name="Bench Dashboard")
    user = get_user_model().objects.create_user("bench-admin", password="bench-admin-pw")
    Membership.objects.create(user=user, org=org, role=Membership.Role.ADMIN)
    agents = [Agent.objects.create(org=org, name=f"agent-{n}") for n in range(3)]
    fn = CompensationFunction.objects.create(org=org, fn_name="undo_send_email", fn_version="1.0.0",
                                             handler="webhook", target="http://127.0.0.1:9/undo")
    send = Tool.objects.create(org=org, name="send_email", tier="compensable", compensation_fn=fn,
                               compensation_args={"to": "{to}"})
    delete = Tool.objects.create(org=org, name="delete_account", tier="irreversible",
                                 approval_reason="Deletes an account for good", risk_tags=["data-loss", "pii"],
                                 estimated_impact="account {account_id} and its data")
    now = timezone.now()
    rows = [Session(org=org, agent=agents[n % 3], state=_state(n, pending), step_index=3, tool_calls=3,
                    irreversible_calls=n % 4, created=now - timedelta(minutes=n)) for n in range(sessions)]
    for start in range(0, len(rows), BATCH):
        Session.objects.bulk_create(rows[start:start + BATCH])
    held = [s for s in rows if s.state == Session.State.AWAITING_APPROVAL][:pending]
    effects = [Effect(org=org, session=s, tool=delete, tool_name=delete.name, tier=delete.tier, step_index=3,
                      call_signature=uuid.uuid4().hex * 2, args={"account_id": f"acct-{n}"}, args_digest="0" * 64,
                      reasoning=f"Account acct-{n} has been inactive for 14 months.\n" + "More context. " * 200,
                      state=Effect.State.PENDING) for n, s in enumerate(held)]
    Effect.objects.bulk_create(effects, batch_size=BATCH)
    ApprovalRequest.objects.bulk_create(
        [ApprovalRequest(org=org, effect=e, session=e.session, tool_name=delete.name, reason=delete.approval_reason,
                         risk_tags=delete.risk_tags, estimated_impact=f"account {e.args['account_id']} and its data",
                         proposed_args=e.args, args_digest=e.args_digest, agent_context=_context(),
                         timeout_at=now + timedelta(seconds=60 + n)) for n, e in enumerate(effects)],
        batch_size=BATCH)
    _budgets(org, agents)
    rich = _rich_session(org, agents[0], send, delete)
    _failed_walks(org, agents[1], send, failures=20)
    _policy(org, agents, user, events=events)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # as autovacuum would have by now: plans for 10,000 rows, not for 0
    approval = ApprovalRequest.objects.filter(session=rich).values_list("id", flat=True).get()
    return {"session": str(rich.id), "approval": str(approval), "user": user.get_username(), "org": org.slug}


def _state(n: int, pending: int) -> str:
    from effects.models import Session

    if n % 10 == 0 and n // 10 < pending:  # every tenth run, newest first, is held
        return Session.State.AWAITING_APPROVAL
    return Session.State.COMPLETED if n % 3 else Session.State.RUNNING


def _context() -> dict:
    calls = [{"step_index": n, "tool": "send_email", "tier": "compensable", "args": {"to": f"u{n}@x.io"},
              "state": "committed", "result": '{"id": 1}', "error": None} for n in range(10)]
    return {"calls": calls, "reasoning": [{"step_index": 3, "text": "Inactive for 14 months."}]}


def _budgets(org, agents) -> None:
    """An org default with daily limits, one agent with its own policy (its switch on), and
    today's counters: what the agents and session pages read from the budgets app."""
    from budgets.models import BudgetPolicy, DayCounter, PolicyChange

    BudgetPolicy.objects.create(org=org, max_tool_calls_per_run=200, max_irreversible_per_run=5,
                                max_cost_per_run=500, max_tool_calls_per_day=5000, max_irreversible_per_day=300,
                                max_cost_per_day=20000)
    BudgetPolicy.objects.create(org=org, agent=agents[2], max_irreversible_per_run=0, max_cost_per_run=20)
    PolicyChange.objects.create(org=org, agent=agents[2], actor="bench",
                                changes={"max_irreversible_per_run": [3, 0]})
    DayCounter.objects.bulk_create(DayCounter(org=org, agent=agent, day=org.today(), tool_calls=100 * n,
                                              irreversible_calls=5 * n, cost=12 * n)
                                   for n, agent in enumerate(agents, start=1))


def _policy(org, agents, user, *, events: int) -> None:
    """What the rules, grants and audit pages read: 20 rules, 30 grants, and `events` audited
    events of earlier days, sealed into the org's chain as the beat would have (a few left unsealed)."""
    from django.utils import timezone

    from approvals.models import Grant
    from approvals.rules import Rule
    from ops import audit
    from orgs.models import Event

    for n in range(20):
        Rule.objects.create(org=org, name=f"rule-{n}", position=n, outcome=Rule.Outcome.REQUIRE if n % 2 else
                            Rule.Outcome.DENY, condition=f'tool.name == "delete_account" && args.account_id == "a{n}"',
                            message=f"Rule {n}.", mode=Rule.Mode.OBSERVE if n % 5 == 0 else Rule.Mode.ENFORCE)
    now = timezone.now()
    Grant.objects.bulk_create(Grant(org=org, agent=agents[n % 3], tool_name="delete_account", created_by=user,
                                    created_by_label=user.get_username(), expires_at=now + timedelta(minutes=30 + n))
                              for n in range(30))
    Event.objects.bulk_create(
        (Event(org=org, kind="approval.decided", agent=agents[n % 3], data={"n": n, "decision": "approved"},
               created=now - timedelta(days=3, seconds=events - n), fanned_out_at=now) for n in range(events)),
        batch_size=BATCH)
    audit.seal(org.id)
    Event.objects.bulk_create(Event(org=org, kind="approval.decided", agent=agents[0], data={"n": n}, created=now,
                                    fanned_out_at=now) for n in range(5))


def _failed_walks(org, agent, send, failures: int) -> None:
    """`failures` compensations waiting for a person, each with three failed attempts."""
    from effects.models import Effect, Session, UndoAttempt, UndoEntry
    from lifecycle.intercept import call as calls
    from lifecycle.intercept import pipeline

    session = Session.objects.create(org=org, agent=agent)
    for step in range(1, failures + 1):
        call = calls.parse({"tool": "send_email", "args": {"to": f"failed{step}@example.com"}, "step_index": step})
        answer = pipeline.intercept(agent, session.id, call)
        Effect.objects.get(pk=answer.body["effect"]["id"]).commit({"message_id": f"f-{step}"}, actor="agent:bench")
    entries = list(UndoEntry.objects.filter(session=session))
    UndoEntry.objects.filter(session=session).update(state=UndoEntry.State.COMPENSATION_FAILED, attempts=3,
                                                     last_error="HTTP 503 from the undo webhook")
    UndoAttempt.objects.bulk_create(
        UndoAttempt(entry=entry, number=n, started_at=entry.created, duration_ms=90,
                    outcome=UndoAttempt.Outcome.RETRY, status_code=503, error="HTTP 503")
        for entry in entries for n in (1, 2, 3))


def _rich_session(org, agent, send, delete):
    """A run as the API would leave it, made through the real intercept and commit paths."""
    from approvals.models import ApprovalRequest
    from budgets.models import Refusal
    from effects.models import Effect, Session, UndoAttempt, UndoEntry
    from lifecycle.intercept import call as calls
    from lifecycle.intercept import pipeline

    session = Session.objects.create(org=org, agent=agent)
    for step in range(1, STEPS_IN_SESSION, 2):
        call = calls.parse({"tool": "send_email", "args": {"to": f"user{step}@example.com"}, "step_index": step + 1,
                               "reasoning": f"Step {step}: tell the owner.",
                               "safe_calls": [{"tool": "list_inactive_accounts", "step_index": step}]})
        answer = pipeline.intercept(agent, session.id, call)
        Effect.objects.get(pk=answer.body["effect"]["id"]).commit({"message_id": f"m-{step}"}, actor="agent:bench")
    for entry in UndoEntry.objects.filter(session=session)[:5]:
        UndoAttempt.objects.create(entry=entry, number=1, started_at=entry.created, duration_ms=120,
                                   outcome=UndoAttempt.Outcome.RETRY, status_code=503, error="HTTP 503")
    Refusal.record(agent=agent, kind=Refusal.Kind.BUDGET, tool_name="delete_account", decided_by="budget",
                   reason="budget limit max_irreversible_per_run reached (1 > 0)", session_id=session.id,
                   step_index=STEPS_IN_SESSION + 1, args={"account_id": "acct-refused"},
                   limit="max_irreversible_per_run")
    call = calls.parse({"tool": "delete_account", "args": {"account_id": "acct-rich"},
                           "step_index": STEPS_IN_SESSION + 2, "reasoning": "Inactive."})
    pipeline.intercept(agent, session.id, call)
    assert ApprovalRequest.objects.filter(session=session).exists()
    return session


def measure(client, url: str, requests: int) -> tuple[float, float, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(3):  # warm caches and the connection
        assert client.get(url).status_code == 200, url
    timings = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(url)
        timings.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200
    with CaptureQueriesContext(connection) as queries:
        client.get(url)
    ordered = sorted(timings)
    return statistics.median(timings), ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], len(queries)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--pending", type=int, default=500)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--events", type=int, default=20_000, help="audited events, sealed, behind the audit page")
    args = parser.parse_args(argv)
    setup_django()
    from django.test import Client

    started = time.monotonic()
    made = seed(args.sessions, args.pending, args.events)
    # Measured in the process that seeded: its leftovers out of the collector's sight, as a
    # server process's loaded code is (undolog_site/wsgi.py freezes it).
    gc.collect()
    gc.freeze()
    print(f"dashboard pages · {args.sessions} sessions, {args.pending} pending requests, {args.events} sealed "
          "events, 20 rules, 30 grants · PostgreSQL "
          f"(seeded in {time.monotonic() - started:.1f} s) · {args.requests} requests per page")
    client = Client(SERVER_NAME="127.0.0.1")
    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.get(username=made["user"]))
    pages = {"queue (/)": "/", "approval": f"/approvals/{made['approval']}/",
             "session page": f"/sessions/{made['session']}/",
             "session live part": f"/sessions/{made['session']}/?part=live", "sessions list": "/sessions/",
             "agents": "/agents/", "comp. failures": "/compensation-failures/", "settings": "/settings/",
             "rules": "/rules/", "grants": "/grants/", "audit": "/audit/", "pick org": "/orgs/"}
    results = {}
    for name, url in pages.items():
        p50, p95, queries = measure(client, url, args.requests)
        results[name] = {"p50_ms": p50, "p95_ms": p95, "queries": queries}
        verdict = "ok" if p95 < 100 else "OVER the 100 ms aim (p95)"
        print(f"  {name:17} server time p50 {p50:6.1f} ms  p95 {p95:6.1f} ms  {queries:2d} queries  {verdict}")
    return results


if __name__ == "__main__":
    main()
