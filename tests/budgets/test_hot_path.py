"""The guard's share of an intercept: one query (policy + org default + org) without a daily
limit, one more (the day counter's guarded UPDATE) with one; SAFE reports ride along.
On PostgreSQL, without a daily limit, the policy is cached and the caps are guards in the
intercept's one statement (lifecycle/intercept/one_statement.py): no budget query at all."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.budgets.conftest import Run, set_budget


def budget_queries(run: Run, **call) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        response = run.call(**call)
    assert response.status_code == 201, response.content
    return [q["sql"] for q in ctx.captured_queries if "budgets_" in q["sql"]]


FAST = connection.vendor == "postgresql"


@pytest.mark.parametrize("limits, expected", [
    ({}, 0 if FAST else 1),
    ({"max_irreversible_per_run": 5, "tool_caps_per_run": {"send_email": 9}}, 0 if FAST else 1),
    ({"max_cost_per_day": 100}, 2),
])
def test_the_guard_adds_at_most_two_queries(acme, budget_tools, limits, expected):
    if limits:
        set_budget(acme, **limits)
    run = Run(acme)
    run.call(tool="send_email", args={"to": "warm@x.io"})  # the day's row exists from here on

    plain = budget_queries(run, tool="send_email", args={"to": "a@x.io"})
    with_reads = budget_queries(run, tool="send_email", args={"to": "b@x.io"},
                                safe=["list_inactive_accounts"] * 5)

    assert len(plain) == len(with_reads) == expected
