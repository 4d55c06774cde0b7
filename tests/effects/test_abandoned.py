"""Runs that stop answering: past its idle timeout (the agent's, else the org's) a running session
is failed as abandoned, with a `session.abandoned` event, its budget verdict applied and its undo
stack walked. A run waiting for a reviewer is not abandoned; a call that lands first wins."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import ApprovalRequest
from core.errors import Conflict
from effects.models import Effect, Session, SessionTransition
from lifecycle import abandon, tasks, undo
from orgs.models import Agent, Event
from tests.budgets.conftest import Run, register_budget_tools, set_budget
from tests.conftest import intercept, make_persona, open_session, register_standard_tools
from tests.effects.conftest import build_stack

# Committed for real: the walk refuses to call a handler inside a transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def silence(session_id: str, seconds: float) -> None:
    """As if nothing had been heard from the run for `seconds`: its last intercept a moment
    before that, its effects' commits (which move effects, not the session) at that time."""
    then = timezone.now() - timedelta(seconds=seconds)
    Session.objects.filter(pk=session_id).update(updated=then - timedelta(seconds=30))
    Effect.objects.filter(session_id=session_id).update(updated=then)


def test_a_silent_run_is_failed_as_abandoned_and_its_stack_walked_back(acme, receiver):
    stack = build_stack(acme, receiver.url, 2)
    silence(stack.session_id, 3601)  # the org's default: an hour

    assert tasks.sweep_abandoned() == 1

    session = stack.session
    assert session.state == "compensating"
    assert session.error.startswith("abandoned: no call for 360")
    assert "run_idle_timeout_s is 3600 s" in session.error
    assert SessionTransition.objects.filter(session=session, to_state="failed").get().actor == "idle"
    event = Event.objects.get(kind="session.abandoned")
    assert (str(event.session_id), event.data["run_idle_timeout_s"], event.data["error"]) == (
        stack.session_id, 3600, session.error)
    undo.walk(stack.session_id)  # what the worker runs once the failure commits
    assert stack.session.state == "compensated"
    assert receiver.order == list(reversed(stack.entries))
    # The API and the dashboard say why.
    assert acme.viewer.get(f"/api/v1/sessions/{stack.session_id}").json()["error"] == session.error
    browser = Client()
    browser.force_login(acme.viewer.user)
    assert session.error in browser.get(f"/sessions/{stack.session_id}/").content.decode()
    assert 'title="abandoned: no call' in browser.get("/sessions/").content.decode()
    assert tasks.sweep_abandoned() == 0  # once


def test_a_run_that_is_heard_from_in_time_is_left_alone(acme, receiver):
    stack = build_stack(acme, receiver.url, 1)
    silence(stack.session_id, 3500)  # not long enough
    assert tasks.sweep_abandoned() == 0

    silence(stack.session_id, 7200)
    # A commit moves the effect, not the session: it is a sign of life all the same.
    Effect.objects.filter(pk=stack.effects[0]).update(updated=timezone.now())
    assert tasks.sweep_abandoned() == 0
    assert stack.session.state == "running"


def test_a_run_waiting_for_a_reviewer_is_not_abandoned(acme):
    register_standard_tools(acme)
    session_id = open_session(acme)
    assert intercept(acme, session_id, "delete_account", {"account_id": "a1"}, 1).status_code == 202
    silence(session_id, 86_400)

    assert tasks.sweep_abandoned() == 0
    assert Session.objects.get(pk=session_id).state == "awaiting_approval"
    # Even should the run be running with its call still pending (a state move raced), it waits.
    Session.objects.filter(pk=session_id).update(state="running")
    assert tasks.sweep_abandoned() == 0
    assert not Event.objects.filter(kind="session.abandoned").exists()


def test_a_run_whose_approved_call_an_executor_runs_is_not_abandoned_but_one_left_by_its_agent_is(acme):
    register_standard_tools(acme)
    wire = {"name": "wire_money", "tier": "irreversible", "approval": {"reason": "Moves money"},
            "executor": {"url": "http://127.0.0.1:9/run"}}
    assert acme.api.post("/api/v1/tools", {"tools": [wire]}, format="json").status_code == 200
    by_executor, by_agent = open_session(acme), open_session(acme)
    assert intercept(acme, by_executor, "wire_money", {"amount": 1}, 1).status_code == 202
    assert intercept(acme, by_agent, "delete_account", {"account_id": "a1"}, 1).status_code == 202
    # The worker holds one approved call (its executor retries, maybe an hour apart); the other was
    # approved for an agent that went away.
    ApprovalRequest.objects.filter(session_id__in=[by_executor, by_agent]).update(state="approved")
    Effect.objects.filter(session_id=by_executor).update(state="executing")
    Effect.objects.filter(session_id=by_agent).update(state="approved")
    Session.objects.filter(pk__in=[by_executor, by_agent]).update(state="running")
    for session_id in (by_executor, by_agent):
        silence(session_id, 86_400)

    assert tasks.sweep_abandoned() == 1

    assert Session.objects.get(pk=by_executor).state == "running"
    assert Session.objects.get(pk=by_agent).state != "running"


