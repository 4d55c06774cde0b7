/**
 * A session: one run of an agent, and what happens to each tool call inside it (the Python
 * SDK's `undolog.session`, the same paths and rules).
 *
 * - SAFE calls run at once; they are reported with the next request (intercept, complete, fail).
 * - COMPENSABLE calls intercept → run → commit; their undo entry is on the stack before they run.
 * - IRREVERSIBLE calls wait (long poll, abortable) for a reviewer, then run with the args the
 *   reviewer approved (edited ones when they edited the call).
 * - A call the server already has (a retry after a crash) answers its stored result: it does
 *   not run again.
 */

import { AsyncLocalStorage } from "node:async_hooks";
import {
  ApprovalExpired,
  ApprovalRejected,
  ApprovalWaitTimeout,
  type Body,
  EffectFailed,
  EffectInFlight,
  EffectUndone,
  InvalidRequest,
  RewindRefused,
  SessionNotRunning,
  UndologConnectionError,
  UndologError,
  UndologTimeout,
  describe,
} from "./errors.js";
import { type Call, type Http, sleep, unwrapResult, wrapResult } from "./http.js";
import { type PreImage, PreImageError, digest, preImageBody } from "./preimages.js";
import type { ToolArgs, ToolSpec } from "./tiers.js";

/**
 * The session a tool call belongs to, carried by an `AsyncLocalStorage` (Node, Deno, Bun and
 * the edge runtimes have it): concurrent runs each see their own session, and promises made
 * inside a session's callback (`Promise.all` of tool calls) keep it. `currentSession()`
 * (context.ts) reads it.
 */
export interface Scope {
  readonly session: Session;
  /** A call of this session holds its turn (a tool calling a tool must not wait for itself). */
  readonly holding: boolean;
}

export const SCOPE = new AsyncLocalStorage<Scope>();

/** What a session needs to know of a tool to run one of its calls (`undologTool` makes one). */
export interface DeclaredTool<A extends ToolArgs = ToolArgs> {
  readonly spec: ToolSpec;
  readonly idempotencyKey?: ((args: A) => string) | undefined;
  /** A before read and restore (preimages.ts): the undo of a tool that has none. */
  readonly preImage?: PreImage | undefined;
}

/** Handed to `onWait` while an irreversible call waits for a reviewer. */
export interface WaitInfo {
  tool: string;
  effectId: string;
  state: string;
  waitedS: number;
  timeoutAt: string | undefined;
  /** The approval's page on the dashboard, where a reviewer decides. */
  url: string | undefined;
}

export interface Logger {
  info(message: string): void;
  warn(message: string): void;
}

/** Options of one run; the client's (approvalTimeout, pollWait, onWait, logger) are the defaults. */
export interface SessionOptions {
  /** The agent's name; default `$UNDOLOG_AGENT`, else the key's own agent. */
  agent?: string | undefined;
  metadata?: Record<string, unknown> | undefined;
  /** What the user asked (trusted input); sent only when given (needs a server that takes it). */
  inputs?: unknown;
  /** The person who started the run (they may not approve its calls). */
  startedBy?: string | undefined;
  /** Seconds to wait for a reviewer's decision; undefined: until the server decides or expires it. */
  approvalTimeout?: number | undefined;
  /** Seconds per long poll (the server takes 1..60). */
  pollWait?: number | undefined;
  onWait?: ((info: WaitInfo) => void) | undefined;
  /** Aborts every wait of the run (a reviewer's decision, the undo walk). */
  signal?: AbortSignal | undefined;
  logger?: Logger | undefined;
}

export interface CallOptions {
  /** Aborts this call's waits; the call stays on the server (pending), the run stays running. */
  signal?: AbortSignal | undefined;
}

/** A call's result, and `edited`: the reviewer's args it ran (or, replayed, was committed)
 * with instead of the caller's; undefined when the caller's own args were used. */
export interface Outcome {
  result: unknown;
  edited: Record<string, unknown> | undefined;
}

/** How an adapter runs its framework's tool: with the caller's args or the reviewer's edit. */
export type Runner = (args: ToolArgs) => Promise<unknown>;

/** Called before a long poll for a reviewer's decision (adapters use it). */
export type OnHold = (answer: Body) => void | Promise<void>;

interface SafeCall {
  tool: string;
  step_index: number;
  args: unknown;
  output?: unknown;
}

type Effect = Record<string, unknown>;

