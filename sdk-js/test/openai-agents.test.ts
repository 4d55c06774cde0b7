/** The Agents SDK adapter, driven by the SDK's real run loop (`run(agent, input)`) with a
 * scripted `Model`, against the real server. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Agent, run, setTracingDisabled, tool } from "@openai/agents";
import { z } from "zod";
import { ToolDefinitionError } from "../src/index.js";
import { decisions, functionTool } from "../src/openai-agents.js";
import { ADMIN_TOKEN, api, newAgent, reviewer, setBudget } from "./helpers.js";
import { ScriptedModel } from "./models.js";

setTracingDisabled(true);

async function setup(hold: "wait" | "interrupt" = "wait") {
  const ran: string[] = [];
  const agent = await newAgent();
  const notice = functionTool({
    name: "send_notice", description: "Email an account's owner", parameters: z.object({ account_id: z.string() }),
    execute: async ({ account_id }: { account_id: string }) => {
      ran.push(`notice ${account_id}`);
      return `sent to ${account_id}`;
    },
  }, { tier: "compensable", compensation: { fnName: "recall_notice", args: { account_id: "{account_id}" } } });
  const remove = functionTool({
    name: "delete_account", description: "Delete an account", parameters: z.object({ account_id: z.string() }),
    execute: async ({ account_id }: { account_id: string }, _ctx: unknown, details?: { toolCall?: { arguments: string } }) => {
      ran.push(`delete ${account_id} (${details?.toolCall?.arguments})`);
      return `deleted ${account_id}`;
    },
  }, { tier: "irreversible", approval: { reason: "Deletes an account for good" } }, { hold });
  await agent.client.registerCompensation({ fnName: "recall_notice", handler: "webhook", target: "http://127.0.0.1:9/undo" });
  await agent.client.register(notice, remove);
  return { ...agent, ran, tools: [notice, remove] };
}

describe("OpenAI Agents SDK adapter", () => {
  it("it gives the model the server's exact budget refusal as the tool's output", async () => {
    const { name, client, tools, ran } = await setup();
    await setBudget(name, { max_tool_calls_per_run: 1 });
    const model = new ScriptedModel([
      [{ call: "send_notice", input: { account_id: "acct-101" } }],
      [{ call: "send_notice", input: { account_id: "acct-102" } }],
      "stopped",
    ]);
    const agent = new Agent({ name: "cleanup", instructions: "Clean up", model, tools });
    const result = await client.session({}, async () => await run(agent, "Send the notices"));
    assert.equal(result.finalOutput, "stopped");
    assert.deepEqual(ran, ["notice acct-101"]);
    const refusals = (await api(ADMIN_TOKEN, "GET", "/api/v1/refusals")).body["refusals"] as Record<string, any>[];
    const mine = refusals.filter((r) => r["agent"] === name);
    assert.equal(model.read().at(-1), mine[0]!["message"]);
    assert.match(model.read().at(-1)!, /Stop calling tools and give your final answer\.$/);
  });

  it("it waits in the tool for the reviewer and runs their edit, with the edit in the tool's details", async () => {
    const { name, client, tools, ran } = await setup("wait");
    const model = new ScriptedModel([[{ call: "delete_account", input: { account_id: "acct-101" } }], "ok"]);
    const agent = new Agent({ name: "cleanup", instructions: "Clean up", model, tools });
    const decided = reviewer.next(name).then((r) => reviewer.approveEdited(r, { account_id: "acct-102" }));
    await client.session({}, async () => await run(agent, "Delete acct-101"));
    await decided;
    assert.deepEqual(ran, ['delete acct-102 ({"account_id":"acct-102"})']);
    assert.match(model.read().at(-1)!, /^Note: a reviewer edited this call's arguments before approving it;[^\n]*\ndeleted acct-102$/);
  });

  it("it stops the run on the SDK's interruptions and answers them with undolog's decisions", async () => {
    const { name, client, tools, ran } = await setup("interrupt");
    const model = new ScriptedModel([
      [{ call: "delete_account", input: { account_id: "acct-101" } }],
      [{ call: "delete_account", input: { account_id: "acct-103" } }],
      "done",
    ]);
    const agent = new Agent({ name: "cleanup", instructions: "Clean up", model, tools });
    const decided = reviewer.decideNext(name, ["approve", "inactive"], ["reject", "acct-103 pays us"]);
    const stops: string[][] = [];
    const final = await client.session({}, async () => {
      let result = await run(agent, "Delete the inactive accounts");
      for (let turn = 0; result.interruptions?.length && turn < 4; turn++) {
        stops.push(result.interruptions.map((i) => i.name ?? ""));
        result = await run(agent, await decisions(result));
      }
      return result.finalOutput;
    });
    await decided;
    assert.deepEqual(stops, [["delete_account"], ["delete_account"]], "each held call stopped the run");
    assert.equal(final, "done");
    assert.deepEqual(ran, ['delete acct-101 ({"account_id":"acct-101"})']);
    assert.deepEqual(model.read(), ["deleted acct-101", "DENIED: acct-103 pays us"]);
  });

  it("it throws at definition for a compensable tool without a compensation", () => {
    assert.throws(() => functionTool({ name: "send_notice", description: "d", parameters: z.object({ to: z.string() }),
      execute: async () => "x" }, "compensable"), ToolDefinitionError);
    void tool;
  });
});
