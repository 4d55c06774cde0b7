"""LangGraph's time travel takes the world with it (issue 41): a real graph with a real
checkpointer (InMemorySaver), against the real server, a real worker and a real webhook
receiver. A thread resumed from an earlier checkpoint rewinds its run to the step that
checkpoint had reached before the graph goes on: the receiver sees the later calls undone,
newest first, and the graph's memory and the world agree again. A thread resumed from its
latest checkpoint rewinds nothing."""

from __future__ import annotations

import asyncio
import time

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from undolog import RewindRefused
from undolog.integrations.langchain import specs, thread_session, wrap_tools

from effects.models import Effect, Session
from tests.receiver import Receiver
from tests.sdk import langchain_agent as lc
from tests.sdk.agent_tools import RAN

pytestmark = pytest.mark.django_db(transaction=True)

ASK = {"messages": [("user", "Email the owners")]}


@pytest.fixture
def receiver(acme, client):
    """The LangChain tools registered as the adapter declares them; their undo on a receiver
    that checks signatures and dedupes by Idempotency-Key."""
    client.register(*specs(wrap_tools(lc.TOOLS, lc.TIERS)))
    with Receiver(secrets=[acme.org.webhook_secret]) as receiver:
        client.register_compensation("undo_send_email", "1.0.0", "webhook", receiver.url)
        yield receiver


def emails(*people: str) -> list:
    """One model turn per email, then the answer."""
    return [[("send_email", {"to": f"{who}@example.com"})] for who in people]