const UNDONE = new Set(["compensating", "compensated", "compensation_failed"]);
const COMPENSATION_OVER = new Set(["compensated", "compensation_failed"]);
const NOTHING_TO_UNDO = new Set(["completed", "halted"]);
/** The server's limit on safe_calls per request. */
export const MAX_SAFE_REPORT = 1000;

export const SILENT: Logger = { info() {}, warn() {} };
export const DEFAULT_LOGGER: Logger = { info() {}, warn: (message) => console.warn(`undolog: ${message}`) };

/** One run of an agent. Made by `Undolog.session` / `resumeSession`, handed to your callback. */
export class Session {
  id: string | undefined;
  agent: string | undefined;
  readonly metadata: Record<string, unknown>;
  state: string | undefined;
  data: Body = {};
  approvalTimeout: number | undefined;
  pollWait: number;
  onWait: ((info: WaitInfo) => void) | undefined;
  readonly signal: AbortSignal | undefined;
  private readonly http: Http;
  private readonly options: SessionOptions;
  private readonly logger: Logger;
  private step = 0;
  private safe: SafeCall[] = [];
  private pendingReasoning: string | undefined;
  private turn: Promise<void> = Promise.resolve();
  /** Compensable effects this run started: what a failure rolls back. */
  private readonly undoable = new Set<string>();
  /** Reasons of the aborts that cut a wait of this run short: thrown back, they leave it running. */
  private readonly aborts = new WeakSet<object>();

  /** @internal */
  constructor(http: Http, options: SessionOptions, sessionId?: string) {
    this.http = http;
    this.options = options;
    this.id = sessionId;
    this.agent = options.agent;
    this.metadata = { ...(options.metadata ?? {}) };
    this.approvalTimeout = options.approvalTimeout;
    this.pollWait = options.pollWait ?? 30;
    this.onWait = options.onWait;
    this.signal = options.signal;
    this.logger = options.logger ?? DEFAULT_LOGGER;
  }

  // -- opening and closing -----------------------------------------------------------

  /** @internal */
  async _open(): Promise<void> {
    const resumed = this.id !== undefined;
    let answer: Body;
    if (resumed) {
      answer = await this.http.send({ method: "GET", path: `/api/v1/sessions/${this.id}` });
    } else {
      const body: Body = { metadata: this.metadata };
      if (this.agent) body["agent"] = this.agent;
      if (this.options.startedBy) body["started_by"] = this.options.startedBy;
      if (this.options.inputs !== undefined) body["inputs"] = this.options.inputs;
      answer = await this.http.send({ method: "POST", path: "/api/v1/sessions", body });
    }
    this.apply(answer);
    // The server keeps the highest step index seen (0 for a new session: the run before any
    // call) and drops SAFE reports of a step it already has, so a run's calls are numbered from
    // past it: from 1 in a new run, so that a rewind to step 0 undoes every call.
    const last = this.data["step_index"];
    if (typeof last === "number") this.step = last + 1;
  }

  /**
   * @internal Complete on a normal return, fail (starting the undo walk) on a throw.
   * An abort (an `AbortError`, or the reason of the run's own signal) leaves the run running,
   * as a crash would, so that `resumeSession` can carry it on.
   */
  async _close(threw: boolean, error?: unknown): Promise<void> {
    if (threw && (isAbort(error, this.signal) || (typeof error === "object" && error !== null && this.aborts.has(error)))) {
      this.logger.warn(`run ${this.id} was aborted; it stays running (resumeSession carries it on)`);
      return;
    }
    let answer: Body;
    try {
      if (threw) {
        answer = await this.finish("fail", { error: describe(error) });
        this.logRollback(error);
      } else {
        answer = await this.finish("complete", {});
      }
    } catch (err) {
      // Never mask the callback's own error, nor fail a normal return because a reviewer
      // halted or rolled back the run meanwhile (that is expected).
      if (!threw && !(err instanceof SessionNotRunning)) throw err;
      if (!(err instanceof SessionNotRunning)) this.logger.warn(`could not close session ${this.id}: ${String(err)}`);
      this.state = (err instanceof SessionNotRunning ? err.state : undefined) ?? this.state;
      return;
    }
    this.apply(answer);
  }

