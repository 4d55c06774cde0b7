/** Runs against the real server: complete, roll back, replay, SAFE reports, budgets. */

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import {
  BudgetExceededError,
  Session,
  ToolNotRegistered,
  currentSession,
  refusalAsToolResult,
  undologTool,
} from "../src/index.js";
import { Receiver, newAgent, setBudget } from "./helpers.js";

const receiver = new Receiver();
before(async () => {
  await receiver.start();
});
after(async () => {
  await receiver.close();
});

function cleanupTools(ran: string[]) {
  const listInactive = undologTool({ name: "list_inactive_accounts", tier: "safe", costWeight: 0.01 },
    async () => ["acct-101", "acct-102", "acct-103"]);
  const sendEmail = undologTool({
    name: "send_email", tier: "compensable",
    compensation: { fnName: "undo_send_email", args: { to: "{to}" }, maxRetries: 2, retryBackoffMs: 100 },
  }, async ({ to, subject }: { to: string; subject: string }) => {
    ran.push(`send_email ${to}`);
    return { message_id: `m-${to}`, subject };
  });
  return { listInactive, sendEmail };
}

async function registered(ran: string[]) {
  const agent = await newAgent();
  const tools = cleanupTools(ran);
  await agent.client.registerCompensation({ fnName: "undo_send_email", handler: "webhook", target: receiver.url });
  await agent.client.register(tools.listInactive, tools.sendEmail);
  return { ...agent, ...tools };
}

describe("runs", () => {
  it("it completes a run whose callback returns, and reports its SAFE calls", async () => {
    const ran: string[] = [];
    const { client, listInactive, sendEmail } = await registered(ran);
    let inside: Session | undefined;
    const answer = await client.session({ agent: undefined, metadata: { test: "complete" } }, async (run) => {
      inside = currentSession();
      const accounts = await listInactive({});
      await sendEmail({ to: `${accounts[0]}@x.io`, subject: "closing" });
      return "done";
    });
    assert.equal(answer, "done");
    assert.equal(inside?.state, "completed");
    assert.deepEqual(ran, ["send_email acct-101@x.io"]);
    const data = await client.getSession(inside!.id!);
    const effects = data["effects"] as Record<string, any>[];
    assert.deepEqual(effects.map((e) => [e["tool"], e["tier"], e["state"]]), [["send_email", "compensable", "committed"]]);
    // The SAFE read rode on the intercept: counted in the run's budget, never an effect.
    const budget = data["budget"] as Record<string, any>;
    assert.equal(budget["tool_calls"], 2);
    assert.equal(budget["tool_counts"]["list_inactive_accounts"], 1);
  });

  it("it rolls back a run whose callback throws, newest first at the receiver, and rethrows", async () => {
    const ran: string[] = [];
    const { client, sendEmail } = await registered(ran);
    let run: Session | undefined;
    await assert.rejects(client.session({}, async (r) => {
      run = r;
      await sendEmail({ to: "a@x.io", subject: "one" });
      await sendEmail({ to: "b@x.io", subject: "two" });
      throw new Error("the export service is down");
    }), /the export service is down/);
    const done = await run!.waitCompensated({ timeout: 60 });
    assert.equal(done["state"], "compensated");
    const mine = receiver.applied.filter((d) => d.body["session_id"] === run!.id);
    assert.deepEqual(mine.map((d) => d.body["args"]), [{ to: "b@x.io" }, { to: "a@x.io" }]);
    assert.ok(mine.every((d) => d.verified), "every undo is signed with the org's secret");
  });

  it("it replays a committed call of a resumed run without running it again", async () => {
    const ran: string[] = [];
    const { client, sendEmail } = await registered(ran);
    let first: unknown;
    let id = "";
    // A crash after the commit: the callback's abort leaves the run running.
    await assert.rejects(client.session({}, async (run) => {
      id = run.id!;
      first = await sendEmail({ to: "a@x.io", subject: "hi" });
      throw Object.assign(new Error("the process died"), { name: "AbortError" });
    }));
    const again = await client.resumeSession(id, {}, async () => await sendEmail({ to: "a@x.io", subject: "hi" }));
    assert.deepEqual(again, first);
    assert.deepEqual(ran, ["send_email a@x.io"], "the tool ran once");
    assert.equal((await client.getSession(id))["state"], "completed");
  });

  it("it refuses a call over the budget with the server's exact message", async () => {
    const ran: string[] = [];
    const agent = await registered(ran);
    await setBudget(agent.name, { max_tool_calls_per_run: 1 });
    let refusal: unknown;
    await agent.client.session({}, async () => {
      await agent.sendEmail({ to: "a@x.io", subject: "1" });
      refusal = await agent.sendEmail({ to: "b@x.io", subject: "2" }).catch((e: unknown) => e);
    });
    assert.ok(refusal instanceof BudgetExceededError);
    assert.equal(refusal.code, "budget");
    assert.equal(refusal.status, 429);
    assert.equal(refusal.message, refusal.body["message"], "the message is the server's text, as is");
    assert.match(refusal.message, /Stop calling tools and give your final answer\.$/);
    assert.equal(refusalAsToolResult(refusal), refusal.message);
    assert.deepEqual(ran, ["send_email a@x.io"]);
  });

  it("it maps a server error to its typed error with the code and the message", async () => {
    const { client } = await newAgent();
    const unknown = undologTool({ name: "never_registered", tier: "compensable",
      compensation: { fnName: "undo_it" } }, async () => "no");
    const error = await client.session({}, async () => await unknown({}).catch((e: unknown) => e));
    assert.ok(error instanceof ToolNotRegistered);
    assert.equal(error.code, "tool_not_registered");
    assert.equal(error.status, 404);
    assert.equal(error.message, error.body["message"]);
    assert.ok(error.message.length > 0);
  });

  it("it runs a tool as the plain function outside a session", async () => {
    const ran: string[] = [];
    const { sendEmail } = cleanupTools(ran);
    assert.deepEqual(await sendEmail({ to: "x@x.io", subject: "s" }), { message_id: "m-x@x.io", subject: "s" });
    assert.deepEqual(ran, ["send_email x@x.io"]);
  });
});
