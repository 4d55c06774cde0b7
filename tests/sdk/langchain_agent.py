"""The account cleanup as a LangChain/LangGraph agent, driven by LangChain's own fake chat
model instead of an LLM: plain `@tool` functions (no undolog in them) that an adapter wraps.

No Django here: `python -m tests.sdk.langchain_agent URL KEY DB THREAD` runs a graph on a
SQLite checkpointer in a process of its own and dies (os._exit(3), no cleanup) right after
the first `send_email` committed, before LangGraph checkpoints the tools step.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from undolog import CompensationDescriptor, UndoLogClient
from undolog.integrations.langchain import thread_session, wrap_tools

from tests.sdk.agent_tools import did


class ExportServiceDown(Exception):
    pass


@tool
def send_email(to: str) -> str:
    """Send an email to an account's owner."""
    did(f"send_email {to}")
    return f"sent to {to}"


@tool
def delete_account(account_id: str) -> str:
    """Permanently delete an account and its data."""
    did(f"delete_account {account_id}")
    return f"deleted {account_id}"


@tool
def export_account(account_id: str) -> str:
    """Export an account's data (the export service is down)."""
    raise ExportServiceDown(f"export service unavailable while exporting {account_id}")


@tool
def list_inactive_accounts() -> list[str]:
    """IDs of accounts with no login for 12 months."""
    return ["acct-101", "acct-102", "acct-103"]


TOOLS = [list_inactive_accounts, send_email, delete_account, export_account]
UNDO_EMAIL = CompensationDescriptor.new("undo_send_email", {"to": "{to}"}, max_retries=2,
                                        retry_backoff_ms=100)
TIERS: dict[str, Any] = {
    "list_inactive_accounts": {"tier": "safe", "cost_weight": 0.01},
    "send_email": {"tier": "compensable", "compensation": UNDO_EMAIL},
    "delete_account": {"tier": "irreversible", "reason": "Deletes an account for good",
                       "cost_weight": 5.0},
    "export_account": {"tier": "safe"},
}


class ScriptedChatModel(GenericFakeChatModel):
    """LangChain's GenericFakeChatModel, able to sit in an agent (bind_tools), recording
    what it was shown each turn, so a test can read what the model received."""

    seen: list[list[BaseMessage]] = []

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


Turn = list[tuple[str, dict[str, Any]]] | str


def scripted(turns: Iterable[Turn]) -> ScriptedChatModel:
    """A model answering turn by turn: a list of (tool, args) calls, or the final text."""
    messages: list[AIMessage] = []
    n = 0
    for turn in turns:
        if isinstance(turn, str):
            messages.append(AIMessage(content=turn))
            continue
        calls = []
        for name, args in turn:
            n += 1
            calls.append({"name": name, "args": args, "id": f"call_{n}", "type": "tool_call"})
        messages.append(AIMessage(content="", tool_calls=calls))
    return ScriptedChatModel(messages=iter(messages), seen=[])


def graph(model: ScriptedChatModel, checkpointer: Any = None, tool_node: ToolNode | None = None):
    """A hand-built LangGraph agent: model → ToolNode (the wrapped tools) → model…"""

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_node("tools", tool_node or ToolNode(wrap_tools(TOOLS, TIERS)))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)


def sqlite_saver(path: str) -> SqliteSaver:
    return SqliteSaver(sqlite3.connect(path, check_same_thread=False))


def die_after_send_email(request: Any, handler: Any) -> Any:
    """The kill point: the wrapped send_email has run and committed; LangGraph has not
    yet checkpointed the tools step."""
    result = handler(request)
    if request.tool_call["name"] == "send_email":
        os._exit(3)
    return result


def main(url: str, key: str, db: str, thread: str) -> None:
    model = scripted([[("send_email", {"to": "ana@example.com"})], "Emailed ana."])
    node = ToolNode(wrap_tools(TOOLS, TIERS), wrap_tool_call=die_after_send_email)
    agent = graph(model, sqlite_saver(db), node)
    config = {"configurable": {"thread_id": thread}}
    with UndoLogClient(url, key) as client, \
            thread_session(client, agent, config, agent="cleanup") as run:
        print(run.session.id, flush=True)
        agent.invoke({"messages": [("user", "Email the owner of acct-101")]}, run.config)
    sys.exit(0)  # not reached: the process dies in the tools step


if __name__ == "__main__":
    main(*sys.argv[1:5])
