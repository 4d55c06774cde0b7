"""Sizing help: how much the agent's healthy runs of the last days needed, and a cap just above it."""

from __future__ import annotations

import math
from datetime import timedelta
from decimal import ROUND_CEILING, Decimal
from typing import Any

from django.utils import timezone

from budgets.models import Limits, number
from effects.models import Session
from orgs.models import Agent

WINDOW_DAYS = 7
MAX_BINS = 10
# (policy field it sizes, Session counter, key in the answer)
SIZED = (
    ("max_irreversible_per_run", "irreversible_calls", "irreversible_per_run"),
    ("max_cost_per_run", "cost", "cost_per_run"),
    ("max_tool_calls_per_run", "tool_calls", "tool_calls_per_run"),
)


def percentile(sorted_values: list, p: float) -> Any:
    """Nearest rank: the smallest value that at least p % of the runs do not exceed."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(p / 100 * len(sorted_values)) - 1)]


def histogram(values: list) -> list[dict[str, Any]]:
    """One bin per value for small counts, else MAX_BINS equal bins from 0 to the maximum."""
    if not values:
        return []
    top = max(values)
    if all(isinstance(v, int) for v in values) and top < MAX_BINS * 2:
        return [{"from": n, "to": n, "runs": values.count(n)} for n in range(top + 1)]
    width = Decimal(top) / MAX_BINS if top else Decimal(1)
    bins = [{"from": number(width * n), "to": number(width * (n + 1)), "runs": 0} for n in range(MAX_BINS)]
    for value in values:
        bins[min(MAX_BINS - 1, int(Decimal(value) / width))]["runs"] += 1
    return bins


def just_above(value: Any) -> Any:
    """A cap that lets the value through with a little room: +1 call, or +10 % cost (cents up)."""
    if value is None:
        return None
    if isinstance(value, int):
        return value + 1
    return (value * Decimal("1.1")).quantize(Decimal("0.01"), rounding=ROUND_CEILING) or Decimal("0.01")


def suggested_cap(healthy: list) -> Any:
    """Just above the healthy runs' p95, and never below the largest healthy run: a suggestion
    that would have refused a run that went well is one nobody can adopt (with few runs the p95
    is the maximum anyway; with many, the outlier that went well still sets the floor)."""
    if not healthy:
        return None
    good = sorted(healthy)
    return max(just_above(percentile(good, 95)), good[-1])


def suggest(agent: Agent, now=None) -> dict[str, Any]:
    """1. The agent's runs that ended in the window (open ones are not finished counting).
    2. Healthy: completed, with no budget violation. Refused or failed runs are what a cap is for.
    3. Per counter: p50, p95, max and a histogram of all runs; the suggestion sits just above the
       p95 of healthy runs and never below the largest of them (`suggested_cap`)."""
    since = (now or timezone.now()) - timedelta(days=WINDOW_DAYS)
    runs = list(Session.objects.filter(agent=agent, created__gte=since).exclude(state__in=Session.OPEN)
                .values("state", "violation", "tool_calls", "irreversible_calls", "cost"))
    healthy = [run for run in runs if run["state"] == Session.State.COMPLETED and not run["violation"]]
    limits = Limits.for_agent(agent.org_id, agent.id)
    body: dict[str, Any] = {"agent": agent.name, "window_days": WINDOW_DAYS, "since": since.isoformat(),
                            "runs": len(runs), "healthy_runs": len(healthy),
                            "runs_with_violation": sum(1 for run in runs if run["violation"])}
    for limit, counter, key in SIZED:
        values = sorted(run[counter] for run in runs)
        good = sorted(run[counter] for run in healthy)
        suggested = suggested_cap(good)
        body[key] = {
            "p50": number(percentile(values, 50)), "p95": number(percentile(values, 95)),
            "max": number(values[-1] if values else None), "histogram": histogram(values),
            "healthy_p95": number(percentile(good, 95)), "healthy_max": number(good[-1] if good else None),
            "suggested": {"limit": limit, "value": number(suggested),
                          "healthy_runs_over_it": sum(1 for v in good if suggested is not None and v > suggested)},
            "current": {"limit": limit, "value": number(limits.values[limit]),
                        "runs_over_it": sum(1 for v in values if limits.values[limit] is not None
                                            and v > limits.values[limit])},
        }
    body["method"] = ("Runs that ended in the last 7 days; healthy = completed without a budget violation. "
                      "Suggested caps sit just above the healthy runs' p95 (+1 call, or +10 % cost), "
                      "and never below the largest healthy run.")
    return body
