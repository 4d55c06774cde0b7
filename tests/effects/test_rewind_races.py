"""Rewind under races and faults (PostgreSQL: real concurrent clients, each with its own connection;
a real Celery worker killed mid-rewind). Collected by the PostgreSQL run only (conftest)."""

from __future__ import annotations

import os
import signal

import pytest

from effects.models import Effect, Rewind, Session, UndoAttempt, UndoEntry
from tests.conftest import in_parallel, intercept
from tests.effects.conftest import build_stack
from tests.effects.test_undo_worker import FAST, wait_for_state, worker_log
from tests.processes import celery_worker

pytestmark = pytest.mark.django_db(transaction=True)


def rewind(client, session_id, **body):
    return client.post(f"/api/v1/sessions/{session_id}/rewind", body, format="json")


def claim_and_report(persona, expected: int) -> list[str]:
    """The agent side runs the agent-handler compensations the walk waits on, one at a time, in order."""
    done = []
    for _ in range(expected):
        claimed = persona.api.post("/api/v1/undo-entries/claim", {"max": 10}, format="json").json()["entries"]
        assert len(claimed) == 1, claimed  # only the top of the stack is ever claimable
        entry = claimed[0]
        assert persona.api.post(f"/api/v1/undo-entries/{entry['id']}/report", {"ok": True},
                                format="json").status_code == 200
        done.append(entry["id"])
    return done


@pytest.mark.usefixtures("eager")
def test_two_rewinds_at_once_one_wins_the_other_is_a_409(acme):
    # Agent-side compensations: the walk waits for the agent side, so the winner stays rewinding.
    stack = build_stack(acme, "", 5, handler="agent")
    clients = [acme.api, acme.reviewer]

    answers = in_parallel(lambda n: rewind(clients[n], stack.session_id, to_step=1 + n, reason=f"rewind {n}"), 2)

    codes = sorted(a.status_code for a in answers)
    assert codes == [200, 409], [a.content for a in answers]
    loser = next(a for a in answers if a.status_code == 409).json()
    assert loser["error"] == "rewind_in_progress"
    winner = next(a for a in answers if a.status_code == 200).json()
    assert Rewind.objects.filter(session_id=stack.session_id).count() == 1
    session = stack.session
    assert (session.state, session.rewind_to, session.rewinds) == ("compensating", winner["to_step"], 1)
    # While it walks: intercepts are refused saying why; the agent side runs its compensations in order.
    refused = intercept(acme, stack.session_id, "send_email", {"to": "x@x.io"}, 9)
    assert refused.status_code == 409 and refused.json()["error"] == "session_rewinding"
    undone = claim_and_report(acme, 5 - winner["to_step"])
    assert undone == [stack.entries[n] for n in range(4, winner["to_step"] - 1, -1)]
    assert stack.session.state == "running" and stack.session.step_index == winner["to_step"]


@pytest.mark.usefixtures("eager")
def test_a_rewind_racing_an_intercept_of_the_run_either_undoes_it_or_refuses_it(acme):
    for attempt in range(4):
        stack = build_stack(acme, "", 3, handler="agent", tool=f"send_{attempt}", fn_name=f"undo_{attempt}")
        tool = f"send_{attempt}"

        def work(n, stack=stack, tool=tool):
            if n == 0:
                return rewind(acme.reviewer, stack.session_id, to_step=1, reason="race")
            return intercept(acme, stack.session_id, tool, {"to": "racer@x.io"}, 4)

        rewound, called = in_parallel(work, 2)

        assert rewound.status_code == 200, rewound.content
        undo_steps = [item["step_index"] for item in rewound.json()["to_undo"]]
        if called.status_code == 201:  # landed first: the rewind undoes it too, newest first
            assert undo_steps == [4, 3, 2]
            assert called.json()["effect"]["id"] == rewound.json()["to_undo"][0]["effect"]
        else:  # waited for the run's lock, then found it rewinding: nothing made
            assert called.status_code == 409 and called.json()["error"] == "session_rewinding", called.content
            assert undo_steps == [3, 2]
            assert not Effect.objects.filter(session_id=stack.session_id, step_index=4).exists()
        claim_and_report(acme, len(undo_steps))
        assert stack.session.state == "running"
        assert set(Effect.objects.filter(session_id=stack.session_id, step_index__gt=1)
                   .values_list("state", flat=True)) == {"compensated"}


