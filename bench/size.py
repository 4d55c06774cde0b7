"""Flat with size: the intercept and the queue with a large history, against the same org empty.

Measures, in-process (Django's test client through every middleware, production settings,
PostgreSQL): a compensable intercept, the reviewer's queue page and `GET /api/v1/approvals`
with 500 pending requests; then loads the org with 100,000 finished sessions, 1,000,000 effects
and 100,000 decided approval requests (straight SQL, `generate_series`), all older than the
queue's 7-day statistics window (history, not this week's workload), analyses, and measures
again. Prints each p50 and the ratio large/empty (aim: within 1.5x).

    python -m bench.size [--sessions 100000] [--effects 1000000] [--requests 300]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
import uuid
from datetime import timedelta

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/undolog_bench_size")

from bench.common import setup_django

PENDING = 500


def prepare() -> dict:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.utils import timezone

    from approvals.models import ApprovalRequest
    from effects.models import CompensationFunction, Effect, Session, Tool
    from orgs.models import Agent, AgentKey, Membership, Organization

    org = Organization.objects.create(slug="bench-size", name="Bench size")
    agent = Agent.objects.create(org=org, name="bench-agent")
    _, key = AgentKey.issue(agent)
    user = get_user_model().objects.create_user("bench-reviewer", password="bench-reviewer-pw")
    Membership.objects.create(user=user, org=org, role=Membership.Role.REVIEWER)
    fn = CompensationFunction.objects.create(org=org, fn_name="undo_send_email", fn_version="1.0.0",
                                             handler="webhook", target="http://127.0.0.1:9/undo")
    send = Tool.objects.create(org=org, name="send_email", tier="compensable", compensation_fn=fn,
                               compensation_args={"to": "{to}"})
    delete = Tool.objects.create(org=org, name="delete_account", tier="irreversible", approval_reason="For good",
                                 risk_tags=["data-loss"])
    now = timezone.now()
    held = Session.objects.bulk_create(Session(org=org, agent=agent, state=Session.State.AWAITING_APPROVAL)
                                       for _ in range(PENDING))
    effects = Effect.objects.bulk_create(
        Effect(org=org, session=s, tool=delete, tool_name=delete.name, tier=delete.tier, step_index=1,
               call_signature=uuid.uuid4().hex * 2, args={"account_id": n}, args_digest="-",
               state=Effect.State.PENDING) for n, s in enumerate(held))
    ApprovalRequest.objects.bulk_create(
        ApprovalRequest(org=org, effect=e, session=e.session, tool_name=delete.name, reason="For good",
                        risk_tags=["data-loss"], proposed_args=e.args, args_digest="-",
                        agent_context={"calls": [], "reasoning": []}, timeout_at=now + timedelta(hours=1))
        for e in effects)
    agent_client = Client(HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_HOST="127.0.0.1")
    reviewer = Client(HTTP_HOST="127.0.0.1")
    reviewer.force_login(user)
    return {"org": org, "agent": agent, "send": send, "delete": delete, "agent_client": agent_client,
            "reviewer": reviewer}


def _insert_select(model, exprs: dict[str, str], source: str, params: list) -> None:
    """INSERT … SELECT over `source`, every column from `exprs` or else the field's default."""
    from django.db import connection

    columns, values, args = [], [], list(params)
    defaults = []
    for f in model._meta.concrete_fields:
        columns.append(connection.ops.quote_name(f.column))
        if f.column in exprs:
            values.append(exprs[f.column])
        else:
            values.append(f"%s::{f.db_type(connection)}")
            defaults.append(f.get_db_prep_save(f.get_default(), connection))
    sql = f"INSERT INTO {model._meta.db_table} ({', '.join(columns)}) SELECT {', '.join(values)} FROM {source}"
    with connection.cursor() as cursor:
        cursor.execute(sql, args + defaults)


