"""OpenAI Agents SDK agents with undolog, against the real server (and worker): the SDK's own
agent loop (`Runner.run`) driven by a scripted `Model` (no network, no API key), with plain
`@function_tool` functions that the adapter wraps."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from typing import Any

import pytest
from agents import Agent, ModelResponse, Runner, Usage, UserError, function_tool, set_tracing_disabled
from agents.models.interface import Model
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from undolog import CompensationDescriptor
from undolog.integrations.openai_agents import decisions, wrap_function_tools

from effects.models import Effect, Session
from tests.receiver import Receiver
from tests.sdk.agent_tools import RAN, did
from tests.sdk.conftest import Person, reviewer, token_of
from tests.sdk.test_edit_before_approve import EDITED, assert_ran_edited, edit_and_approve

pytestmark = pytest.mark.django_db(transaction=True)

set_tracing_disabled(True)  # no traces exported: no network, no key

GUIDE = ("Budget limit max_irreversible_per_run reached (limit 2); tool call 'delete_account' was not "
         "executed. Stop calling tools and give your final answer.")


class ExportServiceDown(Exception):
    pass


@function_tool
def send_email(to: str) -> str:
    """Send an email to an account's owner."""
    did(f"send_email {to}")
    return f"sent to {to}"


CONTEXT_ARGUMENTS: list[str] = []  # each delete_account call's ctx.tool_arguments


@function_tool
async def delete_account(ctx: ToolContext, account_id: str) -> str:
    """Permanently delete an account and its data."""
    CONTEXT_ARGUMENTS.append(ctx.tool_arguments)
    did(f"delete_account {account_id}")
    return f"deleted {account_id}"


@function_tool(failure_error_function=None)  # its failure ends the run
def export_account(account_id: str) -> str:
    """Export an account's data (the export service is down)."""
    raise ExportServiceDown(f"export service unavailable while exporting {account_id}")


TIERS: dict[str, Any] = {
    "send_email": {"tier": "compensable", "compensation": CompensationDescriptor.new(
        "undo_send_email", {"to": "{to}"}, max_retries=2, retry_backoff_ms=100)},
    "delete_account": {"tier": "irreversible", "reason": "Deletes an account for good", "cost_weight": 5.0},
    "export_account": "safe",
}
TOOLS = wrap_function_tools([send_email, delete_account, export_account], TIERS)
# The same tools with the SDK's human-in-the-loop: a held call stops the run (an interruption).
HITL_TOOLS = wrap_function_tools([send_email, delete_account, export_account], TIERS, hold="interrupt")


class ScriptedModel(Model):
    """A `Model` that answers turn by turn from a script: a list of (tool, args) calls, or
    the final text. `seen` keeps the input items it was given each turn."""

    def __init__(self, *turns: list[tuple[str, dict]] | str) -> None:
        self.turns = iter(turns)
        self.seen: list[list[Any]] = []
        self.ids = itertools.count(1)

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema,
                           handoffs, tracing, **kwargs) -> ModelResponse:
        self.seen.append(list(input) if not isinstance(input, str) else [input])
        turn = next(self.turns)
        if isinstance(turn, str):
            output = [ResponseOutputMessage(
                id="msg", type="message", role="assistant", status="completed",
                content=[ResponseOutputText(type="output_text", text=turn, annotations=[])])]
        else:
            output = []
            for name, args in turn:
                n = next(self.ids)
                output.append(ResponseFunctionToolCall(type="function_call", id=f"fc_{n}", call_id=f"call_{n}",
                                                       name=name, arguments=json.dumps(args)))
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the tests run the agent loop without streaming")


def agent_with(model: ScriptedModel, tools=TOOLS) -> Agent:
    return Agent(name="cleanup", instructions="Clean up inactive accounts.", model=model, tools=tools)


def tool_outputs(items) -> list[str]:
    return [i["output"] for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]


@pytest.fixture
def oa_client(client):
    client.register(*TOOLS)  # the wrapped FunctionTools carry their undolog_spec
    return client