  private async finish(verb: "complete" | "fail", body: Body): Promise<Body> {
    const path = `/api/v1/sessions/${this.id}/${verb}`;
    const safe = this.drainSafe();
    if (safe.length) {
      try {
        return await this.http.send({ method: "POST", path, body: { ...body, safe_calls: safe } });
      } catch (err) {
        if (!(err instanceof InvalidRequest) || !("safe_calls" in err.fields)) throw err;
      }
    }
    return await this.http.send({ method: "POST", path, body });
  }

  private logRollback(error: unknown): void {
    const count = this.undoable.size;
    if (count) {
      this.logger.warn(`run ${this.id} failed (${describe(error)}): rolling back ${count} call${count === 1 ? "" : "s"}, `
        + `newest first; follow it at ${this.page("sessions", this.id)}`);
    } else {
      this.logger.warn(`run ${this.id} failed (${describe(error)}): nothing to roll back`);
    }
  }

  private apply(answer: Body): void {
    const data = (answer["session"] ?? answer) as Body;
    if (!data || typeof data !== "object") return;
    this.data = { ...data };
    if (data["id"] !== undefined) this.id = String(data["id"]);
    if (typeof data["state"] === "string") this.state = data["state"];
    if (typeof data["agent"] === "string") this.agent = data["agent"];
  }

  private page(kind: string, id: unknown): string {
    return `${this.http.baseUrl}/${kind}/${String(id)}/`;
  }

  // -- what code inside the callback may use --------------------------------------------

  /** Attach the agent's reasoning to the next intercepted call (reviewers see it). */
  reasoning(text: string): void {
    this.pendingReasoning = text;
  }

  /** The run as the server has it now (`data`, `state` are updated too). */
  async refresh(): Promise<Body> {
    this.apply(await this.http.send({ method: "GET", path: `/api/v1/sessions/${this.id}` }));
    return this.data;
  }

  /** Wait until the undo walk ends: `state` is compensated or compensation_failed. */
  async waitCompensated(options: { timeout?: number; pollInterval?: number; signal?: AbortSignal } = {}): Promise<Body> {
    const timeout = options.timeout ?? 60;
    const signal = options.signal ?? this.signal;
    const deadline = Date.now() + timeout * 1000;
    for (;;) {
      this.apply(await this.http.send({ method: "GET", path: `/api/v1/sessions/${this.id}`, signal }));
      if (this.state && COMPENSATION_OVER.has(this.state)) return this.data;
      if (this.state && NOTHING_TO_UNDO.has(this.state)) {
        throw new UndologError(`session ${this.id} is ${this.state}; no undo walk will run`, { code: "not_compensating" });
      }
      if (Date.now() >= deadline) throw new UndologTimeout(`session ${this.id} still ${this.state} after ${timeout}s`);
      await sleep(1000 * (options.pollInterval ?? 0.5), signal);
    }
  }

  // -- savepoints and rewind (issue 41) -------------------------------------------------

  /** Name the run's current step (its SAFE calls so far reported first), for `rewind({ to: name })`. */
  async savepoint(name: string): Promise<{ name: string; step_index: number }> {
    await this.reportSafe();
    return (await this.http.send({ method: "POST", path: `/api/v1/sessions/${this.id}/savepoints`, body: { name } })) as {
      name: string; step_index: number;
    };
  }

  /**
   * Roll the run back to step `to` (or the savepoint named `to`): the server undoes every effect
   * after it, newest first; this resolves once the run runs again at that step, and the next call
   * is numbered after it. The answer says what was undone (`to_undo`), what was left done
   * (`left_done`) and the step the run resumed at (`resumes_at`). Irreversible calls after the
   * step throw `RewindRefused` naming them (`irreversible`), unless `leaveIrreversible`.
   */
  async rewind(options: { to: number | string; reason?: string; leaveIrreversible?: boolean; timeout?: number;
    pollInterval?: number; signal?: AbortSignal }): Promise<Body> {
    await this.reportSafe();
    const body: Body = { reason: options.reason ?? "", leave_irreversible: options.leaveIrreversible ?? false };
    body[typeof options.to === "string" ? "to" : "to_step"] = options.to;
    const signal = options.signal ?? this.signal;
    const answer = await this.http.send({ method: "POST", path: `/api/v1/sessions/${this.id}/rewind`, body, signal });
    this.step = Number(answer["resumes_at"]) + 1; // the run goes on after the step it went back to
    for (const item of (answer["to_undo"] as Body[] | undefined) ?? []) this.undoable.delete(String(item["effect"]));
    this.apply(answer);
    const deadline = Date.now() + (options.timeout ?? 60) * 1000;
    while (this.state !== "running" && this.state !== "awaiting_approval") {
      if (this.state === "compensation_failed") {
        throw new RewindRefused(`the rewind of run ${this.id} stopped: a compensation failed and waits for a person `
          + "(retry or resolve it on the run's page)", { code: "walk_stopped", body: this.data });
      }
      if (Date.now() >= deadline) throw new UndologTimeout(`run ${this.id} still rewinding (${this.state})`);
      await sleep(1000 * (options.pollInterval ?? 0.2), signal);
      this.apply(await this.http.send({ method: "GET", path: `/api/v1/sessions/${this.id}`, signal }));
    }
    return answer;
  }

