/** The AI SDK adapter, driven by the AI SDK's real agent loop (generateText with tools and
 * stopWhen) and its own mock model, against the real server. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { type ModelMessage, generateText, stepCountIs, tool } from "ai";
import { z } from "zod";
import { ToolDefinitionError } from "../src/index.js";
import { decisions, wrapTool, wrapTools } from "../src/ai.js";
import { ADMIN_TOKEN, api, newAgent, reviewer, setBudget } from "./helpers.js";
import { scriptedModel, toolResults } from "./models.js";

function cleanupTools(ran: string[]) {
  return {
    list_inactive_accounts: tool({
      description: "Inactive accounts", inputSchema: z.object({}),
      execute: async () => ["acct-101", "acct-102", "acct-103"],
    }),
    send_notice: tool({
      description: "Email an account's owner", inputSchema: z.object({ account_id: z.string() }),
      execute: async ({ account_id }) => {
        ran.push(`notice ${account_id}`);
        return { sent: account_id };
      },
    }),
    delete_account: tool({
      description: "Delete an account", inputSchema: z.object({ account_id: z.string() }),
      execute: async ({ account_id }) => {
        ran.push(`delete ${account_id}`);
        return `deleted ${account_id}`;
      },
    }),
  };
}

const TIERS = {
  list_inactive_accounts: "safe",
  send_notice: { tier: "compensable", compensation: { fnName: "recall_notice", args: { account_id: "{account_id}" } } },
  delete_account: { tier: "irreversible", costWeight: 5, approval: { reason: "Deletes an account for good" } },
} as const;

async function setup(hold: "wait" | "approval" = "wait") {
  const ran: string[] = [];
  const agent = await newAgent();
  const tools = wrapTools(cleanupTools(ran), TIERS, { hold });
  await agent.client.registerCompensation({ fnName: "recall_notice", handler: "webhook", target: "http://127.0.0.1:9/undo" });
  await agent.client.register(...Object.values(tools));
  return { ...agent, tools, ran };
}

describe("AI SDK adapter", () => {
  it("it gives the model the server's exact budget refusal as the tool's result", async () => {
    const { name, client, tools, ran } = await setup();
    await setBudget(name, { max_tool_calls_per_run: 2 });
    const { model, prompts } = scriptedModel([
      [{ call: "list_inactive_accounts", input: {} }],
      [{ call: "send_notice", input: { account_id: "acct-101" } }],
      [{ call: "send_notice", input: { account_id: "acct-102" } }],
      "I stopped: the budget is spent.",
    ]);
    const result = await client.session({}, async () =>
      await generateText({ model, tools, stopWhen: stepCountIs(8), prompt: "Clean up the inactive accounts" }));
    assert.equal(result.text, "I stopped: the budget is spent.");
    assert.deepEqual(ran, ["notice acct-101"]);
    const [, read] = toolResults(prompts[3]).at(-1)!;
    // What the model read is, character for character, the message the server recorded.
    const refusals = (await api(ADMIN_TOKEN, "GET", "/api/v1/refusals")).body["refusals"] as Record<string, any>[];
    const mine = refusals.filter((r) => r["agent"] === name);
    assert.equal(mine.length, 1);
    assert.equal(read, mine[0]!["message"]);
    assert.match(read as string, /Stop calling tools and give your final answer\.$/);
  });

  it("it waits for the reviewer in execute and runs their edit, telling the model", async () => {
    const { name, client, tools, ran } = await setup("wait");
    const { model, prompts } = scriptedModel([[{ call: "delete_account", input: { account_id: "acct-101" } }], "ok"]);
    const decided = reviewer.next(name).then((r) => reviewer.approveEdited(r, { account_id: "acct-102" }));
    await client.session({}, async () => await generateText({ model, tools, stopWhen: stepCountIs(4), prompt: "go" }));
    await decided;
    assert.deepEqual(ran, ["delete acct-102"]);
    const [[, read]] = toolResults(prompts[1]) as [[string, string]];
    assert.match(read, /^Note: a reviewer edited this call's arguments before approving it; it ran with \{"account_id":"acct-102"\}/);
    assert.match(read, /\ndeleted acct-102$/);
  });

  it("it gives the model DENIED and the reviewer's reason when they reject", async () => {
    const { name, client, tools, ran } = await setup("wait");
    const { model, prompts } = scriptedModel([[{ call: "delete_account", input: { account_id: "acct-103" } }], "ok"]);
    const decided = reviewer.next(name).then((r) => reviewer.decide(r, "reject", "acct-103 pays us"));
    await client.session({}, async () => await generateText({ model, tools, stopWhen: stepCountIs(4), prompt: "go" }));
    await decided;
    assert.deepEqual(ran, []);
    assert.deepEqual(toolResults(prompts[1]), [["delete_account", "DENIED: acct-103 pays us"]]);
  });

  it("it holds calls through the AI SDK's tool approval flow and answers it with undolog's decisions", async () => {
    const { name, client, tools, ran } = await setup("approval");
    const { model, prompts } = scriptedModel([
      [{ call: "delete_account", input: { account_id: "acct-101" } }],
      [{ call: "delete_account", input: { account_id: "acct-102" } }],
      "done",
    ]);
    const decided = reviewer.decideNext(name, ["approve", "inactive"], ["reject", "acct-102 pays us"]);
    const text = await client.session({}, async () => {
      const messages: ModelMessage[] = [{ role: "user", content: "Delete the inactive accounts" }];
      for (let turn = 0; turn < 4; turn++) {
        const result = await generateText({ model, tools, stopWhen: stepCountIs(4), messages });
        messages.push(...result.response.messages);
        const answers = await decisions(result);
        if (!answers.length) return result.text;
        messages.push(...answers);
      }
      return "too many turns";
    });
    await decided;
    assert.equal(text, "done");
    assert.deepEqual(ran, ["delete acct-101"]);
    const read = toolResults(prompts.at(-1));
    assert.deepEqual(read, [["delete_account", "deleted acct-101"], ["delete_account", "DENIED: acct-102 pays us"]]);
  });

  it("it throws at wrapping time for a compensable tool without a compensation", () => {
    const plain = cleanupTools([]);
    assert.throws(() => wrapTool("send_notice", plain.send_notice, "compensable"), ToolDefinitionError);
    assert.throws(() => wrapTools(plain, { list_inactive_accounts: "safe" }), /no tier for tool "send_notice"/);
    assert.throws(() => wrapTool("send_notice", plain.send_notice,
      { tier: "compensable", compensation: { fnName: "u", args: { id: "{acount_id}" } } }), /unknown parameter/);
  });
});