def test_it_rolls_back_an_agent_run_that_raises(acme, server, worker, oa_client):
    model = ScriptedModel([("send_email", {"to": "ana@example.com"})], [("send_email", {"to": "ben@example.com"})],
                          [("export_account", {"account_id": "acct-101"})], "unreachable")
    opened = []

    async def run() -> None:
        async with oa_client.session(agent="cleanup") as s:
            opened.append(s)
            await Runner.run(agent_with(model), "Email the owners, then export their data")

    with Receiver(secrets=[acme.org.webhook_secret]) as receiver:
        oa_client.register_compensation("undo_send_email", "1.0.0", "webhook", receiver.url)
        with pytest.raises(UserError, match="export service unavailable") as raised:
            asyncio.run(run())
        [s] = opened
        assert s.wait_compensated(timeout=30)["state"] == "compensated"

    assert [d.body["args"] for d in receiver.log] == [{"to": "ben@example.com"}, {"to": "ana@example.com"}]
    assert RAN == ["send_email ana@example.com", "send_email ben@example.com"]
    assert "export service unavailable" in Session.objects.get(pk=s.id).error
    # The SDK wraps the tool's exception in its UserError; the cause is the tool's own.
    assert isinstance(raised.value, UserError) and isinstance(raised.value.__cause__, ExportServiceDown)


def test_an_irreversible_call_is_awaited_until_a_reviewer_approves(acme, server, oa_client):
    person = reviewer(acme, server, ("approve", ""), delay=0.3)
    model = ScriptedModel([("delete_account", {"account_id": "acct-101"})], "Deleted acct-101.")

    async def run():
        async with oa_client.session(agent="cleanup") as s:
            result = await Runner.run(agent_with(model), "Delete acct-101")
        return s, result

    s, result = asyncio.run(run())
    person.finish()

    assert result.final_output == "Deleted acct-101."
    assert tool_outputs(model.seen[-1]) == ["deleted acct-101"]
    assert RAN == ["delete_account acct-101"]
    assert len(person.asked) == 1 and s.state == "completed"
    assert Effect.objects.get(session_id=s.id).state == "committed"


def test_the_model_reads_the_budget_refusal_as_the_tool_output(acme, server, oa_client):
    Person(server, token_of(acme.admin)).patch_budget("cleanup", max_irreversible_per_run=2, on_exceeded="pause")
    person = reviewer(acme, server, ("approve", ""), ("approve", ""))
    model = ScriptedModel(*[[("delete_account", {"account_id": a})] for a in ("acct-101", "acct-102", "acct-103")],
                          "Deleted what the budget allowed.")

    async def run():
        async with oa_client.session(agent="cleanup"):
            return await Runner.run(agent_with(model), "Delete the inactive accounts")

    result = asyncio.run(run())
    person.finish()

    # The last turn's input ends with the refusal, word for word, as the third call's output.
    assert tool_outputs(model.seen[-1]) == ["deleted acct-101", "deleted acct-102", GUIDE]
    assert result.final_output == "Deleted what the budget allowed."
    assert RAN == ["delete_account acct-101", "delete_account acct-102"]


def test_the_model_reads_a_rejection_as_the_tool_output(acme, server, oa_client):
    person = reviewer(acme, server, ("reject", "acct-102 has an open invoice"))
    model = ScriptedModel([("delete_account", {"account_id": "acct-102"})], "acct-102 was not deleted.")

    async def run():
        async with oa_client.session(agent="cleanup") as s:
            await Runner.run(agent_with(model), "Delete acct-102")
        return s

    s = asyncio.run(run())
    person.finish()

    assert tool_outputs(model.seen[-1]) == ["DENIED: acct-102 has an open invoice"]
    assert RAN == []
    assert s.state == "halted"


def test_a_held_call_interrupts_the_run_and_the_reviewers_decisions_resume_it(acme, server, oa_client):
    model = ScriptedModel([("delete_account", {"account_id": "acct-101"})],
                          [("delete_account", {"account_id": "acct-102"})], "Deleted acct-101 only.")
    agent = agent_with(model, HITL_TOOLS)
    person = Person(server, token_of(acme.reviewer))
    seen: list[str] = []

    async def decide(verb: str, reason: str = "") -> None:
        [request] = await asyncio.to_thread(person.pending)
        seen.append(request["proposed_args"]["account_id"])
        assert (await asyncio.to_thread(person.decide, request["id"], verb, reason)).status_code == 200

    async def run():
        async with oa_client.session(agent="cleanup") as s:
            result = await Runner.run(agent, "Delete the inactive accounts")
            # The SDK's interruption: the run stopped at the held call, which did not run.
            assert [i.name for i in result.interruptions] == ["delete_account"] and RAN == []
            await decide("approve")
            result = await Runner.run(agent, await decisions(result, timeout=15))
            assert [i.name for i in result.interruptions] == ["delete_account"]
            await decide("reject", "acct-102 has an open invoice")
            result = await Runner.run(agent, await decisions(result, timeout=15))
        return s, result

    s, result = asyncio.run(run())

    assert seen == ["acct-101", "acct-102"]
    assert RAN == ["delete_account acct-101"]
    assert result.final_output == "Deleted acct-101 only."
    assert tool_outputs(model.seen[-1]) == ["deleted acct-101", "DENIED: acct-102 has an open invoice"]
    assert s.state == "halted"
    assert sorted(Effect.objects.filter(session_id=s.id).values_list("state", flat=True)) == ["committed", "rejected"]