class Seen:
    """Around each tool call: how many undos the receiver had acknowledged when it ran."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver, self.undone_before = receiver, {}

    def __call__(self, request, handler):
        self.undone_before[request.tool_call["args"].get("to")] = len(self.receiver.log)
        return handler(request)


def graph_with(model, seen: Seen | None = None):
    node = ToolNode(wrap_tools(lc.TOOLS, lc.TIERS), wrap_tool_call=seen)
    return lc.graph(model, InMemorySaver(), node)


def after_tools(agent, config, n: int):
    """The checkpoint the graph wrote once its n-th tool result was in its memory (the model
    about to take its next turn)."""
    return next(s for s in agent.get_state_history(config)
                if s.next == ("model",) and len(tool_results(s.values["messages"])) == n)


def tool_results(messages) -> list[str]:
    return [m.content for m in messages if isinstance(m, ToolMessage)]


def test_going_back_to_an_earlier_checkpoint_undoes_the_later_calls_before_the_graph_goes_on(
        acme, server, worker, client, receiver):
    model = lc.scripted([*emails("ana", "ben", "cy"), "Emailed ana, ben and cy.",
                         *emails("dee"), "Emailed ana and dee."])
    seen = Seen(receiver)
    agent = graph_with(model, seen)
    config = {"configurable": {"thread_id": "travel-1"}}
    with thread_session(client, agent, config, agent="cleanup") as first:
        agent.invoke(ASK, first.config)
    assert Session.objects.get(pk=first.session.id).state == "completed"
    assert receiver.log == [] and first.rewound is None

    # Time travel: back to the checkpoint after ana's email, and on from there.
    back = after_tools(agent, config, 1)
    assert back.metadata["undolog_step"] == 1 and back.metadata["undolog_session"] == first.session.id
    with thread_session(client, agent, back.config, agent="cleanup") as run:
        result = agent.invoke(None, run.config)

    assert run.resumed and run.session.id == first.session.id  # the completed run, reopened
    assert run.rewound["resumes_at"] == 1
    assert [(i["step_index"], i["tool"]) for i in run.rewound["to_undo"]] == [(3, "send_email"), (2, "send_email")]
    assert [d.body["args"]["to"] for d in receiver.log] == ["cy@example.com", "ben@example.com"]  # newest first
    assert not receiver.duplicates and all(d.verified for d in receiver.log)
    assert seen.undone_before["dee@example.com"] == 2  # both undone before the graph went on
    # Memory and world agree: the graph remembers ana and dee, and so does the effect log.
    assert tool_results(result["messages"]) == ["sent to ana@example.com", "sent to dee@example.com"]
    assert [f"send_email {w}@example.com" for w in ("ana", "ben", "cy", "dee")] == RAN
    live = Effect.objects.filter(session_id=first.session.id, state="committed").order_by("step_index")
    assert [(e.step_index, e.args["to"]) for e in live] == [(1, "ana@example.com"), (2, "dee@example.com")]
    session = Session.objects.get(pk=first.session.id)
    assert (session.state, session.rewinds, session.step_index) == ("completed", 1, 2)
    # The checkpoints written on the new branch carry the new steps.
    assert agent.get_state(config).metadata["undolog_step"] == 2


def test_going_on_from_the_latest_checkpoint_rewinds_nothing(acme, server, worker, client, receiver):
    model = lc.scripted([*emails("ana", "ben"), "Emailed both.", *emails("cy"), "Emailed cy too."])
    agent = graph_with(model)
    config = {"configurable": {"thread_id": "travel-2"}}
    with thread_session(client, agent, config, agent="cleanup") as first:
        agent.invoke(ASK, first.config)

    latest = agent.get_state(config)  # addressed by its id, as a history browser would
    with thread_session(client, agent, latest.config, agent="cleanup") as run:
        result = agent.invoke({"messages": [("user", "Email cy too")]}, run.config)

    assert run.rewound is None and not run.travel.back
    assert run.session.id != first.session.id  # the first run had completed: a new run of the thread
    assert receiver.log == []
    assert tool_results(result["messages"]) == [f"sent to {w}@example.com" for w in ("ana", "ben", "cy")]
    assert Effect.objects.filter(session_id=first.session.id, state="committed").count() == 2


def test_a_fork_by_update_state_goes_back_to_the_checkpoint_it_forked(acme, server, worker, client, receiver):
    # The async block, and a fork: update_state on an earlier checkpoint writes a new one (its
    # parent's world), and the graph goes on from it.
    model = lc.scripted([*emails("ana", "ben"), "Emailed both.", *emails("eve"), "Emailed ana and eve."])
    agent = graph_with(model)
    config = {"configurable": {"thread_id": "travel-3"}}

    async def play():
        async with thread_session(client, agent, config, agent="cleanup") as first:
            await agent.ainvoke(ASK, first.config)
        back = after_tools(agent, config, 1)
        fork = await agent.aupdate_state(back.config, {"messages": [HumanMessage("Not ben: email eve.")]})
        async with thread_session(client, agent, fork, agent="cleanup") as run:
            result = await agent.ainvoke(None, run.config)
        return first, run, result

    first, run, result = asyncio.run(play())

    assert run.session.id == first.session.id and run.rewound["resumes_at"] == 1
    assert [d.body["args"]["to"] for d in receiver.log] == ["ben@example.com"]
    assert tool_results(result["messages"]) == ["sent to ana@example.com", "sent to eve@example.com"]
    assert Session.objects.get(pk=first.session.id).state == "completed"


def test_an_irreversible_call_after_the_checkpoint_refuses_the_travel_unless_it_is_left_done(
        acme, server, worker, client, receiver):
    assert acme.admin.post("/api/v1/rules", {"name": "let-delete", "condition": 'tool.name == "delete_account"',
                                             "outcome": "approve"}, format="json").status_code == 201
    model = lc.scripted([*emails("ana"), [("delete_account", {"account_id": "acct-101"})], *emails("ben"),
                         "Done.", "Nothing more to do."])
    agent = graph_with(model)
    config = {"configurable": {"thread_id": "travel-4"}}
    with thread_session(client, agent, config, agent="cleanup") as first:
        agent.invoke(ASK, first.config)
    back = after_tools(agent, config, 1)

    with pytest.raises(RewindRefused) as refused, thread_session(client, agent, back.config, agent="cleanup"):
        raise AssertionError("the graph must not go on")
    assert refused.value.code == "irreversible_in_the_way"
    assert [(i["tool"], i["step_index"]) for i in refused.value.irreversible] == [("delete_account", 2)]
    assert receiver.log == [] and Session.objects.get(pk=first.session.id).state == "completed"

    with thread_session(client, agent, back.config, agent="cleanup", leave_irreversible=True) as run:
        result = agent.invoke(None, run.config)

    assert [i["tool"] for i in run.rewound["left_done"]] == ["delete_account"]
    assert [d.body["args"]["to"] for d in receiver.log] == ["ben@example.com"]
    assert result["messages"][-1].content == "Nothing more to do."
    assert Effect.objects.get(session_id=first.session.id, tool_name="delete_account").state == "committed"


class SlowSaver(InMemorySaver):
    """Saves each checkpoint 0.3 s late, as a distant database might. LangGraph saves in the
    background, one checkpoint after the other, so the next steps' tools run meanwhile."""

    def put(self, *args, **kwargs):
        time.sleep(0.3)
        return super().put(*args, **kwargs)


