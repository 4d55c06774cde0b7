/**
 * What both adapters share (the Python SDK's `integrations/_core.py`): declaring a framework's
 * tool, running one call of it through the current session with the SDK's own tier paths,
 * and the approval hand-off to a framework's own human-in-the-loop (intercept when the
 * framework asks whether the call needs approval, wait for undolog's reviewer in `decisions`).
 */

import { currentSession } from "./context.js";
import {
  ApprovalExpired,
  ApprovalRejected,
  ApprovalWaitTimeout,
  type Body,
  Refused,
  SessionAwaitingApproval,
  refusalAsToolResult,
} from "./errors.js";
import { sleep } from "./http.js";
import { type Outcome, type Session, decisionOf } from "./session.js";
import { ToolSpec, type ToolTier } from "./tiers.js";
import type { DeclaredTool, ToolArgs, ToolOptions } from "./tool.js";

/** What a caller may say about a framework's tool: a tier, or `undologTool`'s options (the
 * name is the framework's). */
export type Declaration = ToolTier | (Omit<ToolOptions, "name"> & { name?: string });

/** A `DeclaredTool` for a framework's tool, checked as `undologTool` checks: mistakes throw
 * `ToolDefinitionError` here, at wrapping time. */
export function declare(name: string, declaration: Declaration, description: string | undefined,
  parameters: string[] | undefined): DeclaredTool {
  const options = typeof declaration === "string" ? { tier: declaration } : declaration;
  if (!options || typeof options !== "object" || !("tier" in options)) {
    throw new TypeError(`${name}: a declaration is a tier or undologTool's options with a tier`);
  }
  const spec = new ToolSpec({ description, parameters, ...options, name: options.name ?? name });
  return { spec, idempotencyKey: options.idempotencyKey };
}

/** The argument names of a JSON schema or a zod object schema (undefined: not known). */
export function parameterNames(schema: unknown): string[] | undefined {
  const s = schema as Record<string, any> | undefined;
  const json = s?.["jsonSchema"] ?? s?.["parameters"] ?? s;
  const properties = json?.["properties"];
  if (properties && typeof properties === "object") return Object.keys(properties);
  const shape = s?.["shape"] ?? s?.["_def"]?.["shape"];
  if (shape && typeof shape === "object") return Object.keys(typeof shape === "function" ? shape() : shape);
  return undefined;
}

/** What the model reads before the output of a call a reviewer edited: without it the model
 * would take the output for the outcome of the args it proposed. */
export function editedNote(edited: Record<string, unknown>): string {
  return `Note: a reviewer edited this call's arguments before approving it; it ran with ${JSON.stringify(edited)}, `
    + "not with the arguments you proposed.";
}

/** The output with the edit's note in front (a string gets it as a first line, an object as `note`). */
export function noted(outcome: Outcome): unknown {
  const { result, edited } = outcome;
  if (!edited) return result;
  const note = editedNote(edited);
  if (typeof result === "string") return `${note}\n${result}`;
  if (result && typeof result === "object" && !Array.isArray(result)) return { note, ...result };
  return { note, output: result };
}

/** One call of a framework's tool in the current session (outside one: `run(args)`);
 * refusals come back as the text the model reads. */
export async function callTool(declared: DeclaredTool, args: ToolArgs, run: (args: ToolArgs) => Promise<unknown>,
  signal?: AbortSignal): Promise<unknown> {
  const session = currentSession();
  if (session === undefined) return await run(args);
  if (declared.spec.tier === "safe") {
    if (!declared.spec.untrusted) {
      session._recordSafe(declared.spec.name, args);
      return await run(args);
    }
    const step = session._nextStep();
    const output = await run(args);
    session._recordSafe(declared.spec.name, args, step, output);
    return output;
  }
  try {
    return noted(await session._callTool(declared, args, run, { signal }));
  } catch (error) {
    if (error instanceof Refused) return refusalAsToolResult(error);
    throw error;
  }
}

// -- the framework's own approval flow ----------------------------------------------------

interface Held {
  session: Session;
  effect?: Body;
  /** Another call of the turn waits for a reviewer: this one is asked for when it runs. */
  deferred?: boolean;
}

/** What the server answered for a call, by the framework's call id, between the framework's
 * approval question (which intercepts it) and `decisions` or the tool's execution. */
const HELD = new Map<string, Held>();
const REFUSED = new Map<string, Refused>();
/** Calls `decisions` answered approved: a framework that asks again when it resumes (the AI
 * SDK checks that an approved call still needs approval) hears yes until the call runs. */
