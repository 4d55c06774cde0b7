"""The framework adapters against the in-memory fake: what they declare, that SAFE calls stay
off the network, that a replay returns the stored result without running the tool, and that
the core SDK imports no framework. (Against the real server: tests/sdk/test_langchain.py and
tests/sdk/test_openai_agents.py in the repository.)"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from agents import FunctionTool, function_tool
from agents.tool_context import ToolContext
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool

from undolog import CompensationDescriptor, UndoLogClient
from undolog.integrations.langchain import UndologMiddleware, specs, wrap_tool, wrap_tools
from undolog.integrations.openai_agents import wrap_function_tool, wrap_function_tools

from fakeserver import FakeServer

UNDO = CompensationDescriptor.new("undo_send_email", {"to": "{to}"})
RAN: list[str] = []


@pytest.fixture(autouse=True)
def _clean() -> None:
    RAN.clear()


@tool
def search(query: str) -> str:
    """Search the web."""
    RAN.append(f"search {query}")
    return f"results for {query}"


@tool
def send_email(to: str) -> str:
    """Send an email."""
    RAN.append(f"send_email {to}")
    return f"sent to {to}"


def test_importing_undolog_imports_no_framework() -> None:
    code = ("import sys, undolog, undolog.integrations, undolog.testing; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('langchain', 'langchain_core', 'langgraph', 'agents', 'openai', 'mcp')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- LangChain ---------------------------------------------------------------------------


def test_it_wraps_a_langchain_tool_keeping_its_name_and_schema_and_declares_its_spec() -> None:
    wrapped = wrap_tool(send_email, "compensable", compensation=UNDO)

    assert (wrapped.name, wrapped.description) == ("send_email", "Send an email.")
    schema = send_email.tool_call_schema.model_json_schema()
    assert wrapped.tool_call_schema.model_json_schema() == schema
    spec = specs([wrapped])[0]
    assert (spec.name, spec.tier.value, spec.compensation) == ("send_email", "compensable", UNDO)
    assert wrapped.invoke({"to": "a@x.io"}) == "sent to a@x.io"  # outside a session: the tool
    assert RAN == ["send_email a@x.io"]


def test_it_refuses_a_langchain_declaration_that_undolog_tool_would_refuse() -> None:
    with pytest.raises(ValueError, match="COMPENSABLE tool needs a CompensationDescriptor"):
        wrap_tool(send_email, "compensable")
    with pytest.raises(ValueError, match="unknown parameter"):
        wrap_tool(send_email, "compensable",
                  compensation=CompensationDescriptor.new("undo", {"to": "{recipient}"}))
    with pytest.raises(ValueError, match="no tier for tool 'send_email'"):
        wrap_tools([search, send_email], {"search": "safe"})
    with pytest.raises(ValueError, match="not given"):
        wrap_tools([search], {"search": "safe", "send_emial": "safe"})


class FakeModel(GenericFakeChatModel):
    def bind_tools(self, tools, **kwargs):
        return self


def _agent(turns, tools, tiers, client: UndoLogClient):
    middleware = UndologMiddleware(tiers)
    declared = [t for t in tools if t.name in tiers]
    if declared:
        client.register(*middleware.specs(declared))
    messages = [AIMessage(content=t) if isinstance(t, str) else AIMessage(
        content="", tool_calls=[{"name": n, "args": a, "id": f"c{i}"}
                                for i, (n, a) in enumerate(t)])
        for t in turns]
    return create_agent(FakeModel(messages=iter(messages)), tools,
                        middleware=[middleware])


def test_a_safe_call_through_the_middleware_makes_no_request(client: UndoLogClient,
                                                             server: FakeServer) -> None:
    agent = _agent([[("search", {"query": "inactive"})], "done"], [search], {"search": "safe"},
                   client)
    with client.session(agent="cleanup"):
        before = len(server.requests)
        agent.invoke({"messages": [("user", "go")]})
        assert len(server.requests) == before

    assert RAN == ["search inactive"]
    [complete] = server.bodies("/complete")
    assert [(c["tool"], c["args"]) for c in complete["safe_calls"]] == [
        ("search", {"query": "inactive"})]


def test_a_replayed_call_returns_the_stored_result_without_running(client: UndoLogClient,
                                                                    server: FakeServer) -> None:
    tiers = {"send_email": {"tier": "compensable", "compensation": UNDO}}
    with client.session(agent="cleanup") as s:
        first = _agent([[("send_email", {"to": "a@x.io"})], "done"], [send_email], tiers, client)
        first.invoke({"messages": [("user", "go")]})
    with client.resume_session(s.id):
        again = _agent([[("send_email", {"to": "a@x.io"})], "done"], [send_email], tiers, client)
        messages = again.invoke({"messages": [("user", "go")]})["messages"]

    assert RAN == ["send_email a@x.io"]
    assert [m.content for m in messages if isinstance(m, ToolMessage)] == ["sent to a@x.io"]
    assert [b["result"] for b in server.bodies("/commit")] == [{"value": "sent to a@x.io"}]


EDITED = ("Note: a reviewer edited this call's arguments before approving it; it ran with "
          '{"to": "b@x.io"}, not with the arguments you proposed.\n')
HELD = {"tier": "irreversible", "reason": "Mails a customer"}


def test_a_call_a_reviewer_edited_runs_the_edit_and_says_so_even_when_replayed(
        client: UndoLogClient, server: FakeServer) -> None:
    server.decisions["send_email"] = ("approved", {"approved_args": {"to": "b@x.io"}})
    turns = [[("send_email", {"to": "a@x.io"})], "done"]
    with client.session(agent="cleanup") as s:
        first = _agent(turns, [send_email], {"send_email": HELD}, client)
        ran = first.invoke({"messages": [("user", "go")]})["messages"]
    with client.resume_session(s.id):  # as after a crash: the stored result, the same note
        again = _agent(turns, [send_email], {"send_email": HELD}, client)
        replayed = again.invoke({"messages": [("user", "go")]})["messages"]

    assert RAN == ["send_email b@x.io"]
    assert [m.content for m in ran + replayed if isinstance(m, ToolMessage)] == [
        EDITED + "sent to b@x.io"] * 2
    assert [b["result"] for b in server.bodies("/commit")] == [{"value": "sent to b@x.io"}]


def test_the_middleware_fails_closed_on_an_undeclared_tool(client: UndoLogClient) -> None:
    agent = _agent([[("send_email", {"to": "a@x.io"})], "done"], [send_email],
                   {"search": "safe"}, client)
    with pytest.raises(ValueError, match="no tier for tool 'send_email'"), \
            client.session(agent="cleanup"):
        agent.invoke({"messages": [("user", "go")]})
    assert RAN == []


# -- OpenAI Agents SDK ---------------------------------------------------------------------


@function_tool
def lookup(account_id: str) -> str:
    """Look an account up."""
    RAN.append(f"lookup {account_id}")
    return f"account {account_id}"


@function_tool
async def notify(to: str) -> str:
    """Notify an owner."""
    RAN.append(f"notify {to}")
    return f"notified {to}"


def _call(tool: FunctionTool, args: dict) -> object:
    """What the Runner does with a model's function call: on_invoke_tool(context, json)."""
    raw = json.dumps(args)
    context = ToolContext(context=None, tool_name=tool.name, tool_call_id="call_1",
                          tool_arguments=raw)
    return tool.on_invoke_tool(context, raw)


