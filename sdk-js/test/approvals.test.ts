/** Irreversible calls: the wait for a reviewer (long poll, abortable, bounded), approvals with
 * edited args, rejections; agent-side compensations served by the client. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  ApprovalRejected,
  ApprovalWaitTimeout,
  PermanentCompensationError,
  type Session,
  type WaitInfo,
  refusalAsToolResult,
  undologTool,
} from "../src/index.js";
import { newAgent, reviewer } from "./helpers.js";

function deleteTool(ran: string[]) {
  return undologTool({
    name: "delete_account", tier: "irreversible", costWeight: 5,
    approval: { reason: "Deletes an account for good", riskTags: ["data-loss"], estimatedImpact: "account {account_id}" },
    parameters: ["account_id"],
  }, async ({ account_id }: { account_id: string }) => {
    ran.push(account_id);
    return { deleted: account_id };
  });
}

describe("approvals", () => {
  it("it waits for the reviewer and runs the args they edited before approving", async () => {
    const ran: string[] = [];
    const { name, client } = await newAgent();
    const remove = deleteTool(ran);
    await client.register(remove);
    const waits: WaitInfo[] = [];
    const decided = (async () => {
      const request = await reviewer.next(name);
      await reviewer.approveEdited(request, { account_id: "acct-102" }, "102, not 101");
    })();
    const result = await client.session({ onWait: (info) => waits.push(info) }, async (run) => {
      run.reasoning("inactive for 12 months");
      return await remove({ account_id: "acct-101" });
    });
    await decided;
    assert.deepEqual(result, { deleted: "acct-102" });
    assert.deepEqual(ran, ["acct-102"], "the reviewer's edit ran, never the model's proposal");
    assert.equal(waits[0]?.state, "pending");
    assert.match(waits[0]?.url ?? "", /\/approvals\/[0-9a-f-]+\/$/);
  });

  it("it throws ApprovalRejected with the reviewer's reason, and the run is halted", async () => {
    const ran: string[] = [];
    const { name, client } = await newAgent();
    const remove = deleteTool(ran);
    await client.register(remove);
    const decided = reviewer.next(name).then((request) => reviewer.decide(request, "reject", "acct-103 pays us"));
    let run: Session | undefined;
    const error = await client.session({}, async (r) => {
      run = r;
      return await remove({ account_id: "acct-103" }).catch((e: unknown) => e);
    });
    await decided;
    assert.ok(error instanceof ApprovalRejected);
    assert.equal(error.reason, "acct-103 pays us");
    assert.equal(refusalAsToolResult(error), "DENIED: acct-103 pays us");
    assert.equal(run?.state, "halted");
    assert.deepEqual(ran, []);
  });

  it("it stops waiting when the call's AbortSignal aborts, leaving the request pending", async () => {
    const ran: string[] = [];
    const { name, client } = await newAgent({ pollWait: 30 });
    const remove = deleteTool(ran);
    await client.register(remove);
    const controller = new AbortController();
    const started = Date.now();
    setTimeout(() => controller.abort(new Error("the user closed the tab")), 800);
    let run: Session | undefined;
    await assert.rejects(client.session({}, async (r) => {
      run = r;
      return await remove({ account_id: "acct-101" }, { signal: controller.signal });
    }), /the user closed the tab/);
    assert.ok(Date.now() - started < 10_000, "the 30 s long poll was cut short");
    assert.equal((await reviewer.pending(name)).length, 1, "the request is still there for a reviewer");
    assert.equal((await client.getSession(run!.id!))["state"], "awaiting_approval", "an abort is no failure: no rollback");
    assert.deepEqual(ran, []);
  });

  it("it gives up after approvalTimeout with ApprovalWaitTimeout", async () => {
    const { client } = await newAgent();
    const remove = deleteTool([]);
    await client.register(remove);
    const error = await client.session({ approvalTimeout: 1, pollWait: 1 },
      async () => await remove({ account_id: "acct-104" }).catch((e: unknown) => e));
    assert.ok(error instanceof ApprovalWaitTimeout);
    assert.equal(error.code, "approval_wait_timeout");
    assert.ok(error.effectId);
  });

  it("it runs agent-side compensations with serveCompensations and reports them", async () => {
    const { client } = await newAgent();
    const undone: Record<string, unknown>[] = [];
    await client.registerCompensation({ fnName: "undo_create_ticket", handler: "agent", claimTimeoutS: 60 });
    await client.registerCompensation({ fnName: "undo_grant", handler: "agent", claimTimeoutS: 60 });
    const createTicket = undologTool({ name: "create_ticket", tier: "compensable",
      compensation: { fnName: "undo_create_ticket", args: { id: "{result.id}" }, maxRetries: 1, retryBackoffMs: 50 },
    }, async ({ title }: { title: string }) => ({ id: `T-${title}` }));
    const grant = undologTool({ name: "grant_access", tier: "compensable",
      compensation: { fnName: "undo_grant", args: { user: "{user}" }, maxRetries: 0 },
    }, async ({ user }: { user: string }) => ({ granted: user }));
    await client.register(createTicket, grant);
    let run: Session | undefined;
    await assert.rejects(client.session({}, async (r) => {
      run = r;
      await createTicket({ title: "one" });
      await grant({ user: "mallory" });
      throw new Error("wrong customer");
    }));
    const stop = new AbortController();
    const serving = client.serveCompensations({
      undo_create_ticket: async (args, context) => {
        assert.ok(context.idempotencyKey);
        undone.push(args);
      },
      undo_grant: async () => {
        throw new PermanentCompensationError("the grant was already revoked by hand");
      },
    }, { signal: stop.signal, pollS: 0.2 });
    const state = await run!.waitCompensated({ timeout: 60 }).finally(() => stop.abort());
    const ran = await serving;
    // Newest first: the grant's undo fails for good and goes to a person; the walk stops there.
    assert.equal(state["state"], "compensation_failed");
    assert.equal(ran, 1);
    assert.deepEqual(undone, []);
    const stack = state["undo_stack"] as Record<string, any>[];
    assert.ok(stack.some((e) => e["state"] === "compensation_failed"));
  });

  it("it claims a scoped function's entries only when serving its scope", async () => {
    const { client } = await newAgent();
    const undone: unknown[] = [];
    await client.registerCompensation({ fnName: "undo_book", handler: "agent", claimTimeoutS: 60, scope: "rooms-eu" });
    const book = undologTool({ name: "book_room", tier: "compensable",
      compensation: { fnName: "undo_book", args: { room: "{room}" } },
    }, async ({ room }: { room: string }) => ({ room }));
    await client.register(book);
    let run: Session | undefined;
    await assert.rejects(client.session({}, async (r) => {
      run = r;
      await book({ room: "101" });
      throw new Error("wrong dates");
    }));
    const handlers = { undo_book: async (args: Record<string, unknown>) => { undone.push(args); } };
    await new Promise((resolve) => setTimeout(resolve, 1000)); // the walk reaches the entry
    assert.equal(await client.serveCompensations(handlers, { once: true }), 0); // no scope: unscoped only
    assert.equal(await client.serveCompensations(handlers, { once: true, scopes: ["rooms-us"] }), 0);
    const stop = new AbortController();
    const serving = client.serveCompensations(handlers, { signal: stop.signal, pollS: 0.2, scopes: ["rooms-eu"] });
    const state = await run!.waitCompensated({ timeout: 60 }).finally(() => stop.abort());
    assert.equal(await serving, 1);
    assert.equal(state["state"], "compensated");
    assert.deepEqual(undone, [{ room: "101" }]);
  });
});