  private async reportSafe(): Promise<void> {
    while (this.safe.length) {
      this.apply(await this.http.send({ method: "POST", path: `/api/v1/sessions/${this.id}/safe-calls`,
        body: { safe_calls: this.drainSafe() } }));
    }
  }

  /** Run one call of a declared tool in this session (what calling an `undologTool` does). */
  async call<A extends ToolArgs>(tool: DeclaredTool<A> & { fn: (args: A) => unknown }, args: A,
    options?: CallOptions): Promise<unknown> {
    if (tool.spec.tier === "safe") {
      if (!tool.spec.untrusted) {
        this._recordSafe(tool.spec.name, args);
        return await tool.fn(args);
      }
      const step = this._nextStep();
      const output = await tool.fn(args);
      this._recordSafe(tool.spec.name, args, step, output);
      return output;
    }
    return (await this._callTool(tool, args, async (use) => await tool.fn(use as A), options)).result;
  }

  // -- the tier paths (entered from undologTool and the adapters) ------------------------

  /** @internal The run's connection (the adapters' decision waits use it). */
  get _http(): Http {
    return this.http;
  }

  /** @internal */
  _nextStep(): number {
    return this.step++;
  }

  /** @internal */
  _recordSafe(tool: string, args: unknown, step?: number, output?: unknown): void {
    const call: SafeCall = { tool, step_index: step ?? this.step++, args };
    if (output !== undefined) call.output = output;
    this.safe.push(call);
  }

  private drainSafe(): SafeCall[] {
    // At most what the server takes in one request; the rest rides on the next one.
    return this.safe.length <= MAX_SAFE_REPORT ? this.safe.splice(0) : this.safe.splice(0, MAX_SAFE_REPORT);
  }

  /**
   * @internal A COMPENSABLE or IRREVERSIBLE call, one at a time per run: the server answers
   * a call made while another of the run waits for a reviewer with 409, and frameworks run a
   * model's parallel tool calls at once. A tool calling a tool already holds the turn.
   */
  async _callTool<A extends ToolArgs>(tool: DeclaredTool<A>, args: A, run: Runner,
    options?: CallOptions & { onHold?: OnHold }): Promise<Outcome> {
    const scope = SCOPE.getStore();
    if (scope?.holding && scope.session === this) return await this.effectFlow(tool, args, run, options);
    const previous = this.turn;
    let release!: () => void;
    this.turn = new Promise((resolve) => (release = resolve));
    try {
      await previous;
      return await SCOPE.run({ session: this, holding: true }, () => this.effectFlow(tool, args, run, options));
    } finally {
      release();
    }
  }

  /**
   * 1. Intercept, reporting the SAFE calls queued since the last request.
   * 2. `execute`: run the tool, commit its result (or report the failure, rethrow).
   * 3. `replay`/`await_approval`: settle the effect; a committed effect answers its stored
   *    result without running.
   * 4. An approved one is claimed (`/start`: approved → executing), then runs and commits; if
   *    another caller claimed it first, its outcome is this call's outcome.
   */
  private async effectFlow<A extends ToolArgs>(tool: DeclaredTool<A>, args: A, run: Runner,
    options: (CallOptions & { onHold?: OnHold }) | undefined): Promise<Outcome> {
    const signal = joined(options?.signal, this.signal);
    try {
      return await this.flow(tool, args, run, signal, options?.onHold);
    } catch (error) {
      if (signal?.aborted && error === signal.reason && typeof error === "object" && error !== null) this.aborts.add(error);
      throw error;
    }
  }

