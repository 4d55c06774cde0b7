/**
 * What the tests share: the real server `test/server.py` started (its URL and tokens), fresh
 * agents made through the admin API, a reviewer deciding through the REST API as a person's
 * script would, and a real local compensation receiver that verifies signatures.
 */

import { createHmac, randomUUID, timingSafeEqual } from "node:crypto";
import { type IncomingMessage, type Server, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { Undolog, type UndologOptions } from "../src/index.js";

function need(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run the tests with test/server.py (make test-js)`);
  return value;
}

export const URL_ = need("UNDOLOG_TEST_URL");
export const ADMIN_TOKEN = need("UNDOLOG_TEST_ADMIN_TOKEN");
export const REVIEWER_TOKEN = need("UNDOLOG_TEST_REVIEWER_TOKEN");
export const WEBHOOK_SECRET = need("UNDOLOG_TEST_WEBHOOK_SECRET");

export interface Answer {
  status: number;
  body: Record<string, any>;
}

/** A person's request with a user Token (the admin's or the reviewer's). */
export async function api(token: string, method: string, path: string, body?: unknown): Promise<Answer> {
  const init: RequestInit = { method, headers: { Authorization: `Token ${token}`, "Content-Type": "application/json" } };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(`${URL_}${path}`, init);
  const text = await response.text();
  return { status: response.status, body: text ? JSON.parse(text) : {} };
}

export function uid(prefix = "t"): string {
  return `${prefix}-${randomUUID().slice(0, 8)}`;
}

export interface Agent {
  name: string;
  key: string;
  client: Undolog;
}

/** A fresh agent of the test org with a key of its own (budgets and counters start at zero). */
export async function newAgent(options: UndologOptions = {}): Promise<Agent> {
  const name = uid("agent");
  const made = await api(ADMIN_TOKEN, "POST", "/api/v1/agents", { name });
  if (made.status !== 201) throw new Error(`creating ${name}: ${made.status} ${JSON.stringify(made.body)}`);
  const issued = await api(ADMIN_TOKEN, "POST", `/api/v1/agents/${name}/keys`, { name: "tests" });
  if (issued.status !== 201) throw new Error(`issuing a key: ${issued.status} ${JSON.stringify(issued.body)}`);
  const key = String(issued.body["key"]);
  return { name, key, client: new Undolog({ url: URL_, apiKey: key, pollWait: 5, logger: null, ...options }) };
}

export async function setBudget(agent: string, limits: Record<string, unknown>): Promise<void> {
  const answer = await api(ADMIN_TOKEN, "PATCH", `/api/v1/agents/${agent}/budget`, limits);
  if (answer.status !== 200) throw new Error(`budget: ${answer.status} ${JSON.stringify(answer.body)}`);
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** A reviewer of the org deciding on the REST API. */
export const reviewer = {
  async pending(agent?: string): Promise<Record<string, any>[]> {
    const answer = await api(REVIEWER_TOKEN, "GET", "/api/v1/approvals?state=pending");
    const all = answer.body["approvals"] as Record<string, any>[];
    return agent ? all.filter((a) => a["agent"] === agent) : all;
  },

  /** The next pending request of `agent`, waiting for it to appear. */
  async next(agent: string, timeoutMs = 20_000): Promise<Record<string, any>> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const [first] = await this.pending(agent);
      if (first) return first;
      await sleep(50);
    }
    throw new Error(`no approval request of ${agent} within ${timeoutMs} ms`);
  },

  async decide(request: Record<string, any>, verb: "approve" | "reject", reason = ""): Promise<void> {
    const answer = await api(REVIEWER_TOKEN, "POST", `/api/v1/approvals/${request["id"]}/${verb}`, { reason });
    if (answer.status !== 200) throw new Error(`${verb}: ${answer.status} ${JSON.stringify(answer.body)}`);
  },

  /** Approve with the args edited first (edit before approving). */
  async approveEdited(request: Record<string, any>, args: Record<string, unknown>, reason = ""): Promise<void> {
    const answer = await api(REVIEWER_TOKEN, "POST", `/api/v1/approvals/${request["id"]}/approve`,
      { args, args_digest: request["args_digest"], reason });
    if (answer.status !== 200) throw new Error(`approve edited: ${answer.status} ${JSON.stringify(answer.body)}`);
  },

  /** Decide the next requests of `agent` in order, as they come (runs beside the agent). */
  async decideNext(agent: string, ...decisions: ["approve" | "reject", string][]): Promise<Record<string, any>[]> {
    const asked: Record<string, any>[] = [];
    for (const [verb, reason] of decisions) {
      const request = await this.next(agent);
      asked.push(request);
      await this.decide(request, verb, reason);
      // The next request appears only once the agent has moved on.
      const deadline = Date.now() + 20_000;
      while ((await this.pending(agent)).some((a) => a["id"] === request["id"]) && Date.now() < deadline) await sleep(50);
    }
    return asked;
  },
};

export interface Delivery {
  key: string;
  body: Record<string, any>;
  verified: boolean;
}

/** A real webhook receiver on 127.0.0.1: verifies `Undolog-Signature`, dedupes by
 * `Idempotency-Key`; `applied` lists each undo once, in the order it took effect. */
export class Receiver {
  readonly applied: Delivery[] = [];
  readonly requests: Delivery[] = [];
  private server: Server | undefined;
  private waiters: (() => void)[] = [];

  async start(): Promise<this> {
    this.server = createServer((request, response) => {
      void this.accept(request).then((status) => {
        response.writeHead(status, { "Content-Type": "application/json" });
        response.end("{}");
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(0, "127.0.0.1", resolve));
    return this;
  }

  get url(): string {
    return `http://127.0.0.1:${(this.server!.address() as AddressInfo).port}/undo`;
  }

  private async accept(request: IncomingMessage): Promise<number> {
    const chunks: Buffer[] = [];
    for await (const chunk of request) chunks.push(chunk as Buffer);
    const raw = Buffer.concat(chunks);
    const key = String(request.headers["idempotency-key"] ?? "");
    const delivery = { key, body: JSON.parse(raw.toString() || "{}"), verified: verify(String(request.headers["undolog-signature"] ?? ""), raw) };
    this.requests.push(delivery);
    if (!this.applied.some((d) => d.key === key)) this.applied.push(delivery);
    for (const wake of this.waiters.splice(0)) wake();
    return 200;
  }

  async waitFor(predicate: (r: Receiver) => boolean, timeoutMs = 30_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!predicate(this)) {
      if (Date.now() > deadline) throw new Error(`receiver: condition not met; saw ${JSON.stringify(this.applied)}`);
      await Promise.race([new Promise<void>((resolve) => this.waiters.push(resolve)), sleep(200)]);
    }
  }

  async close(): Promise<void> {
    await new Promise<void>((resolve) => this.server?.close(() => resolve()));
  }
}

function verify(header: string, raw: Buffer): boolean {
  const fields = Object.fromEntries(header.split(",").map((part) => part.split("=", 2) as [string, string]));
  if (!fields["t"] || !fields["v1"]) return false;
  const expected = createHmac("sha256", WEBHOOK_SECRET).update(`${fields["t"]}.`).update(raw).digest("hex");
  return expected.length === fields["v1"].length && timingSafeEqual(Buffer.from(expected), Buffer.from(fields["v1"]));
}
