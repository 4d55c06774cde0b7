"""An OpenAI Agents SDK agent whose function tools undolog guards, without touching them.

Run it against a server: UNDOLOG_URL=http://127.0.0.1:8000 UNDOLOG_API_KEY=... python
openai_agents_cleanup.py, and approve the deletion in the dashboard. The model is a
scripted `Model` (no network, no API key); put yours instead (model="gpt-5").
"""

import asyncio
import json

from agents import Agent, ModelResponse, Runner, Usage, function_tool, set_tracing_disabled
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from undolog import CompensationDescriptor, UndoLogClient
from undolog.integrations.openai_agents import decisions, wrap_function_tools


@function_tool
def list_inactive_accounts() -> list[str]:
    """IDs of accounts with no login for 12 months."""
    return ["acct-101"]


@function_tool
def notify_owner(account_id: str, message: str) -> str:
    """Post an in-app notice to the account's owner."""
    return f"notice posted about {account_id}"


@function_tool
def delete_account(account_id: str) -> str:
    """Permanently delete an account and its data."""
    return f"deleted {account_id}"


TOOLS = wrap_function_tools([list_inactive_accounts, notify_owner, delete_account], {
    "list_inactive_accounts": "safe",
    "notify_owner": {"tier": "compensable", "compensation": CompensationDescriptor.new(
        "recall_notice", {"account_id": "{account_id}"})},
    "delete_account": {"tier": "irreversible", "reason": "Deletes an account for good"},
}, hold="interrupt")  # a held call stops the run the SDK's way (result.interruptions)


class ScriptedModel(Model):  # stands in for a real model
    def __init__(self, *turns):
        self.turns = enumerate(turns, 1)

    async def get_response(self, *args, **kwargs):
        n, turn = next(self.turns)
        if isinstance(turn, str):
            output = [ResponseOutputMessage(
                id="msg", type="message", role="assistant", status="completed",
                content=[ResponseOutputText(type="output_text", text=turn, annotations=[])])]
        else:
            name, arguments = turn
            # Every call has its own call_id, as a real model's do (a tool may be called twice).
            output = [ResponseFunctionToolCall(type="function_call", call_id=f"call_{n}",
                                               name=name, arguments=json.dumps(arguments))]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError


set_tracing_disabled(True)
model = ScriptedModel(("list_inactive_accounts", {}),
                      ("notify_owner", {"account_id": "acct-101", "message": "Bye."}),
                      ("delete_account", {"account_id": "acct-101"}), "acct-101 is gone.")
agent = Agent(name="cleanup", instructions="Clean up inactive accounts.", model=model,
              tools=TOOLS)


async def main():
    client = UndoLogClient()  # UNDOLOG_URL, UNDOLOG_API_KEY
    await client.aregister_compensation("recall_notice", "1.0.0", "webhook",
                                        "https://ops.example.com/recall")
    await client.aregister(*TOOLS)
    async with client.session(agent="cleanup") as session:
        result = await Runner.run(agent, "Clean up the inactive accounts.")
        while result.interruptions:  # nothing ran; the run goes on once decided
            for item in result.interruptions:
                print(f"waiting for a reviewer: {item.name}({item.arguments})", flush=True)
            result = await Runner.run(agent, await decisions(result))
    print(result.final_output)
    print(f"session {session.id}: {session.state}")
    await client.aclose()


asyncio.run(main())