  private async flow<A extends ToolArgs>(tool: DeclaredTool<A>, args: A, run: Runner, signal: AbortSignal | undefined,
    hold: OnHold | undefined): Promise<Outcome> {
    let answer = await this._intercept(tool, args);
    let effect = (answer["effect"] ?? {}) as Effect;
    const decision = answer["decision"];
    if ((decision === "rejected" || decision === "expired") && !effect["state"]) effect = { ...effect, state: decision };
    if (decision === "execute") return await this.runEffect(effect, args, run, tool, signal, hold);
    effect = await this.settle(tool, answer, effect, false, signal, hold);
    if (effect["state"] === "approved" && !(await this.claim(effect))) {
      // Another caller started it first: its outcome is this call's outcome.
      answer = await this.http.send({ method: "GET", path: `/api/v1/effects/${effect["id"]}` });
      effect = await this.settle(tool, answer, (answer["effect"] ?? {}) as Effect, true, signal, hold);
    }
    if (effect["state"] === "committed") return { result: unwrapResult(effect["result"]), edited: editedArgs(effect) };
    return await this.runEffect(effect, args, run, tool, signal, hold);
  }

  /** @internal The intercept alone (the adapters' approval flows send it before the framework asks). */
  async _intercept<A extends ToolArgs>(tool: DeclaredTool<A>, args: A): Promise<Body> {
    const body: Body = { tool: tool.spec.name, args, step_index: this.step++ };
    if (this.pendingReasoning !== undefined) {
      body["reasoning"] = this.pendingReasoning;
      this.pendingReasoning = undefined;
    }
    if (tool.idempotencyKey) body["idempotency_key"] = tool.idempotencyKey(args);
    const safe = this.drainSafe();
    if (safe.length) body["safe_calls"] = safe;
    try {
      return await this.http.send({ method: "POST", path: `/api/v1/sessions/${this.id}/intercept`, body });
    } catch (err) {
      // The request may never have arrived; keep the SAFE calls for the next one.
      if (err instanceof UndologConnectionError) this.safe.unshift(...safe);
      if (err instanceof SessionNotRunning) this.state = err.state ?? this.state;
      throw err;
    }
  }

  /** Wait until the effect is committed, or approved for this caller to run.
   * `elsewhere`: someone else (another caller, the worker) runs it; wait for that. */
  private async settle(tool: DeclaredTool<never>, answer: Body, effect: Effect, elsewhere: boolean,
    signal: AbortSignal | undefined, hold: OnHold | undefined): Promise<Effect> {
    const started = Date.now();
    let approval = (answer["approval"] ?? {}) as Body;
    const timeoutAt = typeof approval["timeout_at"] === "string" ? approval["timeout_at"] : undefined;
    const url = approval["id"] ? this.page("approvals", approval["id"]) : undefined;
    for (;;) {
      const state = effect["state"];
      const serverRuns = elsewhere || Boolean(tool.spec.executor) || Boolean(effect["executor"]);
      if (state === "committed" || (state === "approved" && !serverRuns)) return effect;
      if (state === "pending" || (serverRuns && (state === "approved" || state === "executing"))) {
        if (hold && state === "pending") await hold({ effect, approval });
        answer = await this.poll(tool, effect, started, timeoutAt, url, signal);
        effect = (answer["effect"] ?? {}) as Effect;
        approval = (answer["approval"] ?? approval) as Body;
        // It was pending or approved a moment ago: executing now means someone else (another
        // caller, the worker) started it. Wait for their outcome.
        elsewhere = elsewhere || effect["state"] === "executing";
        continue;
      }
      throw this.unrunnable(tool, answer, effect);
    }
  }

  /** One long poll of the effect, bounded by `approvalTimeout`. */
  private async poll(tool: DeclaredTool<never>, effect: Effect, started: number, timeoutAt: string | undefined,
    url: string | undefined, signal: AbortSignal | undefined): Promise<Body> {
    const waited = (Date.now() - started) / 1000;
    let wait = this.pollWait;
    if (this.approvalTimeout !== undefined) {
      const remaining = this.approvalTimeout - waited;
      if (remaining <= 0) {
        const what = effect["state"] === "pending" ? "no decision" : "no outcome";
        throw new ApprovalWaitTimeout(`${tool.spec.name}: ${what} after ${this.approvalTimeout}s; effect `
          + `${effect["id"]} is still ${effect["state"]} on the server`, { effectId: String(effect["id"]) });
      }
      wait = Math.min(wait, remaining);
    }
    this.onWait?.({ tool: tool.spec.name, effectId: String(effect["id"]), state: String(effect["state"]),
      waitedS: waited, timeoutAt, url });
    const before = Date.now();
    const answer = await this.http.send({ method: "GET", path: `/api/v1/effects/${effect["id"]}`,
      params: { wait: waitParam(wait) }, timeoutS: wait + 15, signal });
    const unchanged = ((answer["effect"] ?? {}) as Effect)["state"] === effect["state"];
    if (unchanged && Date.now() - before < 1000) await sleep(1000, signal); // the server ignored ?wait=; don't spin
    return answer;
  }

