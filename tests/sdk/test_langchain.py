"""LangChain 1.x and LangGraph agents with undolog, against the real server (and worker):
a real agent loop (`create_agent`, or a hand-built graph with a `ToolNode`) driven by
LangChain's fake chat model. The tools are plain `@tool` functions; the adapter wraps them."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from undolog import CompensationDescriptor
from undolog.integrations.langchain import UndologMiddleware, specs, thread_session, wrap_tools

from effects.models import Effect, Session
from tests.receiver import Receiver
from tests.sdk import langchain_agent as lc
from tests.sdk.agent_tools import RAN, did
from tests.sdk.conftest import Person, reviewer, token_of
from tests.sdk.test_edit_before_approve import EDITED, assert_ran_edited, edit_and_approve
from tests.sdk.test_replay import BASE_DIR, _env

pytestmark = pytest.mark.django_db(transaction=True)

GUIDE = ("Budget limit max_irreversible_per_run reached (limit 2); tool call 'delete_account' was not "
         "executed. Stop calling tools and give your final answer.")
ASK = {"messages": [("user", "Clean up the inactive accounts")]}


@pytest.fixture
def lc_client(client):
    """The agent's client with the LangChain tools registered as the adapter declares them."""
    client.register(*specs(wrap_tools(lc.TOOLS, lc.TIERS)))
    return client


def tool_messages(messages) -> list[str]:
    return [m.content for m in messages if isinstance(m, ToolMessage)]


def test_it_rolls_back_a_create_agent_run_that_raises(acme, server, worker, lc_client, monkeypatch):
    model = lc.scripted([[("list_inactive_accounts", {})],
                         [("send_email", {"to": "ana@example.com"})],
                         [("send_email", {"to": "ben@example.com"})],
                         [("export_account", {"account_id": "acct-101"})], "unreachable"])
    agent = create_agent(model, lc.TOOLS, middleware=[UndologMiddleware(lc.TIERS)])

    with Receiver(secrets=[acme.org.webhook_secret]) as receiver:
        lc_client.register_compensation("undo_send_email", "1.0.0", "webhook", receiver.url)
        with pytest.raises(lc.ExportServiceDown), lc_client.session(agent="cleanup") as s:
            agent.invoke(ASK)
        assert s.wait_compensated(timeout=30)["state"] == "compensated"

    assert [d.body["args"] for d in receiver.log] == [{"to": "ben@example.com"}, {"to": "ana@example.com"}]
    assert RAN == ["send_email ana@example.com", "send_email ben@example.com"]
    assert Session.objects.get(pk=s.id).error.startswith("ExportServiceDown: export service unavailable")


def test_an_irreversible_call_blocks_until_a_reviewer_approves_without_a_checkpointer(acme, server, lc_client):
    person = reviewer(acme, server, ("approve", ""), delay=0.3)
    model = lc.scripted([[("delete_account", {"account_id": "acct-101"})], "Deleted acct-101."])
    agent = create_agent(model, lc.TOOLS, middleware=[UndologMiddleware(lc.TIERS)])

    with lc_client.session(agent="cleanup") as s:
        result = agent.invoke(ASK)
    person.finish()

    assert tool_messages(result["messages"]) == ["deleted acct-101"]
    assert RAN == ["delete_account acct-101"]
    assert s.state == "completed"
    effect = Effect.objects.get(session_id=s.id)
    assert (effect.tool_name, effect.args, effect.state) == ("delete_account", {"account_id": "acct-101"},
                                                             "committed")


def test_a_graph_with_a_checkpointer_interrupts_and_resumes_when_the_reviewer_approves(acme, server, lc_client):
    model = lc.scripted([[("delete_account", {"account_id": "acct-101"})], "Deleted acct-101."])
    agent = create_agent(model, lc.TOOLS, middleware=[UndologMiddleware(lc.TIERS)],
                         checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "cleanup-1"}}

    with thread_session(lc_client, agent, config, agent="cleanup") as run:
        paused = agent.invoke(ASK, run.config)
    # The graph paused at the held call instead of blocking; nothing ran, the run is not over.
    assert run.interrupted and "__interrupt__" in paused
    [held] = run.approvals
    assert (held["tool"], held["args"]) == ("delete_account", {"account_id": "acct-101"})
    assert RAN == []
    session = Session.objects.get(pk=run.session.id)
    assert session.state == "awaiting_approval" and session.metadata["thread_id"] == "cleanup-1"

    person = Person(server, token_of(acme.reviewer))
    [request] = person.pending()
    assert person.decide(request["id"], "approve").status_code == 200
    resume = run.wait_for_decisions(timeout=15)

    with thread_session(lc_client, agent, config, agent="cleanup") as again:
        done = agent.invoke(resume, again.config)

    assert again.resumed and again.session.id == run.session.id
    assert tool_messages(done["messages"]) == ["deleted acct-101"]
    assert done["messages"][-1].content == "Deleted acct-101."
    assert RAN == ["delete_account acct-101"]
    assert Session.objects.get(pk=run.session.id).state == "completed"


