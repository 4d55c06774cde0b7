"""Observe mode: a dry run for a new cap. It refuses nothing and records everything it would
have refused (refusal rows and permission_denied events with observed=true)."""

from __future__ import annotations

from budgets.models import DayCounter, Refusal
from effects.models import Effect
from orgs.models import Event
from tests.budgets.conftest import Run, set_budget


def test_observe_mode_refuses_nothing_and_records_every_call_it_would_have_refused(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=1, max_cost_per_day=2, mode="observe")
    run = Run(acme)

    statuses = [run.drop().status_code for _ in range(3)]

    assert statuses == [201, 201, 201]
    assert Effect.objects.filter(session_id=run.id).count() == 3
    refusals = list(Refusal.objects.order_by("created"))
    assert [(r.limit, r.observed, r.reason) for r in refusals] == [
        ("max_irreversible_per_run", True, "budget limit max_irreversible_per_run reached (2 > 1)"),
        ("max_irreversible_per_run", True, "budget limit max_irreversible_per_run reached (3 > 1)")]
    events = Event.objects.filter(kind="permission_denied")
    assert events.count() == 2 and all(e.data["observed"] for e in events)
    session = run.session
    assert (session.irreversible_calls, session.violation["observed"]) == (3, True)
    assert float(DayCounter.objects.get(agent=acme.agent).cost) == 3  # counted past the day cap too


def test_observe_mode_records_a_day_cap_it_would_have_hit(acme, budget_tools):
    set_budget(acme, max_cost_per_day=1, mode="observe")
    run = Run(acme)
    run.drop()

    assert run.drop().status_code == 201

    refusal = Refusal.objects.get()
    assert (refusal.limit, refusal.observed) == ("max_cost_per_day", True)
    assert refusal.reason == "budget limit max_cost_per_day reached (2 > 1)"


def test_switching_to_enforce_refuses_from_the_next_call(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=1, mode="observe")
    run = Run(acme)
    run.drop()
    assert run.drop().status_code == 201

    set_budget(acme, mode="enforce")

    assert run.drop().status_code == 429
    violation = run.session.violation
    assert violation["observed"] is False  # an enforced refusal outranks the dry run's record
    assert Refusal.objects.filter(observed=False).count() == 1


def test_the_refusals_api_filters_observed_ones(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=0, mode="observe")
    Run(acme).drop()

    observed = acme.viewer.get("/api/v1/refusals?observed=true").json()["refusals"]
    enforced = acme.viewer.get("/api/v1/refusals?observed=false").json()["refusals"]

    assert [r["observed"] for r in observed] == [True]
    assert enforced == []
