"""Day counters belong to the org's calendar day (its time zone), one row per agent and day."""

from __future__ import annotations

import zoneinfo
from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from budgets.models import DayCounter
from tests.budgets.conftest import Run, set_budget


def test_the_day_is_the_orgs_day_in_its_time_zone(acme, budget_tools):
    set_budget(acme, max_cost_per_day=100)
    days = []
    # UTC+14 and UTC-11 are 25 hours apart: their dates always differ, whatever the time now.
    for zone in ("Pacific/Kiritimati", "Pacific/Pago_Pago"):
        acme.org.time_zone = zone
        acme.org.save()
        Run(acme).drop()
        days.append(DayCounter.objects.order_by("-pk").values_list("day", flat=True).first())

    assert days[0] == timezone.now().astimezone(zoneinfo.ZoneInfo("Pacific/Kiritimati")).date()
    assert days[1] == timezone.now().astimezone(zoneinfo.ZoneInfo("Pacific/Pago_Pago")).date()
    assert days[0] != days[1]
    assert DayCounter.objects.count() == 2


def test_a_new_day_starts_from_zero_and_yesterday_stays_on_record(acme, budget_tools):
    set_budget(acme, max_cost_per_day=2)
    yesterday = acme.org.today() - timedelta(days=1)
    DayCounter.objects.create(org=acme.org, agent=acme.agent, day=yesterday, tool_calls=50, cost=Decimal(500))

    run = Run(acme)
    assert run.drop().status_code == 201
    assert run.drop().status_code == 201
    assert run.drop().status_code == 429

    assert float(DayCounter.objects.get(agent=acme.agent, day=acme.org.today()).cost) == 2
    assert DayCounter.objects.get(day=yesterday).cost == 500


def test_without_a_daily_limit_no_day_row_is_written(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=5)

    Run(acme).drop()

    assert not DayCounter.objects.exists()
    assert acme.viewer.get("/api/v1/agents/cleanup/budget").json()["day_tracked"] is False
