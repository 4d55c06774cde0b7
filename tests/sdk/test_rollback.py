"""Leaving a session by an exception fails it: the real worker walks its undo stack, newest
first, against a real webhook receiver, and `wait_compensated()` returns the outcome."""

from __future__ import annotations

import asyncio

import pytest
from undolog import EffectUndone

from effects.models import Effect, Session, UndoEntry
from tests.receiver import Receiver
from tests.sdk.agent_tools import RAN, list_inactive_accounts, send_email

pytestmark = pytest.mark.django_db(transaction=True)


class CrmDown(Exception):
    pass


@pytest.fixture
def receiver(acme, client):
    with Receiver(secrets=[acme.org.webhook_secret]) as receiver:
        client.register_compensation("undo_send_email", "1.0.0", "webhook", receiver.url)
        yield receiver


def test_it_rolls_back_the_committed_calls_when_the_block_raises(acme, server, worker, client, receiver):
    with pytest.raises(CrmDown), client.session(agent="cleanup") as s:
        list_inactive_accounts()
        send_email("ana@example.com")
        send_email("ben@example.com")
        raise CrmDown("the CRM is down")

    assert s.state == "compensating"
    assert Session.objects.get(pk=s.id).error == "CrmDown: the CRM is down"
    outcome = s.wait_compensated(timeout=30)

    assert outcome["state"] == s.state == "compensated"
    entries = {str(e.id): e.args["to"] for e in UndoEntry.objects.filter(session_id=s.id)}
    assert [entries[key] for key in receiver.order] == ["ben@example.com", "ana@example.com"]  # LIFO
    assert all(d.verified for d in receiver.log)
    assert [d.body["args"] for d in receiver.log] == [{"to": "ben@example.com"}, {"to": "ana@example.com"}]
    assert set(Effect.objects.filter(session_id=s.id).values_list("state", flat=True)) == {"compensated"}
    assert RAN == ["send_email ana@example.com", "send_email ben@example.com"]


def test_it_reports_a_failing_tool_then_undoes_what_may_have_acted(acme, server, worker, client, receiver):
    opened = []

    async def run() -> None:
        async with client.session(agent="cleanup") as s:
            opened.append(s)
            await asyncio.to_thread(send_email, "ana@example.com")
            await asyncio.to_thread(send_email, "bounce@example.com")  # raises: reported as failed

    with pytest.raises(RuntimeError, match="mailbox of bounce@example.com is full"):
        asyncio.run(run())
    [s] = opened
    assert asyncio.run(s.await_compensated(timeout=30))["state"] == "compensated"

    # The failed call may have acted before it raised, so it is compensated too, first.
    assert [d.body["args"]["to"] for d in receiver.log] == ["bounce@example.com", "ana@example.com"]
    assert Effect.objects.get(args__to="bounce@example.com").error == \
        "RuntimeError: mailbox of bounce@example.com is full"


def test_it_never_runs_an_undone_call_again(acme, server, worker, client, receiver):
    with pytest.raises(CrmDown), client.session(agent="cleanup") as s:
        send_email("ana@example.com")
        raise CrmDown("the CRM is down")
    s.wait_compensated(timeout=30)

    with pytest.raises(EffectUndone, match="already undone"), client.resume_session(s.id):
        send_email("ana@example.com")
    assert RAN == ["send_email ana@example.com"]
