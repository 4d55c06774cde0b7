/**
 * HTTP to the undolog server over the platform's `fetch` (Node ≥ 20, Deno, Bun, browsers,
 * edge runtimes): one request description, one sender, the error mapping.
 */

import { type Body, UndologConnectionError, UndologError, errorFromResponse } from "./errors.js";

export const DEFAULT_URL = "http://127.0.0.1:8000";
export const VERSION = "0.1.0";

/** One API request. `timeoutS` overrides the client's (long polls need more). */
export interface Call {
  method: "GET" | "POST" | "PATCH" | "DELETE";
  path: string;
  body?: unknown;
  params?: Record<string, string | number>;
  timeoutS?: number;
  signal?: AbortSignal | undefined;
}

export type FetchLike = (input: string, init: RequestInit) => Promise<Response>;

export interface HttpOptions {
  url?: string | undefined;
  apiKey?: string | undefined;
  timeoutS?: number | undefined;
  fetch?: FetchLike | undefined;
}

/** The environment variable `name` where there is a process environment (Node, Bun, Deno's compat). */
export function env(name: string): string | undefined {
  const proc = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  return proc?.env?.[name] || undefined;
}

export class Http {
  readonly baseUrl: string;
  private readonly headers: Record<string, string>;
  private readonly timeoutS: number;
  private readonly fetch: FetchLike;

  constructor(options: HttpOptions) {
    this.baseUrl = (options.url || env("UNDOLOG_URL") || DEFAULT_URL).replace(/\/+$/, "");
    const key = options.apiKey || env("UNDOLOG_API_KEY");
    if (!key) throw new TypeError("no API key: pass apiKey or set UNDOLOG_API_KEY");
    this.headers = {
      Authorization: `Bearer ${key}`,
      "Content-Type": "application/json",
      Accept: "application/json",
      "User-Agent": `undolog-js/${VERSION}`,
    };
    this.timeoutS = options.timeoutS ?? 10;
    this.fetch = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
  }

  async send(call: Call): Promise<Body> {
    let url = this.baseUrl + call.path;
    if (call.params) {
      const query = new URLSearchParams(Object.entries(call.params).map(([k, v]) => [k, String(v)]));
      url += `?${query}`;
    }
    const timeout = AbortSignal.timeout(1000 * (call.timeoutS ?? this.timeoutS));
    const signal = call.signal ? AbortSignal.any([call.signal, timeout]) : timeout;
    const init: RequestInit = { method: call.method, headers: this.headers, signal };
    if (call.body !== undefined) init.body = dumps(call.body);
    let response: Response;
    let text: string;
    try {
      response = await this.fetch(url, init);
      text = await response.text();
    } catch (error) {
      // The caller's own abort is theirs to see as such; anything else is the network.
      if (call.signal?.aborted) throw call.signal.reason;
      throw new UndologConnectionError(`cannot reach undolog at ${url}: ${String(error)}`, { cause: error });
    }
    return parse(response.status, text);
  }
}

/** A 2xx answer's JSON object, or the mapped error for anything else. */
export function parse(status: number, text: string): Body {
  let body: unknown = {};
  if (text) {
    try {
      body = JSON.parse(text);
    } catch {
      body = undefined;
    }
  }
  const ok = status >= 200 && status < 300;
  if (ok && body && typeof body === "object" && !Array.isArray(body)) return body as Body;
  if (ok) {
    throw new UndologError(`expected a JSON object, got ${JSON.stringify(text.slice(0, 200))}`,
      { code: "bad_response", status });
  }
  throw errorFromResponse(status, body, text);
}

/** JSON with the usual non-JSON values made JSON: bigint, Map, Set (Dates use their toJSON). */
export function dumps(value: unknown): string {
  return JSON.stringify(value, (_key, item: unknown) => {
    if (typeof item === "bigint") return item.toString();
    if (item instanceof Map) return Object.fromEntries(item);
    if (item instanceof Set) return [...item];
    return item;
  });
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/** The `result` object to commit. The contract wants an object, so anything else (and an
 * object that is exactly `{value}`, to stay unambiguous) is wrapped as `{value}`. */
export function wrapResult(value: unknown): Record<string, unknown> {
  if (isPlainObject(value) && !isValueBox(value)) return value;
  return { value: value === undefined ? null : value };
}

/** Inverse of `wrapResult` for a replayed effect's stored result. */
export function unwrapResult(stored: unknown): unknown {
  return isPlainObject(stored) && isValueBox(stored) ? stored["value"] : stored;
}

function isValueBox(value: Record<string, unknown>): boolean {
  const keys = Object.keys(value);
  return keys.length === 1 && keys[0] === "value";
}

/** `ms` milliseconds, or the signal's reason as soon as it aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