@pytest.mark.usefixtures("eager")
def test_a_rewind_of_a_run_whose_walk_is_stopped_is_refused_saying_why(acme, stack_of, receiver):
    stack = stack_of(3, max_retries=0)
    top = stack.entries[2]
    receiver.behaviour = lambda d: (400 if d.key == top else 200, 0.0)  # permanent: a person is called
    assert rewind(acme.api, stack.session_id, to_step=1).status_code == 200
    assert stack.session.state == "compensation_failed"

    refused = rewind(acme.api, stack.session_id, to_step=0, reason="go further")

    assert refused.status_code == 409
    body = refused.json()
    assert body["error"] == "walk_stopped" and body["undo_entry"] == top and body["step_index"] == 3
    assert "undo_send_email@1.0.0 of step 3 failed" in body["message"]
    assert Rewind.objects.count() == 1
    waiting = intercept(acme, stack.session_id, "send_email", {"to": "x@x.io"}, 9)
    assert waiting.status_code == 409 and waiting.json()["error"] == "session_rewinding"
    assert waiting.json()["state"] == "compensation_failed"
    # Resolved by hand, the rewind's walk goes on and the run resumes at its step.
    receiver.behaviour = lambda d: (200, 0.0)
    assert acme.reviewer.post(f"/api/v1/undo-entries/{top}/resolve", {"note": "undone by hand"},
                              format="json").status_code == 200
    session = stack.session
    assert (session.state, session.step_index, session.rewind_to) == ("running", 1, None)
    assert stack.entry(1).state == "compensated" and stack.entry(0).state == "pending"


@pytest.mark.usefixtures("eager")
def test_a_fleet_rollback_turns_a_rewind_under_way_into_a_rollback(acme):
    stack = build_stack(acme, "", 3, handler="agent")
    assert rewind(acme.api, stack.session_id, to_step=2).status_code == 200

    response = acme.admin.post(f"/api/v1/agents/{acme.agent.name}/rollback",
                               {"since": "2020-01-01T00:00:00Z", "reason": "incident"}, format="json")

    assert response.status_code == 200, response.content
    assert stack.session.rewind_to is None
    claim_and_report(acme, 3)
    assert stack.session.state == "compensated"


def test_a_worker_killed_mid_rewind_loses_no_compensation_and_doubles_none(stack_of, receiver, acme):
    stack = stack_of(5, timeout_ms=5000, max_retries=3)
    in_flight = stack.entries[3]  # step 4: the second entry the rewind's walk reaches

    def slow_receiver(delivery):
        return 200, (4.0 if delivery.key == in_flight and delivery.n == 1 else 0.2)

    receiver.behaviour = slow_receiver

    with celery_worker(log=worker_log("rewind-doomed"), **FAST) as doomed:
        assert rewind(acme.api, stack.session_id, to_step=1, reason="wrong turn").status_code == 200
        receiver.wait_for(lambda r: r.deliveries[in_flight] == 1, timeout=30)
        os.killpg(doomed.pid, signal.SIGKILL)
        doomed.wait(timeout=10)

    assert Session.objects.get(pk=stack.session_id).state == "compensating"
    with celery_worker(beat=True, log=worker_log("rewind-successor"), **FAST):
        wait_for_state(stack.session_id, "running")

    later = [stack.entries[n] for n in (4, 3, 2, 1)]
    assert receiver.order == later and set(receiver.applied) == set(later)
    assert receiver.deliveries[in_flight] == 2 and dict(receiver.duplicates) == {in_flight: 1}
    assert stack.entries[0] not in receiver.deliveries
    log = [(a.number, a.outcome) for a in UndoAttempt.objects.filter(entry_id=in_flight).order_by("number")]
    assert log == [(1, "lost"), (2, "success")]
    assert stack.entry(0).state == "pending" and UndoEntry.objects.filter(state="compensated").count() == 4
    assert Session.objects.get(pk=stack.session_id).step_index == 1