def test_it_wraps_a_function_tool_keeping_its_schema_and_declares_its_spec() -> None:
    undo = CompensationDescriptor.new("undo_notify", {"to": "{to}"})
    wrapped = wrap_function_tool(notify, "compensable", compensation=undo)

    assert isinstance(wrapped, FunctionTool) and wrapped is not notify
    assert (wrapped.name, wrapped.params_json_schema) == ("notify", notify.params_json_schema)
    assert wrapped.undolog_spec.tier.value == "compensable"
    with pytest.raises(ValueError, match="reason"):
        wrap_function_tool(notify, "irreversible")
    with pytest.raises(ValueError, match="no tier for tool 'notify'"):
        wrap_function_tools([lookup, notify], {"lookup": "safe"})


def test_a_safe_function_tool_makes_no_request(client: UndoLogClient, server: FakeServer) -> None:
    [wrapped] = wrap_function_tools([lookup], {"lookup": "safe"})

    async def run() -> object:
        async with client.session(agent="cleanup"):
            before = len(server.requests)
            result = await _call(wrapped, {"account_id": "acct-1"})
            assert len(server.requests) == before
            return result

    assert asyncio.run(run()) == "account acct-1"
    assert RAN == ["lookup acct-1"]
    assert [c["tool"] for c in server.bodies("/complete")[0]["safe_calls"]] == ["lookup"]


def test_a_budget_refusal_is_the_function_tools_output(client: UndoLogClient,
                                                        server: FakeServer) -> None:
    message = ("Budget limit max_irreversible_per_run reached (limit 2); tool call 'notify' was "
               "not executed. Stop calling tools and give your final answer.")
    server.refuse = lambda body: (429, {"decision": "refused", "kind": "budget",
                                        "limit": "max_irreversible_per_run", "message": message})
    undo = CompensationDescriptor.new("undo_notify", {})
    [wrapped] = wrap_function_tools([notify], {"notify": {"tier": "compensable",
                                                          "compensation": undo}})

    async def run() -> object:
        async with client.session(agent="cleanup"):
            return await _call(wrapped, {"to": "a@x.io"})

    assert asyncio.run(run()) == message
    assert RAN == []


def test_a_replayed_function_tool_call_returns_the_stored_result(client: UndoLogClient,
                                                                  server: FakeServer) -> None:
    undo = CompensationDescriptor.new("undo_notify", {"to": "{to}"})
    [wrapped] = wrap_function_tools([notify], {"notify": {"tier": "compensable",
                                                          "compensation": undo}})
    client.register(wrapped)

    async def run() -> list[object]:
        async with client.session(agent="cleanup") as s:
            first = await _call(wrapped, {"to": "a@x.io"})
        async with client.resume_session(s.id):  # as after a crash: the agent runs again
            again = await _call(wrapped, {"to": "a@x.io"})
        return [first, again]

    assert asyncio.run(run()) == ["notified a@x.io", "notified a@x.io"]
    assert RAN == ["notify a@x.io"]


def test_a_function_tool_call_a_reviewer_edited_runs_the_edit_and_says_so_even_when_replayed(
        client: UndoLogClient, server: FakeServer) -> None:
    server.decisions["notify"] = ("approved", {"approved_args": {"to": "b@x.io"}})
    [wrapped] = wrap_function_tools([notify], {"notify": HELD})
    client.register(wrapped)

    async def run() -> list[object]:
        async with client.session(agent="cleanup") as s:
            first = await _call(wrapped, {"to": "a@x.io"})
        async with client.resume_session(s.id):
            again = await _call(wrapped, {"to": "a@x.io"})
        return [first, again]

    assert asyncio.run(run()) == [EDITED + "notified b@x.io"] * 2
    assert RAN == ["notify b@x.io"]
    assert [b["result"] for b in server.bodies("/commit")] == [{"value": "notified b@x.io"}]