def load(data: dict, sessions: int, effects: int) -> float:
    """The history: finished sessions, their committed effects, decided approvals. Returns seconds."""
    from django.db import connection

    from approvals.models import ApprovalRequest
    from effects.models import Effect, Session

    started = time.monotonic()
    # History: older than the 7-day window the queue's statistics read.
    ago_min = "now() - interval '8 days' - g * interval '1 minute'"
    ago_s = "now() - interval '8 days' - g * interval '1 second'"
    org, agent, send, delete = data["org"].id, data["agent"].id, data["send"].id, data["delete"].id
    per = max(1, effects // sessions)
    _insert_select(Session, {
        "id": "md5('s' || g)::uuid", "org_id": "%s", "agent_id": "%s", "state": "'completed'",
        "step_index": f"{per}", "tool_calls": f"{per}", "created": ago_min,
        "updated": ago_min, "ended_at": ago_min},
        f"generate_series(1, {sessions}) g", [org, agent])
    _insert_select(Effect, {
        "id": "md5('e' || g)::uuid", "org_id": "%s", "session_id": f"md5('s' || (1 + g %% {sessions}))::uuid",
        "tool_id": "%s", "tool_name": "'send_email'", "tier": "'compensable'", "step_index": "g",
        "call_signature": "md5('e' || g) || md5('f' || g)", "args": "jsonb_build_object('to', 'u' || g || '@x.io')",
        "args_digest": "'-'", "state": "'committed'", "result": "'{\"sent\": true}'::jsonb",
        "created": ago_s, "updated": ago_s},
        f"generate_series(1, {effects}) g", [org, send])
    decided = sessions
    _insert_select(Effect, {
        "id": "md5('i' || g)::uuid", "org_id": "%s", "session_id": "md5('s' || g)::uuid", "tool_id": "%s",
        "tool_name": "'delete_account'", "tier": "'irreversible'", "step_index": "0",
        "call_signature": "md5('i' || g) || md5('j' || g)", "args": "jsonb_build_object('account_id', g)",
        "args_digest": "'-'", "state": "'committed'", "created": ago_min,
        "updated": ago_min},
        f"generate_series(1, {decided}) g", [org, delete])
    _insert_select(ApprovalRequest, {
        "id": "md5('a' || g)::uuid", "org_id": "%s", "effect_id": "md5('i' || g)::uuid",
        "session_id": "md5('s' || g)::uuid", "tool_name": "'delete_account'", "reason": "'For good'",
        "risk_tags": "'[\"data-loss\"]'::jsonb", "proposed_args": "jsonb_build_object('account_id', g)",
        "args_digest": "'-'", "agent_context": "'{\"calls\": [], \"reasoning\": []}'::jsonb",
        "timeout_at": ago_min, "state": "'approved'",
        "decided_by_label": "'bench-reviewer'", "decided_at": ago_min,
        "created": ago_min},
        f"generate_series(1, {decided}) g", [org])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # as autovacuum would have by now
    return time.monotonic() - started


def measure(data: dict, requests: int) -> dict[str, float]:
    from effects.models import Session

    session = Session.objects.create(org=data["org"], agent=data["agent"])
    steps = itertools.count(1)
    agent, reviewer = data["agent_client"], data["reviewer"]

    def intercept():
        step = next(steps)
        return agent.post(f"/api/v1/sessions/{session.id}/intercept",
                          {"tool": "send_email", "step_index": step, "args": {"to": f"m{step}@x.io"}},
                          content_type="application/json")

    kinds = {"compensable intercept": (intercept, 201),
             "queue page": (lambda: reviewer.get("/"), 200),
             "GET /approvals?state=pending": (lambda: reviewer.get("/api/v1/approvals?state=pending"), 200)}
    out = {}
    for name, (op, expect) in kinds.items():
        for _ in range(20):  # warm
            assert op().status_code == expect
        times = []
        for _ in range(requests if name == "compensable intercept" else max(20, requests // 10)):
            started = time.perf_counter()
            op()
            times.append((time.perf_counter() - started) * 1000)
        out[name] = statistics.median(times)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--effects", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    setup_django()
    data = prepare()
    empty = measure(data, args.requests)
    seconds = load(data, args.sessions, args.effects)
    large = measure(data, args.requests)
    print(f"in-process, PostgreSQL: the org empty, then with {args.sessions:,} sessions, {args.effects:,} effects "
          f"and {args.sessions:,} decided approvals (loaded in {seconds:.0f} s); {PENDING} pending throughout")
    for name in empty:
        print(f"  {name:30} empty p50 {empty[name]:7.2f} ms   large p50 {large[name]:7.2f} ms   "
              f"x{large[name] / empty[name]:4.2f}")
    return {"empty": empty, "large": large}


if __name__ == "__main__":
    main()
