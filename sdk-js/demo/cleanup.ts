/**
 * The account cleanup of the reference guide (irreversible-cap-guide.txt) with an AI SDK agent:
 * `generateText` with tools, driven by the AI SDK's own mock model (no API key), its tools
 * tiered by @undolog/sdk/ai, against a real undolog server (`make demo-js`).
 *
 * 1. A cap of 2 irreversible calls per run: two accounts deleted, the third refused; the
 *    model reads the budget's message as the tool's result.
 * 2. A reviewer (alice, through the API) approves one deletion and denies the next.
 * 3. Compensable notices, then a failed export: the run fails and the notices are recalled,
 *    newest first, by the webhook this demo serves.
 */

import { createHmac } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { generateText, stepCountIs, tool } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { z } from "zod";
import { type Session, Undolog, type WaitInfo } from "../src/index.js";
import { wrapTools } from "../src/ai.js";

const env = (name: string): string => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run the demo with make demo-js`);
  return value;
};
const URL_ = env("UNDOLOG_DEMO_URL");
const say = (line = ""): void => console.log(line);
const heading = (title: string): void => say(`\n── ${title} ${"─".repeat(Math.max(0, 76 - title.length))}`);

async function person(token: string, method: string, path: string, body?: unknown): Promise<any> {
  // X-Undolog-Org: on a server of `make run` the admin belongs to the tour's org `demo` too.
  const response = await fetch(`${URL_}${path}`, { method, headers: { Authorization: `Token ${token}`,
    "X-Undolog-Org": env("UNDOLOG_DEMO_ORG"), "Content-Type": "application/json" },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }) });
  const text = await response.text();
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text}`);
  return text ? JSON.parse(text) : {};
}
const admin = (method: string, path: string, body?: unknown) => person(env("UNDOLOG_DEMO_ADMIN_TOKEN"), method, path, body);
const alice = (method: string, path: string, body?: unknown) => person(env("UNDOLOG_DEMO_REVIEWER_TOKEN"), method, path, body);

// -- the world the tools change ---------------------------------------------------------------

const FRESH: Record<string, { owner: string; inactive: boolean }> = {
  "acct-101": { owner: "ana@example.com", inactive: true },
  "acct-102": { owner: "ben@example.com", inactive: true },
  "acct-103": { owner: "cho@example.com", inactive: true },
  "acct-200": { owner: "dee@example.com", inactive: false },
  "acct-201": { owner: "eli@example.com", inactive: false },
};
let accounts = structuredClone(FRESH);
const outbox = new Map<string, string>();
const recalled: string[] = [];

const tools = {
  list_inactive_accounts: tool({ description: "The inactive accounts", inputSchema: z.object({}),
    execute: async () => Object.keys(accounts).filter((id) => accounts[id]!.inactive) }),
  delete_account: tool({ description: "Delete an account and its data", inputSchema: z.object({ account_id: z.string() }),
    execute: async ({ account_id }) => {
      delete accounts[account_id];
      return `deleted ${account_id}`;
    } }),
  notify_owner: tool({ description: "An in-app notice to the account's owner",
    inputSchema: z.object({ account_id: z.string(), message: z.string() }),
    execute: async ({ account_id, message }) => {
      outbox.set(account_id, message);
      return { notice: account_id };
    } }),
  export_account: tool({ description: "Export an account's data", inputSchema: z.object({ account_id: z.string() }),
    execute: async (): Promise<string> => {
      throw new Error("ExportServiceDown: the export service answers 503");
    } }),
};

