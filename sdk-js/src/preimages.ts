/**
 * Pre-images: undo for tools that have no undo (the Python SDK's `undolog.preimages`, issue 42).
 *
 * A compensable tool may declare a *before* read instead of an inverse:
 *
 *     const updateRecord = undologTool({
 *       name: "update_record", tier: "compensable",
 *       before: ({ id }) => records.get(id) ?? ABSENT,      // what is there, or ABSENT
 *       restore: ({ id }, before) => records.set(id, before), // put it back
 *       restoreAbsent: ({ id }) => records.delete(id),        // remove what the call created
 *       after: ({ fields }, before) => ({ ...before, ...fields }), // what the call leaves
 *     }, async ({ id, fields }) => ...);
 *
 * The before read runs after the server admits the call and before the call runs; what it
 * finds is kept on the server, sealed, with the call's undo entry (a pre-image over
 * `maxBytes` holds the call for a person, or refuses it: `overBound`). A rollback runs the
 * restore here, from `client.serveCompensations(preImageHandlers(updateRecord))`, as a
 * compare-and-restore: only over what this run wrote; a target someone changed since goes to a
 * person with the digests of what this run wrote and of what is there now.
 *
 * A target's state is one JSON value (`null` when absent); its digest is `sha256:` and the
 * SHA-256 of its canonical JSON (sorted keys, no spaces, UTF-8), as in the server and the
 * Python SDK (numbers: integers agree; a float like `1.0` is written `1` here).
 */

import { PermanentCompensationError, type CompensationContext, type CompensationHandler } from "./compensations.js";
import type { ToolArgs } from "./tiers.js";

/** What a before read returns when nothing is there (a record not created yet). */
export const ABSENT: unique symbol = Symbol.for("undolog.absent");
export type Absent = typeof ABSENT;

export const DEFAULT_MAX_BYTES = 256 * 1024;
/** Beyond it a pre-image is not sent (the server's body limit is 1 MiB): the call is refused. */
export const SEND_MAX_BYTES = 900 * 1024;

/** A tool's before read and restore (`undologTool`'s `before`, `restore`... options). */
export interface PreImageOptions<A extends ToolArgs = ToolArgs> {
  before: (args: A) => unknown;
  restore?: (args: A, before: any) => unknown;
  restoreAbsent?: (args: A) => unknown;
  /** What the restore compares (default `before`). */
  check?: (args: A) => unknown;
  /** What the call leaves, from its args (default: read it again after the call). */
  after?: (args: A, before: any) => unknown;
  maxBytes?: number;
  overBound?: "hold" | "refuse";
}

/** The runtime the session and the restore use. */
export interface PreImage {
  readonly options: PreImageOptions<any>;
  readonly declaration: Record<string, unknown>;
  readonly maxBytes: number;
  readonly overBound: "hold" | "refuse";
}

/** Thrown when the before read failed: the call was not run (never without its undo). */
export class PreImageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "PreImageError";
  }
}

export function preImageOf(name: string, options: PreImageOptions<any>): PreImage {
  const maxBytes = options.maxBytes ?? DEFAULT_MAX_BYTES;
  const overBound = options.overBound ?? "hold";
  if (overBound !== "hold" && overBound !== "refuse") throw new TypeError(`${name}: overBound is "hold" or "refuse"`);
  if (!options.restore && !options.restoreAbsent) throw new TypeError(`${name}: a before read needs a restore (or restoreAbsent)`);
  const fn = (f: unknown) => ({ fn: (f as { name?: string }).name || "anonymous" });
  const declaration: Record<string, unknown> = { before: fn(options.before), max_bytes: maxBytes, over_bound: overBound };
  if (options.restore) declaration["restore"] = fn(options.restore);
  if (options.restoreAbsent) declaration["restore_absent"] = fn(options.restoreAbsent);
  if (options.check) declaration["check"] = fn(options.check);
  if (options.after) declaration["after"] = fn(options.after);
  return { options, declaration, maxBytes, overBound };
}

/** The agent-handler compensation a pre-image tool registers. */
export function preImageFunctionName(toolName: string): string {
  return `preimage.${toolName}`.slice(0, 100);
}

function sortKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value && typeof value === "object") {
    return Object.fromEntries(Object.keys(value).sort().map((key) => [key, sortKeys((value as Record<string, unknown>)[key])]));
  }
  return value;
}

export function canonical(value: unknown): string {
  return JSON.stringify(sortKeys(value === ABSENT || value === undefined ? null : value));
}

export async function digest(state: unknown): Promise<string> {
  const bytes = new TextEncoder().encode(canonical(state));
  const hash = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return "sha256:" + [...hash].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** What `POST /effects/{id}/pre-image` is sent. */
export async function preImageBody(pre: PreImage, args: ToolArgs, state: unknown): Promise<Record<string, unknown>> {
  const absent = state === ABSENT;
  const value = absent ? null : state;
  const size = new TextEncoder().encode(canonical(value)).length;
  if (size > SEND_MAX_BYTES || (size > pre.maxBytes && pre.overBound === "refuse")) return { size, over_bound: true };
  const body: Record<string, unknown> = { value, absent };
  if (pre.options.after) body["after_digest"] = await digest(await pre.options.after(args, value));
  return body;
}

/** A claimed entry's pre-image, as the server hands it over. */
export interface KeptPreImage {
  value?: unknown;
  absent?: boolean;
  before_digest?: string;
  after_digest?: string | null;
  dropped?: boolean;
  call_args?: ToolArgs;
}

/** The compare-and-restore of one claimed entry: what it did, or a PermanentCompensationError
 * when a person must decide (see the module's comment and the Python SDK's). */
export async function compareAndRestore(pre: PreImage, kept: KeptPreImage | undefined | null): Promise<string> {
  if (!kept) return "nothing kept: the call never ran";
  if (kept.dropped) {
    throw new PermanentCompensationError(
      `the pre-image was dropped (the run's undo window passed); restore it by hand (before: ${kept.before_digest})`);
  }
  const args = kept.call_args ?? {};
  const read = pre.options.check ?? pre.options.before;
  const now = await digest(await read(args));
  const before = kept.before_digest;
  const written = kept.after_digest;
  if (!(written && now === written)) {
    if (now === before) return "already as it was before the call";
    if (written) {
      throw new PermanentCompensationError(`changed since this run wrote it, not overwritten: this run wrote ${written}, `
        + `it is now ${now} (before the run: ${before}); a person decides`);
    }
    // No after-image: the call's outcome is unknown (a crash); it is put back as it was.
  }
  if (kept.absent) {
    if (pre.options.restoreAbsent) await pre.options.restoreAbsent(args);
    return "removed what the call created";
  }
  if (!pre.options.restore) return "nothing to restore: it was there before";
  await pre.options.restore(args, kept.value);
  return "restored";
}

/** `serveCompensations` handlers for tools declared with `before`: each one's compare-and-restore. */
export function preImageHandlers(...tools: { spec: { name: string }; preImage?: PreImage }[]): Record<string, CompensationHandler> {
  const handlers: Record<string, CompensationHandler> = {};
  for (const tool of tools) {
    if (!tool.preImage) throw new TypeError(`${tool.spec.name} is not an undologTool with before`);
    const pre = tool.preImage;
    handlers[preImageFunctionName(tool.spec.name)] = async (_args: Record<string, unknown>, context: CompensationContext) =>
      await compareAndRestore(pre, context.preImage as KeptPreImage | undefined);
  }
  return handlers;
}
