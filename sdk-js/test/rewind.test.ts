/** `run.savepoint(name)` and `run.rewind({ to })` against the real server and its worker. */

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { RewindRefused, undologTool } from "../src/index.js";
import { Receiver, newAgent } from "./helpers.js";

const receiver = new Receiver();
before(async () => {
  await receiver.start();
});
after(async () => {
  await receiver.close();
});

describe("rewind", () => {
  it("undoes the calls after a savepoint, newest first, and the run goes on numbered after it", async () => {
    const ran: string[] = [];
    const agent = await newAgent();
    const sendNote = undologTool({
      name: "send_note", tier: "compensable",
      compensation: { fnName: "recall_note", args: { to: "{to}" }, maxRetries: 2, retryBackoffMs: 100 },
    }, async ({ to }: { to: string }) => {
      ran.push(to);
      return { sent: to };
    });
    await agent.client.registerCompensation({ fnName: "recall_note", handler: "webhook", target: receiver.url });
    await agent.client.register(sendNote);
    let id = "";
    await agent.client.session({}, async (run) => {
      id = run.id!;
      await sendNote({ to: "ana" });
      const point = await run.savepoint("drafted");
      assert.equal(point.step_index, 1);
      await sendNote({ to: "ben" });
      await sendNote({ to: "cy" });
      await assert.rejects(run.rewind({ to: 9 }), (err: unknown) =>
        err instanceof RewindRefused && err.code === "step_outside_run");
      const answer = await run.rewind({ to: "drafted", reason: "wrong recipients" });
      assert.equal(run.state, "running");
      assert.equal(answer["resumes_at"], 1);
      assert.deepEqual((answer["to_undo"] as Record<string, unknown>[]).map((i) => i["step_index"]), [3, 2]);
      assert.deepEqual(receiver.applied.filter((d) => d.body["session_id"] === id).map((d) => d.body["args"]["to"]),
        ["cy", "ben"]);
      await sendNote({ to: "cy" }); // identical to a rewound call: a new call, run again
    });
    assert.deepEqual(ran, ["ana", "ben", "cy", "cy"]);
    const data = await agent.client.getSession(id);
    const live = (data["effects"] as Record<string, any>[]).filter((e) => e["state"] === "committed");
    assert.deepEqual(live.map((e) => [e["step_index"], e["args"]["to"]]), [[1, "ana"], [2, "cy"]]);
  });
});
