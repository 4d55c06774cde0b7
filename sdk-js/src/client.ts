/**
 * `Undolog`: the agent's connection to an undolog server (the Python SDK's `UndoLogClient`).
 */

import { type Body } from "./errors.js";
import { type CompensationHandler, type ServeOptions, serve } from "./compensations.js";
import { type FetchLike, Http, env } from "./http.js";
import { type Logger, SCOPE, Session, type SessionOptions, type WaitInfo } from "./session.js";
import { type DeclaredTool, specOf } from "./tool.js";
import type { ToolSpec } from "./tiers.js";

export interface UndologOptions {
  /** Default `$UNDOLOG_URL`, else http://127.0.0.1:8000. */
  url?: string;
  /** Default `$UNDOLOG_API_KEY`. */
  apiKey?: string;
  /** Seconds per request (long polls get their own). */
  timeout?: number;
  /** Another fetch (a proxy's, a counting one in tests); default the platform's. */
  fetch?: FetchLike;
  /** Defaults of the sessions this client opens. */
  approvalTimeout?: number;
  pollWait?: number;
  onWait?: (info: WaitInfo) => void;
  /** Where rollbacks and close failures are said (default: console.warn); `null`: nowhere. */
  logger?: Logger | null;
}

export interface CompensationRegistration {
  fnName: string;
  fnVersion?: string;
  /** `webhook` (target: a URL), `python` (a dotted path the worker imports) or `agent`
   * (no target: run by this side with `serveCompensations`). */
  handler: "webhook" | "python" | "agent";
  target?: string;
  timeoutMs?: number;
  /** `agent`: how long an entry waits for a claimer. */
  claimTimeoutS?: number;
  /** `agent`: the system it undoes (e.g. "tickets-eu"); its entries are then claimed only by
   * `serveCompensations(handlers, { scopes: [scope] })`. A scoped function keeps its scope. */
  scope?: string;
}

type Registrable = DeclaredTool<never> | ToolSpec | { spec: ToolSpec };

export class Undolog {
  /** @internal */
  readonly http: Http;
  private readonly defaults: SessionOptions;

  constructor(options: UndologOptions = {}) {
    this.http = new Http({ url: options.url, apiKey: options.apiKey, timeoutS: options.timeout, fetch: options.fetch });
    const logger = options.logger === null ? { info() {}, warn() {} } : options.logger;
    this.defaults = { approvalTimeout: options.approvalTimeout, pollWait: options.pollWait, onWait: options.onWait, logger };
  }

  get baseUrl(): string {
    return this.http.baseUrl;
  }

  // -- runs ---------------------------------------------------------------------------

  /**
   * One run of an agent: `fn(run)` is called inside it, and undolog tools called from it
   * (directly or through an adapter) belong to this run. Completes when `fn` returns, fails
   * when it throws (the run's compensable calls are rolled back, newest first) and rethrows.
   */
  session<T>(fn: (run: Session) => T | Promise<T>): Promise<T>;
  session<T>(options: SessionOptions, fn: (run: Session) => T | Promise<T>): Promise<T>;
  async session<T>(a: SessionOptions | ((run: Session) => T | Promise<T>),
    b?: (run: Session) => T | Promise<T>): Promise<T> {
    const [options, fn] = typeof a === "function" ? [{}, a] : [a, b];
    if (typeof fn !== "function") throw new TypeError("session(options, fn) needs the run's callback");
    const run = new Session(this.http, { ...this.defaults, ...definedOnly(options),
      agent: options.agent ?? env("UNDOLOG_AGENT") });
    return await this.within(run, fn);
  }

  /** Carry on an existing run, e.g. after a crash: calls already committed answer their
   * stored results instead of running again. */
  async resumeSession<T>(sessionId: string, options: SessionOptions, fn: (run: Session) => T | Promise<T>): Promise<T> {
    const run = new Session(this.http, { ...this.defaults, ...definedOnly(options) }, String(sessionId));
    return await this.within(run, fn);
  }

  private async within<T>(run: Session, fn: (run: Session) => T | Promise<T>): Promise<T> {
    await run._open();
    let result: T;
    try {
      result = await SCOPE.run({ session: run, holding: false }, () => fn(run));
    } catch (error) {
      await run._close(true, error);
      throw error;
    }
    await run._close(false);
    return result;
  }

  // -- registration -------------------------------------------------------------------

  /** Register (or update) declared tools: `POST /api/v1/tools`. */
  async register(...tools: (Registrable | Registrable[])[]): Promise<Body[]> {
    const specs = tools.flat().map((tool) => specOf(tool as DeclaredTool));
    if (!specs.length) throw new TypeError("register() needs at least one tool");
    const names = specs.map((spec) => spec.name);
    const twice = [...new Set(names.filter((name, i) => names.indexOf(name) !== i))].sort();
    if (twice.length) throw new TypeError(`tools registered twice in one call: ${JSON.stringify(twice)}`);
    // Tools undone by a pre-image: their agent-handler restore first (served by serveCompensations).
    for (const spec of specs) {
      if (spec.preImage && spec.compensation) {
        await this.registerCompensation({ fnName: spec.compensation.fnName, fnVersion: spec.compensation.fnVersion ?? "1.0.0",
          handler: "agent" });
      }
    }
    const answer = await this.http.send({ method: "POST", path: "/api/v1/tools", body: { tools: specs.map((s) => s.toDict()) } });
    return (answer["tools"] ?? []) as Body[];
  }

  /** Add a compensation function to the registry: `POST /api/v1/compensations`. */
  async registerCompensation(registration: CompensationRegistration): Promise<Body> {
    const { fnName, fnVersion = "1.0.0", handler, target = "", timeoutMs = 5000, claimTimeoutS, scope } = registration;
    if (!["webhook", "python", "agent"].includes(handler)) {
      throw new TypeError("handler must be 'webhook', 'python' or 'agent'");
    }
    const body: Body = { fn_name: fnName, fn_version: fnVersion, handler, target, timeout_ms: timeoutMs };
    if (claimTimeoutS !== undefined) body["claim_timeout_s"] = claimTimeoutS;
    if (scope) body["scope"] = scope;
    return await this.http.send({ method: "POST", path: "/api/v1/compensations", body });
  }

  /** Run the `agent`-handler compensations of this agent's rolled-back runs here, where the
   * credentials are: claim, call `handlers[fnName](args, context)`, report. Resolves with how
   * many ran once `options.signal` aborts (or after one round with `once`). */
  async serveCompensations(handlers: Record<string, CompensationHandler>, options: ServeOptions = {}): Promise<number> {
    return await serve(this.http, handlers, options);
  }

  // -- reads ------------------------------------------------------------------------------

  async getSession(sessionId: string): Promise<Body> {
    return await this.http.send({ method: "GET", path: `/api/v1/sessions/${sessionId}` });
  }

  async getEffect(effectId: string): Promise<Body> {
    const answer = await this.http.send({ method: "GET", path: `/api/v1/effects/${effectId}` });
    return (answer["effect"] ?? {}) as Body;
  }

  /** `{limits, usage, remaining}` of an agent. */
  async getBudget(agent: string): Promise<Body> {
    return await this.http.send({ method: "GET", path: `/api/v1/agents/${agent}/budget` });
  }
}

function definedOnly<T extends object>(options: T): Partial<T> {
  return Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined)) as Partial<T>;
}
