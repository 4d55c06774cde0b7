"""Point 4: when a run that had a violation ends, its first violation applies on_exceeded, once:
pause suspends the agent, stop stops it and rolls the run back, escalate suspends it and calls
the escalation webhook. Resume starts the next run fresh; the day's counters stay."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from approvals.webhooks import verify
from budgets.models import DayCounter, RunOutcome
from deliveries import tasks
from deliveries.models import Delivery
from effects.models import Session
from orgs.models import Agent, Event
from tests.budgets.conftest import Run, register_budget_tools, reject, set_budget
from tests.budgets.receiver import receiver
from tests.processes import celery_worker


def over_the_cap(persona) -> Run:
    """A run that was refused once (max_irreversible_per_run 1, two drops)."""
    run = Run(persona)
    assert run.drop().status_code == 201
    assert run.drop().status_code == 429
    return run


def kinds() -> list[str]:
    return list(Event.objects.order_by("created").values_list("kind", flat=True))


def test_pause_suspends_the_agent_when_the_run_completes(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=1)
    run = over_the_cap(acme)
    acme.agent.refresh_from_db()
    assert acme.agent.state == "active"  # the run goes on; the action waits for its end

    assert run.complete().status_code == 200

    acme.agent.refresh_from_db()
    assert (acme.agent.state, acme.agent.suspend_reason) == ("suspended", "budget")
    exceeded = Event.objects.get(kind="budget.exceeded")
    assert exceeded.data | {"current": 2} == exceeded.data
    assert (exceeded.data["limit"], exceeded.data["action"], str(exceeded.session_id)) == (
        "max_irreversible_per_run", "pause", run.id)
    assert Event.objects.get(kind="agent.suspended").data["reason"] == "budget"
    refused = acme.api.post("/api/v1/sessions", {"agent": "cleanup"}, format="json")
    assert refused.status_code == 423
    assert (refused.json()["error"], refused.json()["reason"]) == ("agent_suspended", "budget")


def test_pause_applies_when_the_run_fails_too(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=1)
    run = over_the_cap(acme)

    assert run.fail().status_code == 200

    acme.agent.refresh_from_db()
    assert acme.agent.state == "suspended"


def test_a_run_without_violation_changes_nothing(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=1)
    run = Run(acme)
    run.drop()

    assert run.complete().status_code == 200

    acme.agent.refresh_from_db()
    assert acme.agent.state == "active"
    assert not RunOutcome.objects.exists()
    assert not Event.objects.filter(kind="budget.exceeded").exists()


def test_resume_starts_the_next_run_fresh_and_keeps_the_days_counters(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=1, max_irreversible_per_day=10)
    over_the_cap(acme).complete()

    response = acme.reviewer.post("/api/v1/agents/cleanup/resume", {"note": "checked the logs"}, format="json")

    assert response.status_code == 200
    assert response.json()["agent"]["state"] == "active"
    assert response.json()["agent"]["today"]["irreversible_calls"] == 1
    resumed = Event.objects.get(kind="agent.resumed")
    assert (resumed.data["by"], resumed.data["previous_reason"]) == ("acme-reviewer", "budget")
    run = Run(acme)
    budget = run.budget()
    assert (budget["usage"]["irreversible_run"], budget["remaining"]["irreversible_run"]) == (0, 1)
    assert (budget["usage"]["irreversible_day"], budget["remaining"]["irreversible_day"]) == (1, 9)
    assert run.drop().status_code == 201


def test_on_exceeded_applies_once_per_run(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=1)
    run = over_the_cap(acme)
    pending = run.call("delete_account", {"account_id": "acct-101"})
    assert pending.status_code == 429  # also over the cap: refused before approval

    set_budget(acme, max_irreversible_per_run=2)
    waiting = run.call("delete_account", {"account_id": "acct-101"})
    assert waiting.status_code == 202
    reject(waiting.json()["effect"]["id"], "no")  # the run halts: it has ended
    acme.agent.refresh_from_db()
    assert acme.agent.state == "suspended"
    assert acme.reviewer.post("/api/v1/agents/cleanup/resume").status_code == 200

    failed = acme.reviewer.post(f"/api/v1/sessions/{run.id}/fail", {"error": "rolled back"}, format="json")
    assert failed.status_code == 200, failed.json()

    acme.agent.refresh_from_db()
    assert acme.agent.state == "active"
    assert Event.objects.filter(kind="budget.exceeded").count() == 1
    assert RunOutcome.objects.get().action == "pause"


def test_stop_stops_the_agent_and_fails_a_halted_run_so_its_undo_stack_is_walked(
        acme, budget_tools, django_capture_on_commit_callbacks):
    set_budget(acme, max_irreversible_per_run=2, on_exceeded="stop")
    run = Run(acme)
    run.drop()
    run.drop()
    assert run.drop().status_code == 429
    set_budget(acme, max_irreversible_per_run=3)
    waiting = run.call("delete_account", {"account_id": "acct-101"})

    with django_capture_on_commit_callbacks(execute=True):
        reject(waiting.json()["effect"]["id"], "no")

    acme.agent.refresh_from_db()
    assert acme.agent.state == "stopped"
    session = run.session
    assert session.state != "halted" and session.error == "budget exceeded: on_exceeded stop"
    assert session.transitions.filter(to_state="halted", actor="alice").exists()
    assert session.transitions.filter(to_state="failed", actor="budget").exists()
    assert Event.objects.get(kind="budget.exceeded").data["rollback"] == "fail"
    assert acme.api.post("/api/v1/sessions", {"agent": "cleanup"}, format="json").status_code == 423


def test_stop_on_a_failing_run_leaves_the_rollback_to_the_failure(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=1, on_exceeded="stop")
    run = over_the_cap(acme)

    assert run.fail().status_code == 200

    acme.agent.refresh_from_db()
    assert acme.agent.state == "stopped"
    assert Event.objects.get(kind="budget.exceeded").data["rollback"] == "failed"
    assert run.session.state != "running"


def test_stop_on_a_completed_run_undoes_it(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=1, on_exceeded="stop")
    run = over_the_cap(acme)

    assert run.complete().status_code == 200

    acme.agent.refresh_from_db()
    assert acme.agent.state == "stopped"
    rollback = Event.objects.get(kind="budget.exceeded").data["rollback"]
    if hasattr(Session, "undo"):  # the compensation branch's Session.undo()
        assert rollback == "undo"
        assert run.session.state != "completed"
    else:
        assert rollback == "unavailable"


def test_a_stopped_agent_is_resumed_only_by_an_admin(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=1, on_exceeded="stop")
    over_the_cap(acme).fail()

    assert acme.reviewer.post("/api/v1/agents/cleanup/resume").status_code == 403
    assert acme.admin.post("/api/v1/agents/cleanup/resume").status_code == 200


def test_observe_mode_applies_nothing_and_records_what_would_have_happened(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=1, mode="observe")
    run = Run(acme)
    assert [run.drop().status_code for _ in range(2)] == [201, 201]

    run.complete()

    acme.agent.refresh_from_db()
    assert acme.agent.state == "active"
    exceeded = Event.objects.get(kind="budget.exceeded")
    assert (exceeded.data["action"], exceeded.data["would_apply"], exceeded.data["observed"]) == (
        "none", "pause", True)
    assert not Event.objects.filter(kind="agent.suspended").exists()


def test_escalate_validates_its_webhook(acme, budget_tools):
    response = acme.admin.patch("/api/v1/agents/cleanup/budget", {"on_exceeded": "escalate"}, format="json")
    assert response.status_code == 400
    assert "escalation_url" in response.json()["fields"]

    response = acme.admin.patch("/api/v1/agents/cleanup/budget",
                                {"on_exceeded": "escalate", "escalation_url": "ftp://x"}, format="json")
    assert response.status_code == 400


def test_escalation_retries_with_backoff_then_delivers(acme, budget_tools):
    with receiver(statuses=[503]) as (url, hits):
        set_budget(acme, max_irreversible_per_run=1, on_exceeded="escalate", escalation_url=url)
        over_the_cap(acme).complete()
        escalation = Delivery.objects.get(purpose="escalation")

        tasks.deliver(str(escalation.id))
        escalation.refresh_from_db()
        assert (escalation.state, escalation.attempts, escalation.last_status_code) == ("pending", 1, 503)
        assert escalation.next_attempt_at > timezone.now() + timedelta(seconds=10)

        tasks.deliver(str(escalation.id))  # not due yet: a redelivered message does nothing
        assert len(hits) == 1

        # Due for longer than the sweep's grace: its message was lost.
        Delivery.objects.filter(pk=escalation.pk).update(next_attempt_at=timezone.now() - timedelta(minutes=1))
        assert tasks.sweep.apply().get() == 1  # the sweep finds it (and enqueues it)
        tasks.deliver(str(escalation.id))

    escalation.refresh_from_db()
    assert (escalation.state, escalation.attempts) == ("delivered", 2)
    assert [hit["headers"]["Idempotency-Key"] for hit in hits] == [str(escalation.id)] * 2


@pytest.mark.django_db(transaction=True)
def test_escalate_suspends_the_agent_and_a_real_worker_calls_the_signed_webhook():
    from tests.conftest import make_persona

    acme = make_persona("acme-escalate")
    register_budget_tools(acme)
    with receiver() as (url, hits), celery_worker():
        set_budget(acme, max_irreversible_per_run=1, on_exceeded="escalate", escalation_url=url)
        run = over_the_cap(acme)
        assert run.complete().status_code == 200
        deadline = time.monotonic() + 20
        while Delivery.objects.get(purpose="escalation").state != "delivered" and time.monotonic() < deadline:
            time.sleep(0.1)

    assert Delivery.objects.get(purpose="escalation").state == "delivered"
    assert len(hits) == 1
    hit = hits[0]
    assert verify([acme.org.webhook_secret], hit["headers"]["Undolog-Signature"], hit["raw"])
    assert (hit["body"]["event"], hit["body"]["agent"], hit["body"]["session"], hit["body"]["limit"]) == (
        "budget.exceeded", "cleanup", run.id, "max_irreversible_per_run")
    assert Agent.objects.get(pk=acme.agent.pk).suspend_reason == "budget"
    assert {"budget.exceeded", "agent.suspended"} <= set(kinds())
    assert DayCounter.objects.count() == 0  # no daily limit, no day row


def test_stop_leaves_a_halted_run_alone_when_the_reviewer_rolls_it_back_in_the_same_transaction(
        acme, budget_tools, django_capture_on_commit_callbacks):
    set_budget(acme, max_irreversible_per_run=1, on_exceeded="stop")
    run = Run(acme)
    run.drop()
    assert run.drop().status_code == 429
    set_budget(acme, max_irreversible_per_run=2)
    waiting = run.call("delete_account", {"account_id": "acct-101"})

    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        reject(waiting.json()["effect"]["id"], "no")  # what "reject and roll back" does: halt, then fail
        Session.objects.get(pk=run.id).fail("rejected and rolled back", actor="alice")

    session = run.session
    # failed once (by the reviewer), then walked back; stop did not fail it a second time
    assert (session.state, session.error) == ("compensating", "rejected and rolled back")
    assert session.transitions.filter(to_state="failed").count() == 1
    acme.agent.refresh_from_db()
    assert acme.agent.state == "stopped"