  private unrunnable(tool: DeclaredTool<never>, answer: Body, effect: Effect): UndologError {
    const state = effect["state"];
    const body = { ...answer };
    const name = tool.spec.name;
    if (state === "rejected") {
      this.state = "halted";
      const { reason, reviewer } = decisionOf(answer, effect);
      return new ApprovalRejected("", { reason, reviewer, body });
    }
    if (state === "expired") {
      this.state = "halted";
      return new ApprovalExpired(`${name}: the approval request expired before a decision; the call was not executed`, { body });
    }
    if (state === "executing") {
      return new EffectInFlight(`${name}: this call (effect ${effect["id"]}) is being executed elsewhere; not running it twice`, { body });
    }
    if (state === "failed") {
      return new EffectFailed(`${name}: this call (effect ${effect["id"]}) failed and is never run again: ${effect["error"]}`, { body });
    }
    if (typeof state === "string" && UNDONE.has(state)) {
      return new EffectUndone(`${name}: this call was already undone (${state})`, { body });
    }
    return new UndologError(`${name}: unexpected effect state ${JSON.stringify(state)}`, { code: "unexpected_state", body });
  }

  /** `POST /effects/{id}/start`: approved → executing, before the tool runs. Two callers may
   * wait on one approval; the server lets only the first start it, the other gets 409. */
  private async claim(effect: Effect): Promise<boolean> {
    try {
      await this.http.send({ method: "POST", path: `/api/v1/effects/${effect["id"]}/start` });
    } catch (err) {
      if (!(err instanceof UndologError) || err.code !== "effect_state_conflict") throw err;
      this.logger.info(`effect ${effect["id"]} was started by another caller; waiting for its outcome`);
      return false;
    }
    return true;
  }

  private async runEffect(effect: Effect, args: ToolArgs, run: Runner, tool?: DeclaredTool<any>,
    signal?: AbortSignal, hold?: OnHold): Promise<Outcome> {
    const id = String(effect["id"]);
    if (effect["tier"] === "compensable") this.undoable.add(id); // its undo entry is pushed before it runs
    const pre = effect["tier"] === "compensable" ? tool?.preImage : undefined;
    if (pre && tool) effect = await this.keepPreImage(tool, pre, effect, editedArgs(effect) ?? args, signal, hold);
    const outcome = await this.runEffectNow(effect, args, run);
    if (pre && !pre.options.after) await this.afterImage(pre, id, editedArgs(effect) ?? args);
    return outcome;
  }

  /** The before read, kept on the server before the call runs; over its bound with `hold`, the
   * call waits for a person first (then this caller starts it). A failed read fails the effect. */
  private async keepPreImage(tool: DeclaredTool<any>, pre: PreImage, effect: Effect, args: ToolArgs,
    signal?: AbortSignal, hold?: OnHold): Promise<Effect> {
    const id = String(effect["id"]);
    let state: unknown;
    try {
      state = await pre.options.before(args);
    } catch (error) {
      const why = `not run: its before read failed (${describe(error)})`;
      await this.reportFailure(id, new PreImageError(why));
      throw new PreImageError(`${tool.spec.name} was ${why}; a call never runs without its undo`);
    }
    const body = await preImageBody(pre, args, state);
    const answer = await this.http.send({ method: "POST", path: `/api/v1/effects/${id}/pre-image`, body });
    if (answer["decision"] === "execute") return effect;
    const settled = await this.settle(tool, answer, (answer["effect"] ?? {}) as Effect, false, signal, hold);
    if (settled["state"] === "approved" && !(await this.claim(settled))) {
      throw new EffectInFlight(`${tool.spec.name}: another caller started this approved call; not running it twice`);
    }
    return { ...effect, ...settled };
  }

