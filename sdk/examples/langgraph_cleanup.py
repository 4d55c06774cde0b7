"""A LangChain agent (a LangGraph graph) whose tools undolog guards, without touching them.

Run it against a server: UNDOLOG_URL=http://127.0.0.1:8000 UNDOLOG_API_KEY=... python
langgraph_cleanup.py, and approve the deletion in the dashboard. The model is LangChain's
fake chat model playing a script; put yours instead (init_chat_model("openai:gpt-5")).
"""

import itertools

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from undolog import CompensationDescriptor, UndoLogClient
from undolog.integrations.langchain import UndologMiddleware, thread_session


@tool
def list_inactive_accounts() -> list[str]:
    """IDs of accounts with no login for 12 months."""
    return ["acct-101"]


@tool
def notify_owner(account_id: str, message: str) -> str:
    """Post an in-app notice to the account's owner."""
    return f"notice posted about {account_id}"


@tool
def delete_account(account_id: str) -> str:
    """Permanently delete an account and its data."""
    return f"deleted {account_id}"


TOOLS = [list_inactive_accounts, notify_owner, delete_account]
TIERS = {
    "list_inactive_accounts": "safe",
    "notify_owner": {"tier": "compensable", "compensation": CompensationDescriptor.new(
        "recall_notice", {"account_id": "{account_id}"})},
    "delete_account": {"tier": "irreversible", "reason": "Deletes an account for good"},
}


class ScriptedModel(GenericFakeChatModel):  # stands in for a real chat model
    def bind_tools(self, tools, **kwargs):
        return self


CALL_IDS = itertools.count(1)  # a model gives every tool call its own id


def call(name, **args):
    call_id = f"call_{next(CALL_IDS)}"
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


model = ScriptedModel(messages=iter([
    call("list_inactive_accounts"),
    call("notify_owner", account_id="acct-101", message="Your account goes away."),
    call("delete_account", account_id="acct-101"),
    AIMessage(content="acct-101 is gone."),
]))
middleware = UndologMiddleware(TIERS)
agent = create_agent(model, TOOLS, middleware=[middleware], checkpointer=InMemorySaver())

client = UndoLogClient()  # UNDOLOG_URL, UNDOLOG_API_KEY
client.register_compensation("recall_notice", "1.0.0", "webhook", "https://ops.example.com/recall")
client.register(*middleware.specs(TOOLS))

config = {"configurable": {"thread_id": "cleanup-1"}}
command = {"messages": [("user", "Clean up the inactive accounts.")]}
while True:
    with thread_session(client, agent, config, agent="cleanup") as run:
        result = agent.invoke(command, run.config)
    if not run.interrupted:
        break
    for held in run.approvals:  # the graph paused: nothing ran, the run goes on once decided
        print(f"waiting for a reviewer: {held['tool']}({held['args']})", flush=True)
    command = run.wait_for_decisions()
print(result["messages"][-1].content)
print(f"session {run.session.id}: {run.session.state}")
