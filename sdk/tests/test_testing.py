"""ScriptedAgent: plays a script against decorated tools, refusals become model text."""

from __future__ import annotations

import asyncio

import pytest

from undolog import ToolTier, UndoLogClient, undolog_tool
from undolog.testing import ScriptedAgent

from fakeserver import FakeServer


@undolog_tool(tier=ToolTier.SAFE)
async def list_inactive_accounts() -> list[str]:
    return ["acct-101", "acct-102"]


@undolog_tool(tier=ToolTier.IRREVERSIBLE, reason="Deletes an account for good")
async def delete_account(account_id: str) -> str:
    return f"deleted {account_id}"


def test_it_plays_turns_and_turns_a_rejection_into_denied(client: UndoLogClient,
                                                          server: FakeServer) -> None:
    client.register(list_inactive_accounts, delete_account)
    server.decisions["delete_account"] = ("rejected", {"approval": {"reason": "open invoice"}})
    agent = ScriptedAgent([[("list_inactive_accounts", {})],
                           [(delete_account, {"account_id": "acct-102"})],
                           "One deletion was denied."],
                          tools=[list_inactive_accounts, delete_account])

    async def run():
        async with client.session(agent="cleanup"):
            return await agent.run()

    transcript = asyncio.run(run())
    assert [(c.turn, c.tool, c.result) for c in transcript.calls] == [
        (0, "list_inactive_accounts", ["acct-101", "acct-102"]),
        (1, "delete_account", "DENIED: open invoice")]
    assert [c.tool for c in transcript.refusals] == ["delete_account"]
    assert transcript.answer == "One deletion was denied."


def test_outside_a_session_it_just_runs_the_tools() -> None:
    transcript = asyncio.run(ScriptedAgent([[(delete_account, {"account_id": "a"})]]).run())
    assert transcript.calls[0].result == "deleted a" and transcript.answer is None


def test_an_unknown_tool_name_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="not among the agent's tools"):
        asyncio.run(ScriptedAgent([[("drop_tables", {})]], tools=[delete_account]).run())


def test_run_sync_refuses_async_tools() -> None:
    with pytest.raises(TypeError, match=r"await agent\.run"):
        ScriptedAgent([[(delete_account, {"account_id": "a"})]]).run_sync()
