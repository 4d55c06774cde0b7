"""Each tier's path through the SDK against the real server: SAFE never touches the network,
COMPENSABLE commits with its undo entry pushed first, IRREVERSIBLE waits by long poll for a
person, claims the approved call and runs it once."""

from __future__ import annotations

import asyncio
import time

import pytest

from effects.models import Effect, EffectTransition, SafeCall, Session, UndoEntry
from tests.sdk.agent_tools import RAN, adelete_account, delete_account, list_inactive_accounts, send_email
from tests.sdk.conftest import AsyncCountingTransport, CountingTransport, agent_client, reviewer

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_runs_a_safe_call_without_a_request_and_reports_it_with_the_next_one(acme, server, client):
    wire = CountingTransport()
    agent = agent_client(acme, server, transport=wire)
    with agent.session(agent="cleanup") as s:
        before = list(wire.requests)
        started = time.perf_counter()
        assert list_inactive_accounts() == ["acct-101", "acct-102", "acct-103"]
        took = time.perf_counter() - started
        assert wire.requests == before  # nothing went over the wire
        assert not SafeCall.objects.filter(session_id=s.id).exists()  # the server knows nothing yet

        send_email("ana@example.com")

        effect = Effect.objects.get()
        assert wire.requests[len(before):] == [("POST", f"/api/v1/sessions/{s.id}/intercept"),
                                               ("POST", f"/api/v1/effects/{effect.id}/commit")]
        [safe] = SafeCall.objects.filter(session_id=s.id)  # it came with the intercept
        assert (safe.tool_name, safe.step_index, safe.args) == ("list_inactive_accounts", 1, {})
        assert effect.step_index == 2
    assert took < 0.01
    session = Session.objects.get(pk=s.id)
    assert (session.state, session.tool_calls, float(session.cost)) == ("completed", 2, 1.01)


def test_it_sends_the_last_safe_calls_with_complete(acme, server, client):
    wire = CountingTransport()
    agent = agent_client(acme, server, transport=wire)
    with agent.session(agent="cleanup") as s:
        list_inactive_accounts()
        list_inactive_accounts()
        assert len(wire.requests) == 1  # the session's creation only

    assert wire.requests[-1] == ("POST", f"/api/v1/sessions/{s.id}/complete")
    assert list(SafeCall.objects.filter(session_id=s.id).values_list("step_index", flat=True)) == [1, 2]
    assert Session.objects.get(pk=s.id).tool_calls == 2


def test_it_makes_no_request_for_an_async_safe_call(acme, server, client):
    wire = AsyncCountingTransport()
    agent = agent_client(acme, server, async_transport=wire)

    async def run() -> int:
        async with agent.session(agent="cleanup"):
            for _ in range(50):
                list_inactive_accounts()
            return len(wire.requests)

    assert asyncio.run(run()) == 1
    assert SafeCall.objects.count() == 50


def test_it_commits_a_compensable_call_after_pushing_its_undo(acme, server, client):
    with client.session(agent="cleanup") as s:
        result = send_email("ana@example.com", subject="Goodbye")

    assert result == {"message_id": "<ana@example.com>", "subject": "Goodbye"}
    assert RAN == ["send_email ana@example.com"]
    effect = Effect.objects.get(session_id=s.id)
    assert (effect.state, effect.result, effect.args) == (
        "committed", result, {"to": "ana@example.com", "subject": "Goodbye"})
    entry = UndoEntry.objects.get(effect=effect)
    assert (entry.fn_name, entry.args, entry.state) == ("undo_send_email", {"to": "ana@example.com"}, "pending")
    assert s.state == "completed"


def test_it_reports_a_failing_compensable_call_and_reraises(acme, server, client):
    with client.session(agent="cleanup") as s:
        with pytest.raises(RuntimeError, match="mailbox of bounce@x.io is full"):
            send_email("bounce@x.io")
        assert Effect.objects.get(session_id=s.id).state == "failed"

    effect = Effect.objects.get(session_id=s.id)
    assert effect.error == "RuntimeError: mailbox of bounce@x.io is full"
    assert RAN == []


def test_it_waits_by_long_poll_for_a_reviewer_then_claims_runs_and_commits(acme, server, client):
    waits = []
    person = reviewer(acme, server, ("approve", "inactive for 14 months"), delay=1.5)
    with client.session(agent="cleanup", on_wait=waits.append, poll_wait=30) as s:
        assert delete_account("acct-101") == "deleted acct-101"
    person.finish()

    assert RAN == ["delete_account acct-101"]
    [asked] = person.asked
    assert (asked["tool"], asked["proposed_args"], asked["estimated_impact"]) == (
        "delete_account", {"account_id": "acct-101"}, "account acct-101 and its data")
    # One long poll covered the 1.5 s wait: the server answered when the decision landed.
    assert [w.state for w in waits] == ["pending"]
    effect = Effect.objects.get(session_id=s.id)
    assert (effect.state, effect.result) == ("committed", {"value": "deleted acct-101"})
    assert [(t.from_state, t.to_state, t.actor) for t in EffectTransition.objects.filter(effect=effect)] == [
        ("pending", "approved", "acme-reviewer"), ("approved", "executing", "agent:cleanup"),
        ("executing", "committed", "agent:cleanup")]
    assert s.state == "completed"


def test_it_waits_for_a_reviewer_from_async_code_too(acme, server, client):
    person = reviewer(acme, server, ("approve", ""), delay=0.5)

    async def run() -> str:
        async with client.session(agent="cleanup"):
            return await adelete_account("acct-102")

    assert asyncio.run(run()) == "deleted acct-102"
    person.finish()
    assert RAN == ["adelete_account acct-102"]
    assert Effect.objects.get().state == "committed"