def test_parallel_held_calls_stop_the_run_and_each_is_decided_before_it_runs(acme, server, oa_client):
    # One model turn with two deletions: the first is held (an interruption), the second is
    # deferred behind it; once approved, the second is asked for and waited on in place.
    both = [("delete_account", {"account_id": "acct-101"}), ("delete_account", {"account_id": "acct-102"})]
    model = ScriptedModel(both, "Deleted both.")
    agent = agent_with(model, HITL_TOOLS)
    person = reviewer(acme, server, ("approve", ""), ("approve", ""), delay=0.2)

    async def run():
        async with oa_client.session(agent="cleanup") as s:
            result = await Runner.run(agent, "Delete acct-101 and acct-102")
            assert [i.name for i in result.interruptions] == ["delete_account", "delete_account"] and RAN == []
            result = await Runner.run(agent, await decisions(result, timeout=15))
        return s, result

    s, result = asyncio.run(run())
    person.finish()

    # Which of the two is held first is the SDK's order; each is asked for once, then runs once.
    assert sorted(r["proposed_args"]["account_id"] for r in person.asked) == ["acct-101", "acct-102"]
    assert sorted(RAN) == ["delete_account acct-101", "delete_account acct-102"]
    assert sorted(tool_outputs(model.seen[-1])) == ["deleted acct-101", "deleted acct-102"]
    assert result.final_output == "Deleted both." and s.state == "completed"


# -- edit before approving: the tool runs the reviewer's args, and the model is told ------------


def test_a_function_tool_runs_the_args_a_reviewer_edited_and_tells_the_model(acme, server, oa_client, caplog):
    person = edit_and_approve(acme, server, {"account_id": "acct-103"})
    model = ScriptedModel([("delete_account", {"account_id": "acct-102"})], "Deleted acct-103.")

    async def run():
        async with oa_client.session(agent="cleanup") as s:
            await Runner.run(agent_with(model), "Delete acct-102")
        return s

    with caplog.at_level(logging.INFO, logger="undolog"):
        s = asyncio.run(run())
    person.thread.join(10)

    assert tool_outputs(model.seen[-1]) == [EDITED]
    assert_ran_edited(s.id, caplog)
    assert json.loads(CONTEXT_ARGUMENTS[-1]) == {"account_id": "acct-103"}  # the tool's context says so too


def test_an_interrupted_run_resumes_with_the_args_a_reviewer_edited(acme, server, oa_client, caplog):
    model = ScriptedModel([("delete_account", {"account_id": "acct-102"})], "Deleted acct-103.")
    agent = agent_with(model, HITL_TOOLS)
    person = Person(server, token_of(acme.reviewer))

    async def run():
        async with oa_client.session(agent="cleanup") as s:
            result = await Runner.run(agent, "Delete acct-102")
            assert [i.name for i in result.interruptions] == ["delete_account"] and RAN == []
            [request] = await asyncio.to_thread(person.pending)
            await asyncio.to_thread(person.approve_edited, request, {"account_id": "acct-103"})
            result = await Runner.run(agent, await decisions(result, timeout=15))
        return s, result

    with caplog.at_level(logging.INFO, logger="undolog"):
        s, result = asyncio.run(run())

    assert result.final_output == "Deleted acct-103." and s.state == "completed"
    assert tool_outputs(model.seen[-1]) == [EDITED]
    assert_ran_edited(s.id, caplog)
    assert json.loads(CONTEXT_ARGUMENTS[-1]) == {"account_id": "acct-103"}
