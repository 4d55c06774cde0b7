"""Today's usage is true whether or not a daily limit is set: from the day counters while one is,
from the effect log when none is; a limit set mid-day counts the calls made before it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from budgets.models import DayCounter
from effects.models import Effect, SafeCall
from tests.budgets.conftest import Run, set_budget, set_org_budget

TODAY = {"tool_calls_day": 3, "irreversible_day": 2, "cost_day": 2.01}


def two_drops_and_a_read(persona) -> Run:
    """drop_table (weight 1, irreversible) twice, list_inactive_accounts (SAFE, 0.01) reported once."""
    run = Run(persona)
    assert run.drop(safe=["list_inactive_accounts"]).status_code == 201
    assert run.drop().status_code == 201
    return run


@pytest.mark.parametrize("limits", [{}, {"max_irreversible_per_run": 5}, {"max_cost_per_day": 100}],
                         ids=["no-policy", "no-daily-limit", "daily-limit"])
def test_it_reports_todays_usage_with_or_without_a_daily_limit(acme, outsider, budget_tools, limits):
    if limits:
        set_budget(acme, **limits)
    run = two_drops_and_a_read(acme)
    Run(outsider)  # another org's runs count for nobody here

    usage = acme.viewer.get("/api/v1/agents/cleanup/budget").json()["usage"]
    listed = acme.viewer.get("/api/v1/agents").json()["agents"][0]["today"]

    assert {key: usage[key] for key in TODAY} == TODAY
    assert listed == {"tool_calls": 3, "irreversible_calls": 2, "cost": 2.01}
    assert {key: run.budget()["usage"][key] for key in TODAY} == TODAY
    assert DayCounter.objects.exists() == ("max_cost_per_day" in limits)  # the hot path wrote only when capped


def test_yesterdays_calls_are_not_todays(acme, budget_tools):
    run = two_drops_and_a_read(acme)
    yesterday = acme.org.today() - timedelta(days=1)
    moment = run.session.created.replace(year=yesterday.year, month=yesterday.month, day=yesterday.day)
    Effect.objects.filter(session_id=run.id).update(created=moment)
    SafeCall.objects.filter(session_id=run.id).update(created=moment)

    usage = acme.viewer.get("/api/v1/agents/cleanup/budget").json()["usage"]

    assert (usage["tool_calls_day"], usage["irreversible_day"], usage["cost_day"]) == (0, 0, 0)


def test_a_daily_limit_set_mid_day_counts_the_calls_made_before_it(acme, budget_tools):
    run = two_drops_and_a_read(acme)

    body = set_budget(acme, max_irreversible_per_day=3)

    assert body["remaining"]["irreversible_day"] == 1
    assert run.drop().status_code == 201
    refused = run.drop()
    assert (refused.status_code, refused.json()["limit"]) == (429, "max_irreversible_per_day")
    assert DayCounter.objects.get(agent=acme.agent).irreversible_calls == 3


def test_an_org_default_daily_limit_set_mid_day_counts_them_too(acme, budget_tools):
    two_drops_and_a_read(acme)

    set_org_budget(acme, max_tool_calls_per_day=4)

    row = DayCounter.objects.get(agent=acme.agent)
    assert (row.tool_calls, row.irreversible_calls, float(row.cost)) == (3, 2, 2.01)
    run = Run(acme)
    assert run.drop().status_code == 201
    assert run.drop().status_code == 429
