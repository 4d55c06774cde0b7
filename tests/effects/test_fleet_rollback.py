"""Fleet rollback: `POST /api/v1/agents/{name}/rollback {"since", "reason"}` fails the agent's open
runs and undoes its runs that ended since `since`, each stack newest first, each compensation once."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import ApprovalRequest
from effects.models import Effect, Session, SessionTransition, UndoEntry
from lifecycle import rollback
from orgs.models import Agent, Event
from tests.conftest import intercept, open_session, register_standard_tools
from tests.effects.conftest import Stack, build_stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]


def path(agent: str = "cleanup") -> str:
    return f"/api/v1/agents/{agent}/rollback"


def since(minutes: float = 5) -> str:
    return (timezone.now() - timedelta(minutes=minutes)).isoformat()


def complete(stack: Stack) -> Stack:
    assert stack.persona.api.post(f"/api/v1/sessions/{stack.session_id}/complete").status_code == 200
    return stack


def by_run(receiver) -> dict[str, list[str]]:
    """The keys the receiver applied, per run, in the order they took effect."""
    runs: dict[str, list[str]] = defaultdict(list)
    for key in receiver.order:
        runs[receiver.applied[key].body["session_id"]].append(key)
    return dict(runs)


def test_it_fails_open_runs_and_undoes_ended_ones_each_newest_first_each_once(acme, receiver):
    running = build_stack(acme, receiver.url, 2)
    done = complete(build_stack(acme, receiver.url, 3))
    old = complete(build_stack(acme, receiver.url, 2))
    Session.objects.filter(pk=old.session_id).update(ended_at=timezone.now() - timedelta(hours=2))

    response = acme.admin.post(path(), {"since": since(60), "reason": "prompt injection"}, format="json")

    assert response.status_code == 200, response.content
    assert response.json() | {"since": None, "id": None} == {
        "id": None, "runs": 2, "entries": 5, "running": 1, "ended": 1, "since": None}
    assert response.json()["id"] == str(Event.objects.get(kind="agent.rolled_back").pk)
    assert by_run(receiver) == {running.session_id: list(reversed(running.entries)),
                                done.session_id: list(reversed(done.entries))}
    assert not receiver.duplicates
    assert running.session.state == done.session.state == "compensated"
    assert running.session.error == f"rolled back by {acme.admin.user.username}: prompt injection"
    assert old.session.state == "completed"  # ended before `since`: left alone
    assert set(UndoEntry.objects.filter(session_id=old.session_id).values_list("state", flat=True)) == {"pending"}
    assert [(t.from_state, t.to_state) for t in SessionTransition.objects.filter(session_id=running.session_id)] == [
        ("running", "failed"), ("failed", "compensating"), ("compensating", "compensated")]
    assert [(t.from_state, t.to_state) for t in SessionTransition.objects.filter(session_id=done.session_id)] == [
        ("running", "completed"), ("completed", "compensating"), ("compensating", "compensated")]
    assert set(Effect.objects.filter(session_id__in=[running.session_id, done.session_id])
               .values_list("state", flat=True)) == {"compensated"}


def test_it_records_one_audited_event_with_who_why_and_the_counts(acme, receiver):
    stack = build_stack(acme, receiver.url, 2)

    acme.admin.post(path(), {"since": since(), "reason": "bad prompt shipped"}, format="json")

    event = Event.objects.get(org=acme.org, kind="agent.rolled_back")
    assert event.agent == acme.agent
    assert event.data | {"since": None} == {
        "by": acme.admin.user.username, "reason": "bad prompt shipped", "since": None, "runs": 1, "entries": 2,
        "running": 1, "ended": 0, "sample": [stack.session_id]}
    compensated = Event.objects.get(org=acme.org, kind="session.compensated", session_id=stack.session_id)
    assert compensated.fanned_out_at is not None  # fanned out with its batch, not left to the sweep


def test_it_withdraws_a_call_waiting_for_a_reviewer(acme, receiver):
    stack = build_stack(acme, receiver.url, 1)
    register_standard_tools(acme, receiver.url)
    assert intercept(acme, stack.session_id, "delete_account", {"account_id": "a-1"}, 2).status_code == 202
    assert stack.session.state == "awaiting_approval"

    response = acme.admin.post(path(), {"since": since(), "reason": "incident"}, format="json")

    assert response.json()["runs"] == 1 and response.json()["entries"] == 1
    approval = ApprovalRequest.objects.get(session_id=stack.session_id)
    assert approval.state == "expired"
    assert Effect.objects.get(session_id=stack.session_id, tool_name="delete_account").state == "expired"
    assert stack.session.state == "compensated" and receiver.order == stack.entries


def test_a_running_run_over_its_budget_gets_its_verdict_and_the_others_none(acme, receiver):
    over = build_stack(acme, receiver.url, 1)
    within = build_stack(acme, receiver.url, 1)
    assert acme.admin.patch("/api/v1/agents/cleanup/budget", {"max_irreversible_per_run": 1},
                            format="json").status_code == 200
    Session.objects.filter(pk=over.session_id).update(violation={
        "limit": "max_irreversible_per_run", "limit_value": 1, "current": 2, "tool": "drop_table",
        "reason": "over the run's cap"})

    response = acme.admin.post(path(), {"since": since(), "reason": "incident"}, format="json")

    assert response.json()["running"] == 2
    [exceeded] = Event.objects.filter(kind="budget.exceeded")
    assert (str(exceeded.session_id), exceeded.data["action"]) == (over.session_id, "pause")
    acme.agent.refresh_from_db()
    assert (acme.agent.state, acme.agent.suspend_reason) == ("suspended", "budget")
    assert over.session.state == within.session.state == "compensated"


def test_a_run_with_nothing_to_undo_is_compensated_at_once(acme, receiver):
    register_standard_tools(acme, receiver.url)
    session_id = open_session(acme)

    response = acme.admin.post(path(), {"since": since(), "reason": "incident"}, format="json")

    assert response.json() | {"since": None, "id": None} == {
        "id": None, "runs": 1, "entries": 0, "running": 1, "ended": 0, "since": None}
    assert Session.objects.get(pk=session_id).state == "compensated"


def test_it_leaves_other_agents_and_other_orgs_alone(acme, outsider, receiver):
    mine = build_stack(acme, receiver.url, 1)
    other_agent = Agent.objects.create(org=acme.org, name="billing")
    theirs = build_stack(outsider, receiver.url, 1)

    response = acme.admin.post(path(other_agent.name), {"since": since(), "reason": "incident"}, format="json")

    assert response.json()["runs"] == 0
    assert mine.session.state == "running" and theirs.session.state == "running" and not receiver.order


def test_a_failed_compensation_goes_on_in_the_runs_own_walk(acme, receiver):
    stack = build_stack(acme, receiver.url, 3, retry_backoff_ms=10)
    top = stack.entries[2]
    receiver.behaviour = lambda d: (503 if d.key == top and d.n == 1 else 200, 0.0)

    acme.admin.post(path(), {"since": since(), "reason": "incident"}, format="json")

    assert stack.session.state == "compensated"
    assert receiver.order == list(reversed(stack.entries))
    assert receiver.deliveries[top] == 2 and not receiver.duplicates


def test_the_preview_says_what_it_would_take_and_the_progress_what_is_left(acme, receiver):
    build_stack(acme, receiver.url, 2)
    complete(build_stack(acme, receiver.url, 3))

    response = acme.viewer.get(path(), {"since": since()})

    assert response.status_code == 200
    assert response.json() | {"since": None} == {"runs": 2, "entries": 5, "running": 1, "ended": 1, "since": None,
                                                  "in_progress": {"runs": 0, "entries_left": 0}}
    assert acme.viewer.get(path()).json() == {"in_progress": {"runs": 0, "entries_left": 0}}
    assert not receiver.order  # a preview touches nothing


def test_the_rollback_statements_do_not_grow_with_the_number_of_runs(acme, receiver, monkeypatch):
    monkeypatch.setattr(rollback, "enqueue_walks", lambda ids: None)  # the request's statements only

    def statements(runs: int) -> int:
        for _ in range(runs):
            complete(build_stack(acme, receiver.url, 2))
            build_stack(acme, receiver.url, 1)  # and as many running ones, failed by the rollback
        with CaptureQueriesContext(connection) as queries:
            rollback.rollback(acme.agent, timezone.now() - timedelta(minutes=5), "incident", "test")
        return len([q for q in queries.captured_queries
                    if not q["sql"].startswith(("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT"))])

    # Lock the runs, fail the running ones, read their waiting approvals, move the failed and the
    # completed ones to compensating, count their entries, their history rows, the event, the
    # runs marked with its id; then the event's fan-out (its claim, the org's webhooks). A running
    # run's budget verdict costs no statement without a violation.
    assert statements(2) == statements(6) == 11


# ---------------------------------------------------------------- bad input, permissions, tenancy


@pytest.mark.parametrize("body, field", [
    ({"since": "2999-01-01T00:00:00Z", "reason": "x"}, "since"),
    ({"since": "yesterday", "reason": "x"}, "since"),
    ({"since": 1700000000, "reason": "x"}, "since"),
    ({"reason": "x"}, "since"),
    ({"since": "2020-01-01T00:00:00Z"}, "reason"),
    ({"since": "2020-01-01T00:00:00Z", "reason": ""}, "reason"),
    ({"since": "2020-01-01T00:00:00Z", "reason": "x", "extra": 1}, "extra"),
])
def test_bad_input_is_a_400_that_writes_nothing(acme, receiver, body, field):
    stack = build_stack(acme, receiver.url, 1)

    response = acme.admin.post(path(), body, format="json")

    assert response.status_code == 400, response.content
    assert response.json()["error"] == "invalid" and field in response.json()["fields"]
    assert stack.session.state == "running" and not Event.objects.filter(kind="agent.rolled_back").exists()


def test_a_future_since_in_the_preview_is_a_400(acme):
    response = acme.admin.get(path(), {"since": "2999-01-01T00:00:00Z"})
    assert response.status_code == 400 and "since" in response.json()["fields"]


def test_another_orgs_agent_is_a_404(acme, outsider, receiver):
    Agent.objects.create(org=acme.org, name="billing")
    response = outsider.admin.post(path("billing"), {"since": since(), "reason": "x"}, format="json")
    assert response.status_code == 404 and response.json()["error"] == "agent_not_found"
    assert outsider.admin.get(path("billing")).status_code == 404


@pytest.mark.parametrize("who", ["reviewer", "viewer", "api"])
def test_only_an_admin_rolls_back(acme, receiver, who):
    stack = build_stack(acme, receiver.url, 1)

    response = getattr(acme, who).post(path(), {"since": since(), "reason": "x"}, format="json")

    assert response.status_code in (401, 403) if who == "api" else response.status_code == 403
    assert stack.session.state == "running"


def test_it_needs_a_login(acme, client):
    assert client.post(path(), {"since": since(), "reason": "x"}, content_type="application/json").status_code in (
        401, 403)


def test_get_and_post_only(acme):
    assert acme.admin.delete(path()).status_code == 405