class RetryingModel(lc.ScriptedChatModel):
    """The script, except that a call the adapter said to make again is made again (which of
    two parallel calls is held first is the threads' order), as a model would."""

    def _generate(self, messages, *args, **kwargs):
        calls = {c["id"]: c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
        answered = [m for m in messages if isinstance(m, ToolMessage)]
        again = [calls[m.tool_call_id] for m in answered[-2:] if m.content.startswith("Another call")]
        retried = any(c["id"].startswith("again") for c in calls.values())
        if again and not retried:
            self.seen.append(list(messages))
            call = {**again[0], "id": "again_1"}
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content="", tool_calls=[call]))])
        return super()._generate(messages, *args, **kwargs)


def test_the_model_reads_the_budget_refusal_as_the_tool_output(acme, server, lc_client):
    Person(server, token_of(acme.admin)).patch_budget("cleanup", max_irreversible_per_run=2,
                                                      on_exceeded="pause")
    person = reviewer(acme, server, ("approve", ""), ("approve", ""))
    model = lc.scripted([[("delete_account", {"account_id": a})] for a in ("acct-101", "acct-102", "acct-103")]
                        + ["Deleted what the budget allowed."])
    agent = create_agent(model, lc.TOOLS, middleware=[UndologMiddleware(lc.TIERS)])

    with lc_client.session(agent="cleanup"):
        result = agent.invoke(ASK)
    person.finish()

    assert tool_messages(result["messages"]) == ["deleted acct-101", "deleted acct-102", GUIDE]
    # What the model was shown on its last turn ends with the refusal, word for word.
    last_seen = model.seen[-1][-1]
    assert isinstance(last_seen, ToolMessage) and last_seen.content == GUIDE
    assert RAN == ["delete_account acct-101", "delete_account acct-102"]


def test_a_graph_killed_after_a_committed_call_resumes_from_its_checkpointer_without_repeating_it(
        acme, server, lc_client, tmp_path, monkeypatch):
    side_effects, db = tmp_path / "side-effects.txt", str(tmp_path / "checkpoints.sqlite")
    child = subprocess.run([sys.executable, "-m", "tests.sdk.langchain_agent", server, acme.key, db, "t-42"],
                           cwd=BASE_DIR, capture_output=True, text=True, timeout=60,
                           env={**_env(), "SIDE_EFFECTS": str(side_effects)})
    assert child.returncode == 3, child.stderr
    session_id = child.stdout.strip()
    assert side_effects.read_text().splitlines() == ["send_email ana@example.com"]
    assert Session.objects.get(pk=session_id).state == "running"

    # Same thread, same checkpoints, a new process's graph: LangGraph re-runs the tools step.
    monkeypatch.setenv("SIDE_EFFECTS", str(side_effects))
    model = lc.scripted(["Emailed ana."])
    agent = lc.graph(model, lc.sqlite_saver(db))
    config = {"configurable": {"thread_id": "t-42"}}
    with thread_session(lc_client, agent, config, agent="cleanup") as run:
        result = agent.invoke(None, run.config)

    assert run.resumed and str(run.session.id) == session_id
    assert side_effects.read_text().splitlines() == ["send_email ana@example.com"]  # not twice
    assert tool_messages(result["messages"]) == ["sent to ana@example.com"]  # the stored result
    assert result["messages"][-1].content == "Emailed ana."
    assert Effect.objects.filter(session_id=session_id).count() == 1
    session = Session.objects.get(pk=session_id)
    assert (session.state, session.metadata["thread_id"]) == ("completed", "t-42")