def test_the_agent_override_and_zero_for_never(acme, receiver):
    quick = make_persona("quick-org")
    stack = build_stack(acme, receiver.url, 1)
    other = open_session(quick)
    response = acme.admin.patch("/api/v1/agents/cleanup/settings", {"run_idle_timeout_s": 60}, format="json")
    assert response.json() == {"name": "cleanup", "run_idle_timeout_s": 60, "effective_run_idle_timeout_s": 60}
    assert acme.viewer.patch("/api/v1/agents/cleanup/settings", {"run_idle_timeout_s": 1},
                             format="json").status_code == 403
    assert acme.admin.patch("/api/v1/agents/cleanup/settings", {"run_idle_timeout_s": -1},
                            format="json").status_code == 400
    assert quick.admin.patch("/api/v1/org/settings", {"run_idle_timeout_s": 0}, format="json").status_code == 200
    silence(stack.session_id, 61)
    silence(other, 10 * 86_400)

    assert abandon.sweep() == 1

    assert stack.session.state == "compensating"
    assert Session.objects.get(pk=other).state == "running"  # its org said never
    Agent.objects.filter(pk=acme.agent.pk).update(run_idle_timeout_s=0)  # this agent's runs: never
    later = open_session(acme)
    silence(later, 10 * 86_400)
    assert abandon.sweep() == 0
    assert Session.objects.get(pk=later).state == "running"


def test_a_call_that_lands_before_the_abandon_keeps_the_run_alive(acme, receiver):
    stack = build_stack(acme, receiver.url, 1)
    silence(stack.session_id, 4000)
    [seen] = abandon.silent(3600)
    assert intercept(acme, stack.session_id, "send_email", {"to": "late@x.io"}, 2).status_code == 201

    with pytest.raises(Conflict):
        seen.abandon(3600, timezone.now())

    assert stack.session.state == "running"
    assert not Event.objects.filter(kind="session.abandoned").exists()


def test_an_abandoned_run_gets_its_budget_verdict(acme):
    register_budget_tools(acme)
    set_budget(acme, max_irreversible_per_run=1, on_exceeded="pause")
    run = Run(acme)
    assert [run.drop().status_code for _ in range(2)] == [201, 429]
    silence(run.id, 7200)

    assert abandon.sweep() == 1

    acme.agent.refresh_from_db()
    assert (acme.agent.state, acme.agent.suspend_reason) == ("suspended", "budget")
    exceeded = Event.objects.get(kind="budget.exceeded")
    assert (exceeded.data["action"], str(exceeded.session_id)) == ("pause", run.id)


def test_a_run_opened_with_on_idle_complete_is_completed_when_quiet_and_nothing_is_undone(acme, receiver):
    stack = build_stack(acme, receiver.url, 2)
    Session.objects.filter(pk=stack.session_id).update(on_idle=Session.OnIdle.COMPLETE)
    silence(stack.session_id, 3601)

    assert tasks.sweep_abandoned() == 1

    session = stack.session
    assert session.state == "completed" and session.error.startswith("abandoned: no call for 360")
    assert SessionTransition.objects.filter(session=session, to_state="completed").get().actor == "idle"
    assert Event.objects.get(kind="session.abandoned").data["outcome"] == "completed"
    assert set(session.undo_entries.values_list("state", flat=True)) == {"pending"}
    assert receiver.order == []  # no compensation ran
    assert tasks.sweep_abandoned() == 0


def test_on_idle_is_chosen_when_the_run_is_opened_and_checked(acme):
    opened = acme.api.post("/api/v1/sessions", {"on_idle": "complete"}, format="json")
    default = acme.api.post("/api/v1/sessions", {}, format="json")
    bad = acme.api.post("/api/v1/sessions", {"on_idle": "forget"}, format="json")

    assert opened.status_code == 201 and opened.json()["on_idle"] == "complete"
    assert default.json()["on_idle"] == "fail"
    assert bad.status_code == 400 and bad.json()["error"] == "invalid" and "on_idle" in bad.json()["fields"]
    assert Session.objects.filter(org=acme.org).count() == 2
