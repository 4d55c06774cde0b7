"""The guide's daily_cap.py, through our API: a per-run cap resets every run; a cost weight
turns max_cost_per_day into a daily ceiling. The printed table must come out the same."""

from __future__ import annotations

import pytest

from budgets.models import DayCounter
from effects.models import Effect
from tests.budgets.conftest import Run, approve, limited, register_budget_tools, set_budget

GUIDE_OUTPUT = """\
run 1, delete #1: allowed
run 1, delete #2: allowed
run 1, delete #3: refused by max_irreversible_per_run
run 2, delete #1: allowed
run 2, delete #2: refused by max_cost_per_day
run 2, delete #3: refused by max_cost_per_day
left: {'irreversible_run': 1, 'cost_day': 0.98}"""

COMPENSABLE_DELETE = {"name": "delete_account", "tier": "compensable", "irreversible": True, "cost_weight": 5.0,
                      "compensation": {"fn_name": "restore_table", "fn_version": "1.0.0",
                                       "args": {"table": "{account_id}"}}}


def delete(run: Run, n: int, *, approved: bool) -> str:
    """One deletion; the run's read is reported with its first one. An irreversible delete
    that passes the budget waits for a reviewer, who approves it here."""
    response = run.call("delete_account", {"account_id": f"acct-10{n}"},
                        safe=["list_inactive_accounts"] if n == 1 else [])
    body = response.json()
    if response.status_code == 429:
        return f"refused by {body['limit']}"
    effect = body["effect"]["id"]
    if approved:
        assert response.status_code == 202, body
        approve(effect)
    else:
        assert response.status_code == 201, body
    commit = run.persona.api.post(f"/api/v1/effects/{effect}/commit", {"result": "deleted"}, format="json")
    assert commit.status_code == 200, commit.content
    return "allowed"


@pytest.mark.parametrize("tier", ["irreversible", "compensable"])
def test_it_prints_the_guides_daily_cap_table(acme, tier):
    register_budget_tools(acme, *([COMPENSABLE_DELETE] if tier == "compensable" else []))
    set_budget(acme, max_irreversible_per_run=2, max_cost_per_day=16)
    lines = []
    for run_number in (1, 2):
        if run_number == 2:  # run 1 hit a cap, so on_exceeded paused the agent when it ended
            assert acme.reviewer.post("/api/v1/agents/cleanup/resume").status_code == 200
        run = Run(acme)
        for n in (1, 2, 3):
            lines.append(f"run {run_number}, delete #{n}: {delete(run, n, approved=tier == 'irreversible')}")
        assert run.complete().status_code == 200

    left = limited(acme.viewer.get("/api/v1/agents/cleanup/budget").json()["remaining"])
    lines.append(f"left: {left}")

    assert "\n".join(lines) == GUIDE_OUTPUT
    assert Effect.objects.filter(tool_name="delete_account", state="committed").count() == 3
    day = DayCounter.objects.get(agent=acme.agent)
    assert (day.tool_calls, day.irreversible_calls, float(day.cost)) == (5, 3, 15.02)
