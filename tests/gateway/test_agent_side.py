"""Compensations run where the credentials are, by an SDK process (`serve_compensations`), and
what happens when nobody is there to run them: the real server, worker and SDK."""

from __future__ import annotations

import threading

import pytest
from undolog import CompensationDescriptor, ToolTier, UndoLogClient, undolog_tool

pytestmark = [pytest.mark.django_db(transaction=True)]

TICKETS: dict[int, str] = {}


@undolog_tool(tier=ToolTier.COMPENSABLE,
              compensation=CompensationDescriptor.new("close_ticket", {"id": "{result.id}", "by": "{owner}"},
                                                      retry_backoff_ms=100))
def open_ticket(owner: str) -> dict:
    number = len(TICKETS) + 1
    TICKETS[number] = "open"
    return {"id": number}


def close_ticket(args: dict, context: dict) -> None:
    TICKETS[args["id"]] = f"closed for {args['by']} (attempt {context['attempt']})"


@pytest.fixture
def agent(acme, server, worker):
    TICKETS.clear()
    client = UndoLogClient(server, acme.key, poll_wait=5)
    yield client
    client.close()


def run_that_fails(client: UndoLogClient, agent_name: str) -> str:
    with pytest.raises(RuntimeError), client.session(agent_name) as session:
        open_ticket("ana")
        open_ticket("bo")
        raise RuntimeError("the agent gave up")
    return session.id


def test_an_sdk_process_claims_and_runs_the_undo_newest_first(agent, acme):
    agent.register_compensation("close_ticket", "1.0.0", "agent")
    agent.register(open_ticket)
    stop = threading.Event()
    serving = threading.Thread(target=agent.serve_compensations, args=({"close_ticket": close_ticket},),
                               kwargs={"stop": stop, "poll_s": 0.1}, daemon=True)
    serving.start()
    try:
        session_id = run_that_fails(agent, acme.agent.name)
        done = agent.resume_session(session_id).wait_compensated(timeout=30, poll_interval=0.1)
    finally:
        stop.set()
        serving.join(10)

    assert done["state"] == "compensated"
    assert TICKETS == {1: "closed for ana (attempt 1)", 2: "closed for bo (attempt 1)"}
    assert [e["args"] for e in done["undo_stack"]] == [{"id": 2, "by": "bo"}, {"id": 1, "by": "ana"}]


def test_an_agent_entry_nobody_claims_goes_to_a_person_past_its_deadline(agent, acme):
    agent.register_compensation("close_ticket", "1.0.0", "agent", claim_timeout_s=1)
    agent.register(open_ticket)

    session_id = run_that_fails(agent, acme.agent.name)
    done = agent.resume_session(session_id).wait_compensated(timeout=30, poll_interval=0.1)

    assert done["state"] == "compensation_failed"
    top = done["undo_stack"][0]
    assert top["state"] == "compensation_failed"
    assert "no agent claimed close_ticket@1.0.0 within 1 s" in top["last_error"]
    assert done["undo_stack"][1]["state"] == "pending"  # the walk stopped there, in order
    assert set(TICKETS.values()) == {"open"}


def test_a_scoped_function_is_run_only_by_a_process_that_names_its_scope(agent, acme):
    from effects.models import UndoEntry
    from tests.conftest import eventually

    agent.register_compensation("close_ticket", "1.0.0", "agent", scope="tickets-a")
    agent.register(open_ticket)
    session_id = run_that_fails(agent, acme.agent.name)
    eventually(lambda: UndoEntry.objects.filter(session_id=session_id, claim_deadline__isnull=False).exists())

    handlers = {"close_ticket": close_ticket}
    assert agent.serve_compensations(handlers, once=True) == 0  # names no scope: unscoped ones only
    assert agent.serve_compensations(handlers, once=True, scopes=["tickets-b"]) == 0
    assert set(TICKETS.values()) == {"open"}

    stop = threading.Event()
    serving = threading.Thread(target=agent.serve_compensations, args=(handlers,),
                               kwargs={"stop": stop, "poll_s": 0.1, "scopes": ["tickets-a"]}, daemon=True)
    serving.start()
    try:
        done = agent.resume_session(session_id).wait_compensated(timeout=30, poll_interval=0.1)
    finally:
        stop.set()
        serving.join(10)
    assert done["state"] == "compensated"
    assert TICKETS == {1: "closed for ana (attempt 1)", 2: "closed for bo (attempt 1)"}
