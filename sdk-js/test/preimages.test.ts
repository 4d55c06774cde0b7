/** `undologTool({..., before, restore})` against the real server (issue 42): the before read is
 * kept before the call runs; a rollback restores through serveCompensations as a
 * compare-and-restore; a record changed since is left for a person with both digests. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { ABSENT, PreImageError, type Session, digest, preImageHandlers, undologTool } from "../src/index.js";
import { newAgent } from "./helpers.js";

type Fields = Record<string, unknown>;

function recordTools(records: Map<string, Fields>, reads: string[]) {
  const readRecord = ({ id }: { id: string }) => {
    reads.push(id);
    if (id === "unreadable") throw new Error("the CRM is down");
    return records.has(id) ? { ...records.get(id)! } : ABSENT;
  };
  const updateRecord = undologTool({
    name: "update_record", tier: "compensable",
    before: readRecord,
    restore: ({ id }: { id: string }, before: Fields) => void records.set(id, { ...before }),
    restoreAbsent: ({ id }: { id: string }) => void records.delete(id),
    after: ({ fields }: { fields: Fields }, before: Fields | null) => ({ ...(before ?? {}), ...fields }),
  }, async ({ id, fields }: { id: string; fields: Fields }) => {
    records.set(id, { ...(records.get(id) ?? {}), ...fields });
    return { ok: true };
  });
  return { updateRecord };
}

async function rollBack(client: any, run: Session, tools: any[]) {
  const stop = new AbortController();
  const serving = client.serveCompensations(preImageHandlers(...tools), { signal: stop.signal, pollS: 0.1 });
  const state = await run.waitCompensated({ timeout: 60 }).finally(() => stop.abort());
  await serving;
  return state;
}

describe("pre-images", () => {
  it("it puts every record back and removes the one the run created", async () => {
    const { client } = await newAgent();
    const records = new Map<string, Fields>([["c1", { name: "Ana", tier: "gold" }]]);
    const { updateRecord } = recordTools(records, []);
    await client.register(updateRecord);
    let run: Session | undefined;
    await assert.rejects(client.session({}, async (r) => {
      run = r;
      await updateRecord({ id: "c1", fields: { tier: "platinum" } });
      await updateRecord({ id: "c3", fields: { name: "Cy" } });
      throw new Error("the model went astray");
    }));
    assert.deepEqual(records.get("c3"), { name: "Cy" });
    const state = await rollBack(client, run!, [updateRecord]);
    assert.equal(state["state"], "compensated");
    assert.deepEqual([...records.entries()], [["c1", { name: "Ana", tier: "gold" }]]);
  });

  it("it leaves a record someone else changed since to a person, with both digests", async () => {
    const { client } = await newAgent();
    const records = new Map<string, Fields>([["c2", { name: "Ben", tier: "silver" }]]);
    const { updateRecord } = recordTools(records, []);
    await client.register(updateRecord);
    let run: Session | undefined;
    await assert.rejects(client.session({}, async (r) => {
      run = r;
      await updateRecord({ id: "c2", fields: { tier: "gold" } });
      records.set("c2", { name: "Ben", tier: "bronze" }); // a person edits it meanwhile
      throw new Error("x");
    }));
    const state = await rollBack(client, run!, [updateRecord]);
    assert.equal(state["state"], "compensation_failed");
    assert.deepEqual(records.get("c2"), { name: "Ben", tier: "bronze" });
    const [entry] = state["undo_stack"] as Record<string, any>[];
    assert.ok(String(entry!["last_error"]).includes(await digest({ name: "Ben", tier: "gold" })));
    assert.ok(String(entry!["last_error"]).includes(await digest({ name: "Ben", tier: "bronze" })));
  });

  it("it never runs a call whose before read failed, and reads nothing again on a replay", async () => {
    const { client } = await newAgent();
    const records = new Map<string, Fields>([["c1", { name: "Ana" }]]);
    const reads: string[] = [];
    const { updateRecord } = recordTools(records, reads);
    await client.register(updateRecord);
    await client.session({}, async () => {
      await assert.rejects(updateRecord({ id: "unreadable", fields: { x: 1 } }), PreImageError);
      await updateRecord({ id: "c1", fields: { name: "Ana L" } });
    });
    assert.equal(records.has("unreadable"), false);
    assert.deepEqual(reads, ["unreadable", "c1"]);
  });
});