/** The recall_notice webhook: verifies the signature, withdraws the notice (once per entry). */
async function serveRecalls(): Promise<{ url: string; close: () => void }> {
  const seen = new Set<string>();
  const server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on("data", (c: Buffer) => chunks.push(c));
    request.on("end", () => {
      const raw = Buffer.concat(chunks);
      const header = String(request.headers["undolog-signature"] ?? "");
      const fields = Object.fromEntries(header.split(",").map((p) => p.split("=", 2)));
      const expected = createHmac("sha256", env("UNDOLOG_DEMO_WEBHOOK_SECRET")).update(`${fields["t"]}.`).update(raw).digest("hex");
      if (expected !== fields["v1"]) {
        response.writeHead(401).end();
        return;
      }
      const key = String(request.headers["idempotency-key"]);
      const { args } = JSON.parse(raw.toString()) as { args: { account_id: string } };
      if (!seen.has(key)) {
        seen.add(key);
        outbox.delete(args.account_id);
        recalled.push(args.account_id);
        say(`  recall_notice webhook: notice to ${args.account_id} withdrawn (signature verified)`);
      }
      response.writeHead(200, { "Content-Type": "application/json" }).end("{}");
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/recall`, close: () => server.close() };
}

// -- the model ---------------------------------------------------------------------------------

type Step = [string, Record<string, unknown>][] | string;

/** The AI SDK's mock model playing a script; it prints what it reads of each tool result. */
function scripted(steps: Step[]): MockLanguageModelV3 {
  let n = 0;
  const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };
  return new MockLanguageModelV3({
    doGenerate: async ({ prompt }) => {
      const last = prompt.at(-1);
      if (last?.role === "tool") {
        for (const part of last.content) {
          if (part.type !== "tool-result") continue;
          const output = part.output as { type: string; value?: unknown; reason?: string };
          say(`  the model reads ${part.toolName}: ${JSON.stringify(output.value ?? output.reason)}`);
        }
      }
      const step = steps[n++] ?? "done";
      if (typeof step === "string") {
        return { content: [{ type: "text", text: step }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] };
      }
      return { content: step.map(([toolName, input], i) => ({ type: "tool-call" as const, toolCallId: `c${n}-${i}`, toolName,
        input: JSON.stringify(input) })), finishReason: { unified: "tool-calls", raw: "tool_calls" }, usage, warnings: [] };
    },
  });
}

const DELETE_ALL: [string, Record<string, unknown>][] = ["acct-101", "acct-102", "acct-103"].map((id) => ["delete_account", { account_id: id }]);

// -- the story ---------------------------------------------------------------------------------

async function main(): Promise<void> {
  const waited = new Set<string>();
  const client = new Undolog({ url: URL_, apiKey: env("UNDOLOG_DEMO_KEY"), pollWait: 5, approvalTimeout: 60, logger: null,
    onWait: (info: WaitInfo) => {
      if (info.state === "pending" && !waited.has(info.effectId)) {
        waited.add(info.effectId);
        say(`  undolog: ${info.tool} waits for a decision (long poll)`);
      }
    } });
  const recalls = await serveRecalls();
  say(`undolog demo (TypeScript, AI SDK): the account cleanup, on ${process.env["UNDOLOG_DEMO_WHERE"]} at ${URL_}`);
  say("  org cleanup-demo · agent cleanup · admin sets budgets · reviewer alice decides");
  const budget = await client.getBudget("cleanup");
  if (budget["state"] !== "active") await admin("POST", "/api/v1/agents/cleanup/resume", { note: "the demo starts over" });
  await admin("PATCH", "/api/v1/agents/cleanup/budget", { max_irreversible_per_run: 2, on_exceeded: "pause", mode: "enforce" });
  say('  PATCH /api/v1/agents/cleanup/budget {"max_irreversible_per_run":2,"on_exceeded":"pause"}');
  await client.registerCompensation({ fnName: "recall_notice", handler: "webhook", target: recalls.url });
  const tiers = (deadline?: { timeoutS: number; autoApproveOnTimeout: boolean }) => ({
    list_inactive_accounts: { tier: "safe", costWeight: 0.01 },
    delete_account: { tier: "irreversible", costWeight: 5,
      approval: { reason: "Deletes an account and its data for good", riskTags: ["data-loss"],
        estimatedImpact: "account {account_id} and its data", ...deadline } },
    notify_owner: { tier: "compensable", compensation: { fnName: "recall_notice", args: { account_id: "{account_id}" },
      maxRetries: 3, retryBackoffMs: 200 } },
    export_account: { tier: "safe", costWeight: 0.01 },
  } as const);
  const runs: Session[] = [];
  const play = async (steps: Step[], tiered: ReturnType<typeof wrapTools<typeof tools>>) =>
    await client.session({ agent: "cleanup" }, async (run) => {
      runs.push(run);
      const result = await generateText({ model: scripted(steps), tools: tiered, stopWhen: stepCountIs(8),
        prompt: "Clean up the inactive accounts." });
      const failed = result.steps.flatMap((s) => s.content).find((p) => p.type === "tool-error");
      if (failed) throw new Error(String((failed as { error: unknown }).error)); // the app decides the run failed
      say(`  the model's answer: ${result.text}`);
      return result;
    });

  heading("1. A cap of 2 irreversible calls per run");
  say("Nobody watches this run: delete_account auto-approves when its 1 s deadline passes, so the\nbudget is the only guard.");
  const unattended = wrapTools(tools, tiers({ timeoutS: 1, autoApproveOnTimeout: true }));
  await client.register(...Object.values(unattended));
  await play([[["list_inactive_accounts", {}]], DELETE_ALL, "Deleted acct-101 and acct-102; the budget refused acct-103."], unattended);
  say(`  accounts left: ${Object.keys(accounts).join(", ")}`);
  say(`  agent cleanup: ${(await client.getBudget("cleanup"))["state"]} (on_exceeded: pause)`);
  await admin("POST", "/api/v1/agents/cleanup/resume", { note: "run reviewed" });
  say("  POST /api/v1/agents/cleanup/resume -> active");

  heading("2. A reviewer in front of every deletion, inside the same cap");
  accounts = structuredClone(FRESH);
  say("  (accounts reset) alice approves the first deletion and denies the second, through the reviewer API.");
  const reviewed = wrapTools(tools, tiers());
  await client.register(...Object.values(reviewed));
  const decide = (async () => {
    for (const [verb, reason] of [["approve", "inactive for a year"], ["reject", "acct-102 has an open invoice"]] as const) {
      for (;;) {
        const pending = (await alice("GET", "/api/v1/approvals?state=pending"))["approvals"]
          .filter((a: any) => a["agent"] === "cleanup" && a["session"] === runs.at(-1)?.id);
        if (pending.length) {
          say(`  alice: ${verb} ${pending[0]["tool"]} ${JSON.stringify(pending[0]["proposed_args"])}${verb === "reject" ? ` (${reason})` : ""}`);
          await alice("POST", `/api/v1/approvals/${pending[0]["id"]}/${verb}`, { reason });
          break;
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  })();
  await play([[["list_inactive_accounts", {}]], DELETE_ALL, "acct-101 deleted; acct-102 denied by the reviewer."], reviewed);
  await decide;
  say(`  run: ${runs.at(-1)?.state} (a denial halts it: acct-103 never reached the reviewer)`);
  say(`  accounts left: ${Object.keys(accounts).join(", ")}`);

  heading("3. Undo: compensable notices, recalled when the run fails");
  say("The agent notices the owners still inactive (notify_owner, COMPENSABLE), then exports their\ndata; the export service is down and the app fails the run.");
  const left = ["acct-102", "acct-103"].filter((id) => id in accounts);
  await play([[["list_inactive_accounts", {}]],
    left.map((id) => ["notify_owner", { account_id: id, message: "Your account will be deleted in 30 days." }]),
    [["export_account", { account_id: left[0]! }]], "never reached"], reviewed).catch((error: Error) => {
    say(`  the run failed: ${error.message}`);
  });
  const failed = runs.at(-1)!;
  const outcome = await failed.waitCompensated({ timeout: 60 });
  say(`  waitCompensated() -> ${outcome["state"]}`);
  for (const entry of outcome["undo_stack"] as Record<string, any>[]) {
    say(`  undo stack: step ${entry["step_index"]} ${entry["fn_name"]}(${JSON.stringify(entry["args"])}) ${entry["state"]}`);
  }
  say(`  recalled, in order: ${recalled.join(", ")} (newest first) · outbox: ${[...outbox.keys()].join(", ") || "empty"}`);

  heading("What is left");
  say(`accounts: ${Object.keys(accounts).join(", ")}`);
  say(`runs: ${runs.map((r) => `${r.id?.slice(0, 8)} ${r.state}`).join(" · ")}`);
  recalls.close();
}

await main();