def test_a_rejected_held_call_reaches_the_model_as_a_denial_when_the_async_graph_resumes(acme, server, lc_client):
    model = lc.scripted([[("delete_account", {"account_id": "acct-102"})],
                         [("delete_account", {"account_id": "acct-103"})], "acct-102 and acct-103 stay."])
    agent = create_agent(model, lc.TOOLS, middleware=[UndologMiddleware(lc.TIERS)],
                         checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "cleanup-2"}}
    person = Person(server, token_of(acme.reviewer))

    async def run() -> tuple:
        async with thread_session(lc_client, agent, config, agent="cleanup") as first:
            await agent.ainvoke(ASK, first.config)
        assert first.interrupted and RAN == []
        [request] = await asyncio.to_thread(person.pending)
        decided = await asyncio.to_thread(person.decide, request["id"], "reject", "acct-102 has an open invoice")
        assert decided.status_code == 200
        resume = await first.await_decisions(timeout=15)
        async with thread_session(lc_client, agent, config, agent="cleanup") as second:
            done = await agent.ainvoke(resume, second.config)
        return first, second, done

    first, second, done = asyncio.run(run())

    # The model reads the reviewer's reason; the halted run refuses its next call, asking no one.
    assert tool_messages(done["messages"]) == [
        "DENIED: acct-102 has an open invoice",
        "This run is over (halted); the tool call was not executed. Stop calling tools and give your final answer."]
    assert second.session.id == first.session.id and not second.interrupted
    assert RAN == []
    assert Session.objects.get(pk=first.session.id).state == "halted"
    assert list(Effect.objects.filter(session_id=first.session.id).values_list("state", flat=True)) == ["rejected"]


def test_parallel_held_calls_of_one_turn_wait_one_after_the_other(acme, server, lc_client):
    # One model turn with two deletions: LangGraph runs them at once, the adapter sends them
    # one after the other (else the second is answered 409 session_awaiting_approval).
    person = reviewer(acme, server, ("approve", ""), ("approve", ""))
    both = [("delete_account", {"account_id": "acct-101"}), ("delete_account", {"account_id": "acct-102"})]
    model = lc.scripted([both, "Deleted both."])
    agent = create_agent(model, lc.TOOLS, middleware=[UndologMiddleware(lc.TIERS)])

    with lc_client.session(agent="cleanup") as s:
        result = agent.invoke(ASK)
    person.finish()

    assert sorted(tool_messages(result["messages"])) == ["deleted acct-101", "deleted acct-102"]
    assert sorted(RAN) == ["delete_account acct-101", "delete_account acct-102"]
    assert s.state == "completed" and len(person.asked) == 2


def test_with_interrupts_a_parallel_sibling_of_a_held_call_is_told_to_call_again(acme, server, lc_client):
    # create_agent runs each tool call as its own task: the first deletion pauses the graph,
    # its sibling (answered 409 while the first waits) tells the model to call it again.
    both = [("delete_account", {"account_id": "acct-101"}), ("delete_account", {"account_id": "acct-102"})]
    model = RetryingModel(messages=lc.scripted([both, "Deleted both."]).messages, seen=[])
    agent = create_agent(model, lc.TOOLS, middleware=[UndologMiddleware(lc.TIERS)],
                         checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "cleanup-3"}}
    person = Person(server, token_of(acme.reviewer))
    command, pauses = ASK, 0
    while True:
        with thread_session(lc_client, agent, config, agent="cleanup") as run:
            result = agent.invoke(command, run.config)
        if not run.interrupted:
            break
        pauses += 1
        [request] = person.pending()
        assert person.decide(request["id"], "approve").status_code == 200
        command = run.wait_for_decisions(timeout=15)

    outputs = tool_messages(result["messages"])
    assert pauses == 2 and sorted(RAN) == ["delete_account acct-101", "delete_account acct-102"]
    assert outputs.count("Another call of this run is waiting for a reviewer; this call was not executed. "
                         "Call it again once that call is decided.") == 1
    assert sorted(o for o in outputs if o.startswith("deleted")) == ["deleted acct-101", "deleted acct-102"]
    assert Session.objects.get(pk=run.session.id).state == "completed"


# -- edit before approving: the tool runs the reviewer's args, and the model is told ------------


def delete_102() -> lc.ScriptedChatModel:
    return lc.scripted([[("delete_account", {"account_id": "acct-102"})], "Deleted acct-103."])


def test_the_middleware_runs_the_args_a_reviewer_edited_and_tells_the_model(acme, server, lc_client, caplog):
    person = edit_and_approve(acme, server, {"account_id": "acct-103"})
    model = delete_102()
    agent = create_agent(model, lc.TOOLS, middleware=[UndologMiddleware(lc.TIERS)])

    with caplog.at_level(logging.INFO, logger="undolog"), lc_client.session(agent="cleanup") as s:
        result = agent.invoke(ASK)
    person.thread.join(10)

    assert tool_messages(result["messages"]) == [EDITED]
    assert tool_messages(model.seen[-1]) == [EDITED]  # what the model read on its next turn
    assert_ran_edited(s.id, caplog)


