/** `npm pack` gives a tarball that installs and imports in a fresh directory, types included. */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { after, describe, it } from "node:test";

const ROOT = resolve(import.meta.dirname, "..", "..");
const work = mkdtempSync(join(tmpdir(), "undolog-pack-"));
after(() => rmSync(work, { recursive: true, force: true }));

function sh(command: string, args: string[], cwd: string): string {
  return execFileSync(command, args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
}

describe("npm pack", () => {
  it("it packs a tarball that installs and imports in a fresh directory", () => {
    // `npm test` built dist/ already; prepack (a second build) is for packing by hand.
    sh("npm", ["pack", "--silent", "--ignore-scripts", "--pack-destination", work], ROOT);
    const tarball = readdirSync(work).find((f) => f.endsWith(".tgz"));
    assert.ok(tarball, "npm pack wrote a tarball");
    const listing = sh("tar", ["-tzf", join(work, tarball)], work).split("\n");
    for (const file of ["package/dist/index.js", "package/dist/index.d.ts", "package/dist/ai.d.ts",
      "package/dist/openai-agents.d.ts", "package/README.md"]) {
      assert.ok(listing.includes(file), `${file} is in the tarball`);
    }
    assert.ok(!listing.some((f) => f.startsWith("package/test/") || f.startsWith("package/src/")), "no tests or sources");
    const app = join(work, "app");
    sh("mkdir", ["-p", app], work);
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", type: "module", private: true }));
    // No dependencies of its own: it installs offline, and without the frameworks (optional peers).
    sh("npm", ["install", "--offline", "--no-audit", "--no-fund", "--silent", join(work, tarball)], app);
    const out = sh("node", ["--input-type=module", "-e", `
      import { Undolog, undologTool, ToolDefinitionError, BudgetExceededError } from "@undolog/sdk";
      import { wrapTools, decisions } from "@undolog/sdk/ai";
      const t = undologTool({ name: "read", tier: "safe" }, async () => 42);
      let threw = false;
      try { undologTool({ name: "w", tier: "compensable" }, async () => 1); } catch (e) { threw = e instanceof ToolDefinitionError; }
      console.log(JSON.stringify([typeof Undolog, await t({}), threw, typeof wrapTools, typeof decisions,
        new BudgetExceededError("m").code]));
    `], app);
    assert.deepEqual(JSON.parse(out), ["function", 42, true, "function", "function", "budget"]);
    // The declarations resolve through the exports map, as a TypeScript user's editor reads them.
    writeFileSync(join(app, "use.ts"), `
      import { Undolog, undologTool, type WaitInfo } from "@undolog/sdk";
      const client: Undolog = new Undolog({ url: "http://127.0.0.1:1", apiKey: "k" });
      const send = undologTool({ name: "send", tier: "compensable", compensation: { fnName: "unsend" } },
        async ({ to }: { to: string }) => ({ id: to }));
      export async function main(): Promise<string> {
        const info: WaitInfo | undefined = undefined;
        void info;
        return await client.session({ agent: "a" }, async () => (await send({ to: "x" })).id);
      }
    `);
    sh(join(ROOT, "node_modules", ".bin", "tsc"), ["--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext",
      "--target", "es2022", "--typeRoots", join(ROOT, "node_modules", "@types"), "--types", "node", "use.ts"], app);
  });
});
