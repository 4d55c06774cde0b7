"""Point 3: caps hold under parallel calls. Real threads, each with its own connection (from
the psycopg pool on PostgreSQL), all released by a barrier at once."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import pytest

from budgets.models import DayCounter, Refusal
from effects.models import Effect, Session
from tests.budgets.conftest import register_budget_tools, set_budget
from tests.conftest import agent_client, in_parallel, make_persona, open_session

THREADS = 30


@pytest.mark.django_db(transaction=True)
def test_thirty_parallel_irreversible_calls_in_one_session_admit_exactly_the_cap():
    acme = make_persona("acme-parallel-run")
    register_budget_tools(acme)
    set_budget(acme, max_irreversible_per_run=2)
    session = open_session(acme)

    def call(n: int) -> int:
        return agent_client(acme.key).post(f"/api/v1/sessions/{session}/intercept", {
            "tool": "drop_table", "args": {"table": f"t{n}"}, "step_index": n + 1}, format="json").status_code

    statuses = Counter(in_parallel(call, THREADS))

    assert statuses == {201: 2, 429: THREADS - 2}
    assert Effect.objects.filter(session_id=session).count() == 2
    assert Session.objects.get(pk=session).irreversible_calls == 2
    assert Refusal.objects.filter(session_id=session, limit="max_irreversible_per_run").count() == THREADS - 2


@pytest.mark.django_db(transaction=True)
def test_thirty_sessions_at_once_never_overshoot_a_daily_cost_cap():
    acme = make_persona("acme-parallel-day")
    register_budget_tools(acme, {"name": "charge_card", "tier": "compensable", "cost_weight": 2.5,
                                 "compensation": {"fn_name": "restore_table", "fn_version": "1.0.0"}})
    set_budget(acme, max_cost_per_day=10)
    sessions = [open_session(acme) for _ in range(THREADS)]

    def call(n: int) -> int:
        return agent_client(acme.key).post(f"/api/v1/sessions/{sessions[n]}/intercept", {
            "tool": "charge_card", "args": {"n": n}, "step_index": 2,
            "safe_calls": [{"tool": "list_inactive_accounts", "step_index": 1}]}, format="json").status_code

    statuses = Counter(in_parallel(call, THREADS))

    # Each run's SAFE read (0.01) is charged whatever happens, so 3 cards fit (3 × 2.51 + reads ≤ 10).
    assert statuses == {201: 3, 429: THREADS - 3}
    day = DayCounter.objects.get(agent=acme.agent)
    assert day.cost == Decimal("7.5") + THREADS * Decimal("0.01")
    assert day.cost <= 10
    assert day.tool_calls == 3 + THREADS
    assert Refusal.objects.filter(limit="max_cost_per_day").count() == THREADS - 3