def test_a_checkpoint_saved_while_the_next_steps_tools_run_gets_its_own_step(acme, server, worker, client, receiver):
    # Three nodes in a row, each sending one email: the checkpoint after the first is saved while
    # the second and third already sent theirs. It records step 1 (its own calls), not what the
    # run had reached by the time it was saved.
    [send_email] = [t for t in wrap_tools(lc.TOOLS, lc.TIERS) if t.name == "send_email"]

    def emailing(who: str):
        def node(state: MessagesState) -> dict:
            send_email.invoke({"to": f"{who}@example.com"})
            return {"messages": [AIMessage(f"emailed {who}")]}
        return node

    builder = StateGraph(MessagesState)
    for who in ("ana", "ben", "cy"):
        builder.add_node(who, emailing(who))
    builder.add_edge(START, "ana")
    builder.add_edge("ana", "ben")
    builder.add_edge("ben", "cy")
    builder.add_edge("cy", END)
    agent = builder.compile(checkpointer=SlowSaver())
    config = {"configurable": {"thread_id": "travel-5"}}
    with thread_session(client, agent, config, agent="cleanup") as first:
        agent.invoke(ASK, first.config)

    after_ana = next(s for s in agent.get_state_history(config) if s.next == ("ben",))
    assert after_ana.metadata["undolog_step"] == 1
    with thread_session(client, agent, after_ana.config, agent="cleanup") as run:
        agent.invoke(None, run.config)

    assert run.rewound["resumes_at"] == 1
    assert [d.body["args"]["to"] for d in receiver.log] == ["cy@example.com", "ben@example.com"]
    live = Effect.objects.filter(session_id=first.session.id, state="committed").order_by("step_index")
    assert [(e.step_index, e.args["to"]) for e in live] == [(1, "ana@example.com"), (2, "ben@example.com"),
                                                           (3, "cy@example.com")]


def test_going_back_to_an_earlier_turn_takes_the_later_runs_of_the_thread_back_whole(
        acme, server, worker, client, receiver):
    # A conversation: each turn is a run of its own. Back to the first turn's checkpoint: the
    # second turn's run is rewound to its start (its calls undone, newest first) and completed,
    # before the graph goes on; the first run had done nothing since that checkpoint.
    model = lc.scripted([*emails("ana"), "Emailed ana.", *emails("ben", "cy"), "Emailed ben and cy.",
                         "Only ana, then."])
    agent = graph_with(model)
    config = {"configurable": {"thread_id": "travel-6"}}
    with thread_session(client, agent, config, agent="cleanup") as turn1:
        agent.invoke(ASK, turn1.config)
    with thread_session(client, agent, config, agent="cleanup") as turn2:
        agent.invoke({"messages": [("user", "Email ben and cy too")]}, turn2.config)
    assert turn2.session.id != turn1.session.id

    # The first turn's checkpoint after ana's email (the second turn's start has one tool result too).
    back = next(s for s in agent.get_state_history(config)
                if s.next == ("model",) and len(s.values["messages"]) == 3)
    assert back.metadata["undolog_session"] == turn1.session.id
    with thread_session(client, agent, back.config, agent="cleanup") as run:
        result = agent.invoke(None, run.config)

    [taken] = run.taken_back
    assert [i["step_index"] for i in taken["to_undo"]] == [2, 1] and taken["resumes_at"] == 0
    assert [d.body["args"]["to"] for d in receiver.log] == ["cy@example.com", "ben@example.com"]
    second = Session.objects.get(pk=turn2.session.id)
    assert (second.state, second.step_index, second.rewinds) == ("completed", 0, 1)
    assert run.rewound is None and run.session.id not in (turn1.session.id, turn2.session.id)
    assert Effect.objects.get(session_id=turn1.session.id).state == "committed"  # ana stays emailed
    assert tool_results(result["messages"]) == ["sent to ana@example.com"]
    assert result["messages"][-1].content == "Only ana, then."


def test_an_irreversible_call_in_the_way_refuses_going_back_across_runs_before_anything_is_undone(
        acme, server, worker, client, receiver):
    # The first turn deleted an account after ana's email; the second emailed ben. Going back to
    # the first turn's checkpoint after ana would undo ben's email (the later run) and then meet
    # the deletion: refused before either run is touched.
    assert acme.admin.post("/api/v1/rules", {"name": "let-delete", "condition": 'tool.name == "delete_account"',
                                             "outcome": "approve"}, format="json").status_code == 201
    model = lc.scripted([*emails("ana"), [("delete_account", {"account_id": "acct-101"})], "Done.",
                         *emails("ben"), "Emailed ben."])
    agent = graph_with(model)
    config = {"configurable": {"thread_id": "travel-7"}}
    with thread_session(client, agent, config, agent="cleanup") as turn1:
        agent.invoke(ASK, turn1.config)
    with thread_session(client, agent, config, agent="cleanup") as turn2:
        agent.invoke({"messages": [("user", "Now ben")]}, turn2.config)
    back = next(s for s in agent.get_state_history(config)
                if s.next == ("model",) and len(s.values["messages"]) == 3)

    with pytest.raises(RewindRefused) as refused, thread_session(client, agent, back.config, agent="cleanup"):
        raise AssertionError("the graph must not go on")

    assert refused.value.code == "irreversible_in_the_way"
    assert [(i["tool"], i["session"]) for i in refused.value.irreversible] == [("delete_account", turn1.session.id)]
    assert receiver.log == []  # ben's email (the later run) was not undone either
    for run, steps in ((turn1, 2), (turn2, 1)):
        session = Session.objects.get(pk=run.session.id)
        assert (session.state, session.step_index, session.rewinds) == ("completed", steps, 0)