const APPROVED = new Set<string>();

/** The framework asks whether a call needs approval: intercept it now. True while undolog
 * holds it for a reviewer (the framework then stops the run for its human-in-the-loop). */
export async function needsApproval(declared: DeclaredTool, args: ToolArgs, callId: string | undefined): Promise<boolean> {
  const session = currentSession();
  if (session === undefined || declared.spec.tier !== "irreversible" || !callId) return false;
  if (APPROVED.has(callId)) return true;
  let answer: Body;
  try {
    answer = await session._intercept(declared, args);
  } catch (error) {
    if (error instanceof Refused) {
      REFUSED.set(callId, error); // the execution answers the refusal, nothing runs
      return false;
    }
    if (error instanceof SessionAwaitingApproval) {
      HELD.set(callId, { session, deferred: true });
      return true;
    }
    throw error;
  }
  const effect = (answer["effect"] ?? {}) as Body;
  if (effect["state"] !== "pending") return false; // approved by a grant, or replayed: the execution runs or answers it
  HELD.set(callId, { session, effect });
  return true;
}

/** A refusal met when the framework asked (the execution answers it to the model). */
export function takeRefusal(callId: string | undefined): Refused | undefined {
  if (!callId) return undefined;
  const refused = REFUSED.get(callId);
  REFUSED.delete(callId);
  HELD.delete(callId);
  APPROVED.delete(callId);
  return refused;
}

export interface Decision {
  approved: boolean;
  /** For a denial: what the model reads (`DENIED: <reason>`). */
  message?: string;
}

export interface DecisionOptions {
  /** Seconds to wait for each decision (default: until the server decides or expires it). */
  timeout?: number;
  signal?: AbortSignal;
}

/** Undolog's reviewer's decision of a call the framework stopped on; undefined when the call
 * is not one undolog holds (another approval of the app's own: left to the app). */
export async function decisionOf_(callId: string, options: DecisionOptions = {}): Promise<Decision | undefined> {
  const held = HELD.get(callId);
  if (!held) return undefined;
  HELD.delete(callId);
  if (held.deferred) {
    APPROVED.add(callId);
    return { approved: true }; // undolog still gates the call when it runs
  }
  const effect = await awaitDecision(held.session, String(held.effect?.["id"]), options);
  if (effect["state"] === "rejected") {
    const { reason, reviewer } = decisionOf({}, effect);
    held.session.state = "halted";
    return { approved: false, message: refusalAsToolResult(new ApprovalRejected("", { reason, reviewer, body: { effect } })) };
  }
  if (effect["state"] === "expired") {
    held.session.state = "halted";
    return { approved: false, message: refusalAsToolResult(new ApprovalExpired()) };
  }
  APPROVED.add(callId);
  return { approved: true }; // approved (or run by a server-side executor): the execution replays it
}

/** The effect once a reviewer decided it (not pending any more), waiting by long poll. */
export async function awaitDecision(session: Session, effectId: string, options: DecisionOptions = {}): Promise<Body> {
  const http = session._http;
  const signal = options.signal ?? session.signal;
  // A plain read first: the server long-polls an approved effect too (until it runs).
  let effect = ((await http.send({ method: "GET", path: `/api/v1/effects/${effectId}`, signal }))["effect"] ?? {}) as Body;
  const started = Date.now();
  while (effect["state"] === "pending") {
    let wait = session.pollWait;
    if (options.timeout !== undefined) {
      const remaining = options.timeout - (Date.now() - started) / 1000;
      if (remaining <= 0) {
        throw new ApprovalWaitTimeout(`effect ${effectId}: no decision after ${options.timeout}s`, { effectId });
      }
      wait = Math.min(wait, remaining);
    }
    const before = Date.now();
    const answer = await http.send({ method: "GET", path: `/api/v1/effects/${effectId}`,
      params: { wait: Math.min(60, Math.max(1, Math.floor(wait))) }, timeoutS: wait + 15, signal });
    effect = (answer["effect"] ?? {}) as Body;
    if (effect["state"] === "pending" && Date.now() - before < 1000) await sleep(1000, signal);
  }
  return effect;
}

/** The final value of a tool's answer: a streaming tool's (AsyncIterable) last preliminary result. */
export async function settled(value: unknown): Promise<unknown> {
  if (value && typeof value === "object" && Symbol.asyncIterator in value) {
    let last: unknown;
    for await (const item of value as AsyncIterable<unknown>) last = item;
    return last;
  }
  return await value;
}