@pytest.mark.parametrize("make_agent", [
    lambda: create_agent(delete_102(), lc.TOOLS, middleware=[UndologMiddleware(lc.TIERS)]),
    lambda: lc.graph(delete_102()),  # a ToolNode of wrap_tools' UndologTools
], ids=["middleware", "wrapped tool"])
def test_async_runs_the_args_a_reviewer_edited_and_tell_the_model(acme, server, lc_client, caplog, make_agent):
    person = edit_and_approve(acme, server, {"account_id": "acct-103"})
    agent = make_agent()

    async def run():
        async with lc_client.session(agent="cleanup") as s:
            return s, await agent.ainvoke(ASK)

    with caplog.at_level(logging.INFO, logger="undolog"):
        s, result = asyncio.run(run())
    person.thread.join(10)

    assert tool_messages(result["messages"]) == [EDITED]
    assert_ran_edited(s.id, caplog)


def test_a_wrapped_tool_runs_the_args_a_reviewer_edited_and_tells_the_model(acme, server, lc_client, caplog):
    person = edit_and_approve(acme, server, {"account_id": "acct-103"})
    model = delete_102()
    agent = lc.graph(model)  # a ToolNode of wrap_tools' UndologTools

    with caplog.at_level(logging.INFO, logger="undolog"), lc_client.session(agent="cleanup") as s:
        result = agent.invoke(ASK)
    person.thread.join(10)

    assert tool_messages(result["messages"]) == [EDITED]
    assert tool_messages(model.seen[-1]) == [EDITED]
    assert_ran_edited(s.id, caplog)


def test_a_resumed_graph_runs_the_args_a_reviewer_edited_while_it_was_paused(acme, server, lc_client, caplog):
    model = delete_102()
    agent = create_agent(model, lc.TOOLS, middleware=[UndologMiddleware(lc.TIERS)],
                         checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "cleanup-edit"}}

    with thread_session(lc_client, agent, config, agent="cleanup") as run:
        agent.invoke(ASK, run.config)
    assert run.interrupted and RAN == []
    person = Person(server, token_of(acme.reviewer))
    [request] = person.pending()
    person.approve_edited(request, {"account_id": "acct-103"})
    resume = run.wait_for_decisions(timeout=15)

    with caplog.at_level(logging.INFO, logger="undolog"), \
            thread_session(lc_client, agent, config, agent="cleanup") as again:
        done = agent.invoke(resume, again.config)

    assert again.resumed and tool_messages(done["messages"]) == [EDITED]
    assert_ran_edited(run.session.id, caplog)
    assert Session.objects.get(pk=run.session.id).state == "completed"


@tool(response_format="content_and_artifact")
def fetch_rows(table: str) -> tuple[str, dict]:
    """Read a table's rows."""
    return f"3 rows of {table}", {"rows": [1, 2, 3], "table": table}


class Handle:
    """An artifact that is no JSON at all (a client, a file handle...)."""


@tool(response_format="content_and_artifact")
def archive_rows(table: str) -> tuple[str, dict]:
    """Archive a table's rows."""
    did(f"archive_rows {table}")
    return f"archived {table}", {"archive": f"s3://archive/{table}", "handle": Handle()}


def test_a_wrapped_content_and_artifact_tool_hands_on_its_artifact_and_commits_what_the_model_read(
        acme, server, client):
    fetch, archive = wrap_tools([fetch_rows, archive_rows], {
        "fetch_rows": "safe",
        "archive_rows": {"tier": "compensable",
                         "compensation": CompensationDescriptor.new("undo_send_email", {"to": "{table}"})}})
    client.register(*specs([fetch, archive]))

    def call(wrapped, table: str) -> ToolMessage:
        return wrapped.invoke({"type": "tool_call", "name": wrapped.name, "args": {"table": table}, "id": "call-1"})

    with client.session(agent="cleanup") as s:
        read = call(fetch, "users")
        archived = call(archive, "users")
        again = call(archive, "users")  # the same call of the same run: replayed, not run again
        awaited = asyncio.run(archive.ainvoke({"type": "tool_call", "name": "archive_rows",
                                               "args": {"table": "orders"}, "id": "call-2"}))

    assert (read.content, read.artifact) == ("3 rows of users", {"rows": [1, 2, 3], "table": "users"})
    assert archived.content == "archived users"
    assert archived.artifact["archive"] == "s3://archive/users" and isinstance(archived.artifact["handle"], Handle)
    assert (again.content, again.artifact) == ("archived users", None)
    assert (awaited.content, awaited.artifact["archive"]) == ("archived orders", "s3://archive/orders")
    assert RAN == ["archive_rows users", "archive_rows orders"]
    effects = Effect.objects.filter(session_id=s.id).order_by("step_index")
    assert [(e.state, e.result) for e in effects] == [("committed", {"value": "archived users"}),
                                                     ("committed", {"value": "archived orders"})]
