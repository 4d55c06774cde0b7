"""What each agent used on a day of its org's calendar, true whether or not a daily limit is set.

Day counters (`DayCounter`) are written on the intercept path only while a daily limit is set:
a write on a row every run of the agent shares is the price of enforcing the cap, and an agent
without one should not pay it (the intercept's query count is pinned). Without a limit the day's
usage is read from the effect log instead: every admitted call is an `Effect` row or a reported
`SafeCall` row, each with its time, so the day's calls, irreversible calls and cost can be
summed afterwards, weighted with the tools' current cost weights (an unregistered name weighs
1.0 and is not irreversible, as the guard charges it).

Readers take the larger of the two, counter by counter: while a limit is set the counter is the
truth the guard enforces; without one the log is; and `catch_up` seeds the counter from the log
when a daily limit starts applying mid-day, so the cap sees the calls made before it.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import Count

from budgets.models import DayCounter, Usage
from effects.models import Effect, SafeCall, Tier, Tool
from orgs.models import Organization


def _bounds(org: Organization, day: dt.date) -> tuple[dt.datetime, dt.datetime]:
    start = dt.datetime.combine(day, dt.time.min, tzinfo=org.tz)
    return start, dt.datetime.combine(day + dt.timedelta(days=1), dt.time.min, tzinfo=org.tz)


def from_log(org: Organization, day: dt.date, agent_ids: Iterable[Any]) -> dict[Any, Usage]:
    """The agents' usage on `day`, summed from the effect log. Three queries: the org's tools
    (weights), the effects and the SAFE calls of that day, each grouped by agent and tool."""
    agent_ids = list(agent_ids)
    if not agent_ids:
        return {}
    start, end = _bounds(org, day)
    weights = {name: (weight, irreversible) for name, weight, irreversible in
               Tool.objects.for_org(org).values_list("name", "cost_weight", "irreversible")}
    used: dict[Any, Usage] = defaultdict(Usage)
    effects = (Effect.objects.filter(session__agent_id__in=agent_ids, created__gte=start, created__lt=end)
               .order_by().values("session__agent_id", "tool_name", "tier").annotate(n=Count("id"))
               .values_list("session__agent_id", "tool_name", "tier", "n"))
    safe = (SafeCall.objects.filter(session__agent_id__in=agent_ids, created__gte=start, created__lt=end)
            .order_by().values("session__agent_id", "tool_name").annotate(n=Count("id"))
            .values_list("session__agent_id", "tool_name", "n"))
    rows = [(agent, name, tier == Tier.IRREVERSIBLE, n) for agent, name, tier, n in effects]
    rows += [(agent, name, False, n) for agent, name, n in safe]
    for agent, name, irreversible_tier, n in rows:
        weight, irreversible = weights.get(name, (Decimal("1"), irreversible_tier))
        used[agent] = used[agent] + Usage(n, n * int(irreversible), weight * n)
    return dict(used)


def larger(a: Usage | None, b: Usage | None) -> Usage:
    a, b = a or Usage(), b or Usage()
    return Usage(max(a.tool_calls, b.tool_calls), max(a.irreversible_calls, b.irreversible_calls),
                 max(a.cost, b.cost))


def today(org: Organization, agent_ids: Iterable[Any],
          counters: dict[Any, DayCounter] | None = None) -> dict[Any, Usage]:
    """Each agent's usage today: the larger of its day counter (read here unless given) and the
    log. Four queries (three with the counters given)."""
    agent_ids = list(agent_ids)
    day = org.today()
    if counters is None:
        counters = {row.agent_id: row for row in DayCounter.objects.filter(agent_id__in=agent_ids, day=day)}
    logged = from_log(org, day, agent_ids)
    return {agent: larger(counters[agent].usage() if agent in counters else None, logged.get(agent))
            for agent in agent_ids}


def catch_up(org: Organization, agent_ids: Iterable[Any]) -> None:
    """Seed today's counters from the log (never lowering them), when a daily limit starts to
    apply to these agents: a cap set at noon counts the morning's calls.

    Calls admitted while the change commits, under the old (untracked) limits, are in neither;
    that is at most the calls in flight at that moment."""
    day = org.today()
    logged = from_log(org, day, agent_ids)
    if not logged:
        return
    DayCounter.objects.bulk_create([DayCounter(org=org, agent_id=agent, day=day) for agent in logged],
                                   ignore_conflicts=True)
    with transaction.atomic():
        # Locked: a concurrent intercept's guarded `used = used + x` waits, then adds on top of
        # the seeded value instead of being overwritten by it.
        for row in DayCounter.objects.select_for_update().filter(agent_id__in=list(logged), day=day):
            seeded = larger(row.usage(), logged[row.agent_id])
            DayCounter.objects.filter(pk=row.pk).update(tool_calls=seeded.tool_calls,
                                                        irreversible_calls=seeded.irreversible_calls,
                                                        cost=seeded.cost)