  /** What the call left, read again, its digest recorded (a tool whose args do not say it). */
  private async afterImage(pre: PreImage, id: string, args: ToolArgs): Promise<void> {
    try {
      const state = await (pre.options.check ?? pre.options.before)(args);
      await this.http.send({ method: "POST", path: `/api/v1/effects/${id}/after-image`, body: { digest: await digest(state) } });
    } catch (error) {
      this.logger.warn(`effect ${id}: the after-image was not recorded (${describe(error)}); its restore will not compare`);
    }
  }

  private async runEffectNow(effect: Effect, args: ToolArgs, run: Runner): Promise<Outcome> {
    const id = String(effect["id"]);
    const edited = editedArgs(effect);
    if (edited) {
      this.logger.info(`${effect["tool"]} runs with the args a reviewer edited before approving (effect ${id})`);
    }
    let result: unknown;
    try {
      result = await run(edited ?? args);
    } catch (error) {
      await this.reportFailure(id, error);
      throw error;
    }
    await this.commit(id, result);
    return { result, edited };
  }

  private async reportFailure(id: string, error: unknown): Promise<void> {
    try {
      await this.http.send({ method: "POST", path: `/api/v1/effects/${id}/fail`, body: { error: describe(error) } });
    } catch (err) {
      // The tool's own error matters more; the effect stays executing and the undo walk covers it.
      this.logger.warn(`could not report failure of effect ${id}: ${String(err)}`);
    }
  }

  /** Commit, retrying a broken connection: the side effect has already happened. */
  private async commit(id: string, result: unknown): Promise<void> {
    const call: Call = { method: "POST", path: `/api/v1/effects/${id}/commit`, body: { result: wrapResult(result) } };
    for (let attempt = 0; ; attempt++) {
      try {
        await this.http.send(call);
        return;
      } catch (err) {
        if (err instanceof UndologConnectionError && attempt < 2) {
          await sleep(250 * 2 ** attempt);
          continue;
        }
        // A 409 after a broken attempt: did that attempt land after all?
        if (attempt === 0 || !(err instanceof UndologError) || err.status !== 409) throw err;
        const current = await this.http.send({ method: "GET", path: `/api/v1/effects/${id}` });
        if (((current["effect"] ?? {}) as Effect)["state"] === "committed") return;
        throw err;
      }
    }
  }
}

/** The args a reviewer edited before approving, which the call runs with (undefined: the
 * caller's own args, approved as proposed or never edited). */
export function editedArgs(effect: Effect): Record<string, unknown> | undefined {
  const edited = effect["approved_args"];
  if (!edited || typeof edited !== "object" || Array.isArray(edited)) return undefined;
  if (canonical(edited) === canonical(effect["args"])) return undefined;
  return edited as Record<string, unknown>;
}

function canonical(value: unknown): string {
  return JSON.stringify(value, (_key, item: unknown) => item && typeof item === "object" && !Array.isArray(item)
    ? Object.fromEntries(Object.entries(item).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)))
    : item);
}

/** A rejection's reason and reviewer, wherever this server version puts them. */
export function decisionOf(answer: Body, effect: Effect): { reason: string; reviewer: string | undefined } {
  const places = [answer["approval"], effect["approval"], answer, effect].filter(
    (p): p is Body => Boolean(p) && typeof p === "object");
  const first = (keys: string[]): unknown => {
    for (const place of places) for (const key of keys) if (place[key]) return place[key];
    return undefined;
  };
  const reason = first(["reason", "decision_reason", "rejection_reason"]) ?? effect["error"];
  let reviewer = first(["decided_by", "reviewer"]);
  if (reviewer && typeof reviewer === "object") {
    const who = reviewer as Body;
    reviewer = who["username"] ?? who["name"] ?? who["id"];
  }
  return { reason: String(reason ?? ""), reviewer: reviewer ? String(reviewer) : undefined };
}

function waitParam(seconds: number): number {
  return Math.min(60, Math.max(1, Math.floor(seconds))); // the server takes 0..60 s per long poll
}

function joined(a: AbortSignal | undefined, b: AbortSignal | undefined): AbortSignal | undefined {
  return a && b ? AbortSignal.any([a, b]) : a ?? b;
}

function isAbort(error: unknown, signal: AbortSignal | undefined): boolean {
  if (signal?.aborted && error === signal.reason) return true;
  return error instanceof Error && error.name === "AbortError";
}
