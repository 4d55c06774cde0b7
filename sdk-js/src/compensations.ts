/**
 * Agent-side compensations: run the undo of a rolled-back run where the credentials are (the
 * Python SDK's `undolog.compensations`).
 *
 * A compensation registered with handler `"agent"` is not run by the server's worker. When the
 * walk reaches its undo entry, the entry waits for this side to claim it
 * (`POST /api/v1/undo-entries/claim`), run it, and report how it went
 * (`POST /api/v1/undo-entries/{id}/report`). The server keeps the lease, the attempts, the
 * backoff and the escalation, exactly as for a webhook: a handler that throws is retried, one
 * that throws `PermanentCompensationError` goes to a person at once, and a claimer that dies
 * mid-attempt loses nothing (its lease runs out and the entry is claimed again).
 *
 * A handler must treat "nothing to undo" as success: the same entry may run again after a
 * lost lease (`context.idempotencyKey` is the entry id, the same on every attempt).
 */

import { type Body, UndologError, describe } from "./errors.js";
import { type Http, sleep } from "./http.js";

/** Thrown by a handler that cannot succeed by trying again: a person takes over at once. */
export class PermanentCompensationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "PermanentCompensationError";
  }
}

export interface CompensationContext {
  idempotencyKey: string;
  attempt: number;
  fnName: string;
  fnVersion: string;
  session: unknown;
  effect: unknown;
  leaseExpiresAt: string;
  /** A pre-image tool's entry: what was there before the call, the call's args, the digests
   * of the compare-and-restore (preimages.ts). Undefined for other entries. */
  preImage?: unknown;
  /** Aborted when `serveCompensations`' signal is. */
  signal: AbortSignal | undefined;
}

export type CompensationHandler = (args: Record<string, unknown>, context: CompensationContext) => unknown;

export interface ServeOptions {
  /** Stop serving (after the entry in hand is reported). */
  signal?: AbortSignal;
  /** Seconds between claims when there was nothing to do. */
  pollS?: number;
  /** Seconds an entry is ours before another claimer may take it. */
  leaseS?: number;
  batch?: number;
  /** One round of claims, then return. */
  once?: boolean;
  /** The scopes its functions were registered with: only their entries are claimed. Without
   * it, only entries of functions registered with no scope (never a gateway's). */
  scopes?: string[];
}

interface Entry {
  id: string;
  attempt: number;
  fn_name: string;
  fn_version: string;
  args: Record<string, unknown>;
  session?: unknown;
  effect?: unknown;
  lease_expires_at: string;
  pre_image?: unknown;
}

export async function claim(http: Http, limit = 10, leaseS = 30, scopes?: string[]): Promise<Entry[]> {
  const body: Body = { max: limit, lease_s: leaseS };
  if (scopes !== undefined) body["scopes"] = scopes;
  const answer = await http.send({ method: "POST", path: "/api/v1/undo-entries/claim", body });
  return (answer["entries"] ?? []) as Entry[];
}

export async function report(http: Http, entry: Entry, ok: boolean, error = "", permanent = false): Promise<Body> {
  const body: Body = { ok, attempt: entry.attempt };
  if (!ok) Object.assign(body, { error: error.slice(0, 10_000) || "failed", permanent });
  return await http.send({ method: "POST", path: `/api/v1/undo-entries/${entry.id}/report`, body });
}

/** Run one claimed entry and report it; true when it succeeded. */
export async function runOne(http: Http, entry: Entry, handlers: Record<string, CompensationHandler>,
  signal?: AbortSignal): Promise<boolean> {
  const handler = Object.hasOwn(handlers, entry.fn_name) ? handlers[entry.fn_name] : undefined;
  let ok = true;
  let text = "";
  let permanent = false;
  try {
    if (!handler) throw new PermanentCompensationError(`no handler for ${entry.fn_name} in this process`);
    await handler({ ...entry.args }, {
      idempotencyKey: entry.id, attempt: entry.attempt, fnName: entry.fn_name, fnVersion: entry.fn_version,
      session: entry.session, effect: entry.effect, leaseExpiresAt: entry.lease_expires_at, signal,
      preImage: entry.pre_image,
    });
  } catch (error) {
    ok = false;
    text = describe(error);
    permanent = error instanceof PermanentCompensationError;
  }
  try {
    await report(http, entry, ok, text, permanent);
  } catch (error) {
    if (error instanceof UndologError) return false; // our lease ran out and another claimer took over
    throw error;
  }
  return ok;
}

/** Claim and run entries until `signal` aborts (or one round, with `once`); how many ran.
 * Only functions named in `handlers` should be registered with this agent: an entry this
 * process cannot run is reported as a permanent failure, so a person sees it. */
export async function serve(http: Http, handlers: Record<string, CompensationHandler>,
  options: ServeOptions = {}): Promise<number> {
  const { signal, pollS = 1, leaseS = 30, batch = 10, once = false, scopes } = options;
  let ran = 0;
  while (!signal?.aborted) {
    let entries: Entry[] = [];
    try {
      entries = await claim(http, batch, leaseS, scopes);
    } catch (error) {
      if (!(error instanceof UndologError)) throw error; // the server is away for a moment: try again
    }
    for (const entry of entries) {
      await runOne(http, entry, handlers, signal);
      ran++;
    }
    if (once) return ran;
    if (!entries.length) {
      try {
        await sleep(pollS * 1000, signal);
      } catch {
        break; // aborted: stop serving
      }
    }
  }
  return ran;
}
