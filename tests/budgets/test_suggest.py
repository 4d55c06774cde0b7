"""GET /api/v1/agents/{name}/budget/suggest: the last 7 days of runs, p50/p95/max, a histogram,
and a cap just above what healthy runs needed."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from effects.models import Session

URL = "/api/v1/agents/cleanup/budget/suggest"


def runs(persona, counts: list[int], *, state: str = "completed", violation: dict | None = None,
         age: timedelta = timedelta(hours=1)) -> None:
    Session.objects.bulk_create(
        Session(org=persona.org, agent=persona.agent, state=state, irreversible_calls=n, tool_calls=n * 2,
                cost=Decimal(n) * 5 + Decimal("0.01"), violation=violation, created=timezone.now() - age)
        for n in counts)


def test_it_sizes_the_cap_just_above_healthy_runs(acme):
    runs(acme, [1, 2, 2, 2, 3, 3, 3, 3, 2, 1] * 2)  # 20 healthy runs
    runs(acme, [40], state="completed", violation={"limit": "max_irreversible_per_run"})  # a runaway, refused
    runs(acme, [9], state="failed")
    runs(acme, [100], age=timedelta(days=8))  # outside the window
    runs(acme, [50], state="running")  # not finished counting

    body = acme.viewer.get(URL).json()

    assert (body["runs"], body["healthy_runs"], body["runs_with_violation"]) == (22, 20, 1)
    irreversible = body["irreversible_per_run"]
    assert (irreversible["p50"], irreversible["p95"], irreversible["max"]) == (2, 9, 40)
    assert (irreversible["healthy_p95"], irreversible["healthy_max"]) == (3, 3)
    assert irreversible["suggested"] == {"limit": "max_irreversible_per_run", "value": 4, "healthy_runs_over_it": 0}
    assert irreversible["current"] == {"limit": "max_irreversible_per_run", "value": None, "runs_over_it": 0}
    assert sum(b["runs"] for b in irreversible["histogram"]) == 22
    cost = body["cost_per_run"]
    assert (cost["healthy_p95"], cost["suggested"]["value"]) == (15.01, 16.52)
    assert len(cost["histogram"]) == 10 and sum(b["runs"] for b in cost["histogram"]) == 22


def test_the_suggestion_is_never_below_a_healthy_run(acme):
    runs(acme, [1] * 40 + [6])  # one big run that went well: above the p95, still healthy

    body = acme.viewer.get(URL).json()

    irreversible, cost = body["irreversible_per_run"], body["cost_per_run"]
    assert (irreversible["healthy_p95"], irreversible["healthy_max"]) == (1, 6)
    assert irreversible["suggested"] == {"limit": "max_irreversible_per_run", "value": 6, "healthy_runs_over_it": 0}
    assert (cost["healthy_max"], cost["suggested"]["value"], cost["suggested"]["healthy_runs_over_it"]) == (
        30.01, 30.01, 0)


def test_the_agents_page_draws_the_same_suggestion(acme):
    from approvals import dashboard

    runs(acme, [1] * 40 + [6])

    row = dashboard.agents_context(acme.org)["agents"][0]

    assert row["caps"]["irreversible"]["suggested"] == 6
    assert row["caps"]["cost"]["suggested"] == 30.01


def test_small_counts_get_one_bin_per_value(acme):
    runs(acme, [0, 1, 1, 3])

    histogram = acme.viewer.get(URL).json()["irreversible_per_run"]["histogram"]

    assert [(b["from"], b["runs"]) for b in histogram] == [(0, 1), (1, 2), (2, 0), (3, 1)]


def test_it_compares_with_the_current_cap(acme, budget_tools):
    acme.admin.patch("/api/v1/agents/cleanup/budget", {"max_irreversible_per_run": 2}, format="json")
    runs(acme, [1, 2, 3])

    current = acme.viewer.get(URL).json()["irreversible_per_run"]["current"]

    assert current == {"limit": "max_irreversible_per_run", "value": 2, "runs_over_it": 1}


def test_no_runs_no_suggestion(acme):
    body = acme.viewer.get(URL).json()

    assert body["runs"] == 0
    assert body["irreversible_per_run"]["suggested"]["value"] is None
    assert body["irreversible_per_run"]["histogram"] == []


def test_suggest_permissions(client, acme, outsider):
    assert acme.api.get(URL).status_code == 200  # an agent may size its own budget
    assert client.get(URL).status_code == 401
    assert outsider.viewer.get(URL.replace("cleanup", "nobody")).status_code == 404
    assert acme.admin.post(URL, {}, format="json").status_code == 405
