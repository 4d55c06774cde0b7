"""Edit before approving, end to end: a reviewer changes the proposed args and approves; the
agent's tool runs with the edited args (the SDK says so in its log), the effect keeps both, and
the decision is bound to the edited args' digest."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from approvals.models import ApprovalRequest
from effects.models import Effect, canonical_json, sha256
from tests.sdk.agent_tools import RAN, adelete_account, delete_account
from tests.sdk.conftest import Person, token_of

pytestmark = pytest.mark.django_db(transaction=True)


def edit_and_approve(acme, server, args: dict) -> Person:
    person = Person(server, token_of(acme.reviewer))

    def decide() -> None:
        person.approve_edited(person.next_pending(set()), args, "wrong account: the ticket says acct-103")

    thread = threading.Thread(target=decide, daemon=True)
    thread.start()
    person.thread = thread
    return person


def test_the_agent_runs_the_args_the_reviewer_edited(acme, server, client, caplog):
    person = edit_and_approve(acme, server, {"account_id": "acct-103"})
    with caplog.at_level(logging.INFO, logger="undolog"), client.session(agent="cleanup") as s:
        result = delete_account("acct-102")
    person.thread.join(10)

    assert result == "deleted acct-103"
    assert RAN == ["delete_account acct-103"]  # never the proposed acct-102
    effect = Effect.objects.get(session_id=s.id)
    assert (effect.args, effect.approved_args, effect.state) == (
        {"account_id": "acct-102"}, {"account_id": "acct-103"}, "committed")
    approval = ApprovalRequest.objects.get(effect=effect)
    assert approval.decided_args_digest == sha256(canonical_json({"account_id": "acct-103"}))
    assert approval.decided_args_digest != approval.args_digest == effect.args_digest
    assert any("edited before approving" in r.getMessage() and "acct-103" in r.getMessage()
               for r in caplog.records)


def test_what_the_agent_reads_while_waiting_carries_the_approved_args_and_their_digest(acme, server, client):
    person = edit_and_approve(acme, server, {"account_id": "acct-101"})
    with client.session(agent="cleanup") as s:
        delete_account("acct-109")
    person.thread.join(10)
    effect = Effect.objects.get(session_id=s.id)

    body = person.http.get(f"/api/v1/effects/{effect.id}").json()["effect"]
    assert body["approved_args"] == {"account_id": "acct-101"}
    assert body["args"] == {"account_id": "acct-109"}
    assert body["approval"]["decided_args_digest"] == sha256(canonical_json(body["approved_args"]))


def test_an_async_tool_runs_the_edited_args_too(acme, server, client):
    person = edit_and_approve(acme, server, {"account_id": "acct-104"})

    async def run() -> str:
        async with client.session(agent="cleanup"):
            return await adelete_account("acct-102")

    result = asyncio.run(run())
    person.thread.join(10)
    assert (result, RAN) == ("deleted acct-104", ["adelete_account acct-104"])


# What the framework adapters' tests check of an edited call (tests/sdk/test_langchain.py,
# test_openai_agents.py): the tool ran the edit, the effect keeps both, the model is told.
EDITED = ("Note: a reviewer edited this call's arguments before approving it; it ran with "
          '{"account_id": "acct-103"}, not with the arguments you proposed.\ndeleted acct-103')


def assert_ran_edited(session_id, caplog) -> None:
    """The tool ran acct-103 (never the proposed acct-102); the effect keeps both."""
    assert RAN == ["delete_account acct-103"]
    effect = Effect.objects.get(session_id=session_id)
    assert (effect.args, effect.approved_args, effect.state) == (
        {"account_id": "acct-102"}, {"account_id": "acct-103"}, "committed")
    assert effect.result == {"value": "deleted acct-103"}  # the tool's output; the note is the model's
    assert any("edited before approving" in r.getMessage() and "acct-103" in r.getMessage()
               for r in caplog.records if r.levelno == logging.INFO)
