"""The cleanup agent as a LangGraph agent (`--framework langgraph`): LangChain 1.x's
`create_agent` with an in-memory checkpointer, driven by LangChain's own fake chat model
instead of an LLM, its tools plain LangChain tools given their tiers by
`UndologMiddleware`. Needs the `undolog[langchain]` extra (requirements.txt installs it).

The ops tools are the same functions as the scripted agent's (`ops.py`), unwrapped: a
framework's tools know nothing of undolog, and the middleware takes each one's tier from
the mapping `{name: ToolSpec}`. A call that must wait for a reviewer pauses the graph
(LangGraph's `interrupt()`); the demo waits for the decision, then resumes it.

`--rewind` goes back in a thread the LangGraph way (`get_state_history`, then `invoke` with an
earlier checkpoint's config): `thread_session` rewinds the run to that checkpoint's step first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.memory import InMemorySaver

from undolog import Refused, Session, UndoLogClient, spec_of
from undolog.integrations.langchain import ThreadRun, UndologMiddleware, thread_session
from undolog.testing import ToolCall, Transcript

ASK = "Clean up the inactive accounts."


class ScriptedChatModel(GenericFakeChatModel):
    """LangChain's fake chat model, able to sit in an agent: tools are bound, and ignored."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self


def plain_tools(tools: Iterable[Any]) -> tuple[list[BaseTool], dict[str, Any]]:
    """LangChain tools from the decorated ops functions, and their tiers by name."""
    lc_tools, tiers = [], {}
    for tool in tools:
        spec = spec_of(tool)
        lc_tools.append(StructuredTool.from_function(tool.__wrapped__, name=spec.name,
                                                     description=spec.description))
        tiers[spec.name] = spec
    return lc_tools, tiers


def messages_for(script: Sequence[Any]) -> list[AIMessage]:
    """The demo's script as the fake model's answers, one tool call per answer (a model's
    parallel calls would run at once, and the story wants them in order)."""
    messages, n = [], 0
    for turn in script:
        if isinstance(turn, str):
            messages.append(AIMessage(content=turn))
            continue
        for name, args in turn:
            n += 1
            messages.append(AIMessage(content="", tool_calls=[
                {"name": name, "args": args, "id": f"call_{n}", "type": "tool_call"}]))
    return messages


class GraphAgent:
    """Plays a script through a LangGraph agent, one thread (and undolog session) per run."""

    def __init__(self, client: UndoLogClient, tools: Iterable[Any],
                 say: Callable[[str], None]) -> None:
        self.client, self.say = client, say
        self.tools, self.tiers = plain_tools(tools)
        self.runs = 0
        self.last: tuple[Any, dict[str, Any]] | None = None  # the last thread: (graph, config)

    def play(self, script: Sequence[Any], opened: Callable[[Session], None], *,
             then: Sequence[Any] = ()) -> tuple[Transcript, Session]:
        """``then``: what the model answers after the script, once the thread is taken back."""
        refusals: dict[str, Refused] = {}
        model = ScriptedChatModel(messages=iter(messages_for([*script, *then])))
        middleware = UndologMiddleware(
            self.tiers, on_refused=lambda call, exc: refusals.__setitem__(call["id"], exc))
        agent = create_agent(model, self.tools, middleware=[middleware],
                             checkpointer=InMemorySaver())
        self.runs += 1
        config = {"configurable": {"thread_id": f"cleanup-demo-{self.runs}"}}
        self.last = (agent, config)
        command: Any = {"messages": [("user", ASK)]}
        while True:
            with thread_session(self.client, agent, config, agent="cleanup") as run:
                if not run.resumed:
                    opened(run.session)
                result = agent.invoke(command, run.config)
            if not run.interrupted:
                break
            for held in run.approvals:
                self.say(f"  langgraph: the graph paused at {held['tool']}({held['args']}) "
                         "(interrupt); resumed once it is decided")
            command = run.wait_for_decisions(timeout=120)
        return transcript_of(result["messages"], refusals), run.session

    def travel(self, pick: Callable[[Any], bool], *,
               leave_irreversible: bool = False) -> tuple[ThreadRun, list[BaseMessage]]:
        """LangGraph's time travel on the last thread: the newest checkpoint of its history that
        ``pick`` accepts, and ``invoke(None, its config)``; the run goes back to its step first."""
        assert self.last is not None
        agent, config = self.last
        target = next(s for s in agent.get_state_history(config) if pick(s))
        with thread_session(self.client, agent, target.config, agent="cleanup",
                            leave_irreversible=leave_irreversible) as run:
            result = agent.invoke(None, run.config)
        return run, result["messages"]

    def memory(self) -> list[BaseMessage]:
        """What the agent remembers: the thread's latest checkpoint's messages."""
        assert self.last is not None
        agent, config = self.last
        return list(agent.get_state(config).values["messages"])


def transcript_of(messages: Sequence[BaseMessage], refusals: dict[str, Refused]) -> Transcript:
    """What the graph's messages say, as the scripted agent's Transcript (for the report)."""
    outputs = {m.tool_call_id: m.content for m in messages if isinstance(m, ToolMessage)}
    transcript = Transcript()
    turn = 0
    for message in messages:
        if not isinstance(message, AIMessage):
            continue
        if not message.tool_calls:
            transcript.answer = str(message.content)
            continue
        turn += 1
        for call in message.tool_calls:
            error = refusals.get(call["id"])
            transcript.calls.append(ToolCall(turn, call["name"], call["args"],
                                             result=outputs.get(call["id"]),
                                             refused=error is not None, error=error))
    return transcript
