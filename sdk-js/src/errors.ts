/**
 * Errors the SDK throws, one class per answer of the API contract (the Python SDK's
 * `undolog.errors`, in the same names).
 *
 * Every error carries the server's `code`, its `message` and the HTTP `status` (0 when the
 * error was raised on this side). `Refused` marks calls the server did not let through:
 * nothing ran, and a model should be told why with `refusalAsToolResult`.
 */

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type Body = Record<string, unknown>;

export interface UndologErrorOptions {
  code?: string;
  status?: number;
  body?: Body;
  cause?: unknown;
}

/** Base of every SDK error: `code`, `message`, `status` and the raw `body`. */
export class UndologError extends Error {
  static readonly defaultCode: string = "error";
  readonly code: string;
  readonly status: number;
  readonly body: Body;

  constructor(message = "", options: UndologErrorOptions = {}) {
    const code = options.code ?? (new.target as typeof UndologError).defaultCode;
    super(message || code, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = code;
    this.status = options.status ?? 0;
    this.body = { ...(options.body ?? {}) };
  }
}

/** The server could not be reached or the connection broke; nothing is known. */
export class UndologConnectionError extends UndologError {
  static override readonly defaultCode: string = "connection_error";
}

/** A client-side wait (`waitCompensated`) ran out. */
export class UndologTimeout extends UndologError {
  static override readonly defaultCode: string = "timeout";
}

/** 401/403: the API key is missing, wrong or revoked. */
export class AuthenticationError extends UndologError {
  static override readonly defaultCode: string = "not_authenticated";
}

/** 400 `invalid`; `fields` maps each bad field to what is wrong with it. */
export class InvalidRequest extends UndologError {
  static override readonly defaultCode: string = "invalid";
  get fields(): Record<string, unknown> {
    const fields = this.body["fields"];
    return fields && typeof fields === "object" ? { ...(fields as Body) } : {};
  }
}

/** 404 `tool_not_registered`: call `client.register(...)` first. */
export class ToolNotRegistered extends UndologError {
  static override readonly defaultCode: string = "tool_not_registered";
}

/** 409: an idempotency key came back with different args. */
export class IdempotencyKeyReused extends UndologError {
  static override readonly defaultCode: string = "idempotency_key_reused";
}

/** 409: another call of this session is waiting for a reviewer. */
export class SessionAwaitingApproval extends UndologError {
  static override readonly defaultCode: string = "session_awaiting_approval";
  get approval(): unknown {
    return this.body["approval"];
  }
}

/** A replayed effect is still `executing`: another process is running it. */
export class EffectInFlight extends UndologError {
  static override readonly defaultCode: string = "effect_in_flight";
}

/** A replayed effect had failed; exactly-once means it is not run again. */
export class EffectFailed extends UndologError {
  static override readonly defaultCode: string = "effect_failed";
}

/** A replayed effect has been (or is being) compensated. */
export class EffectUndone extends UndologError {
  static override readonly defaultCode: string = "effect_undone";
}

/** The client's `approvalTimeout` ran out; the request is still pending on the server. */
export class ApprovalWaitTimeout extends UndologError {
  static override readonly defaultCode: string = "approval_wait_timeout";
  readonly effectId: string | undefined;
  constructor(message: string, options: UndologErrorOptions & { effectId?: string } = {}) {
    super(message, options);
    this.effectId = options.effectId;
  }
}

/** The server did not let the call through. Nothing was executed. */
export class Refused extends UndologError {
  static override readonly defaultCode: string = "refused";
}

/** 429 refused by an autonomy budget. `message` is the text meant for the model. */
export class BudgetExceededError extends Refused {
  static override readonly defaultCode: string = "budget";
  get limit(): string | undefined {
    const limit = this.body["limit"];
    return typeof limit === "string" ? limit : undefined;
  }
  get kind(): string {
    return String(this.body["kind"] || "budget");
  }
}

/** A reviewer said no (`reason`, `reviewer`). The session is halted. */
export class ApprovalRejected extends Refused {
  static override readonly defaultCode: string = "rejected";
  readonly reason: string;
  readonly reviewer: string | undefined;
  constructor(message = "", options: UndologErrorOptions & { reason?: string; reviewer?: string } = {}) {
    super(message || `rejected by a reviewer: ${options.reason || "no reason given"}`, options);
    this.reason = options.reason ?? "";
    this.reviewer = options.reviewer;
  }
}

/** Nobody decided before the deadline and the tool does not auto-approve. */
export class ApprovalExpired extends Refused {
  static override readonly defaultCode: string = "expired";
}

/** 423 `agent_suspended`: `reason` is `budget` or `manual`. */
export class AgentSuspended extends Refused {
  static override readonly defaultCode: string = "agent_suspended";
  get reason(): string | undefined {
    const reason = this.body["reason"];
    return typeof reason === "string" ? reason : undefined;
  }
}

/** 409 `session_not_running` (completed, failed or halted); `state` says which. */
export class SessionNotRunning extends Refused {
  static override readonly defaultCode: string = "session_not_running";
  get state(): string | undefined {
    const state = this.body["state"];
    return typeof state === "string" ? state : undefined;
  }
}

/**
 * A rewind the server would not start: `irreversible_in_the_way` (`irreversible` names the
 * calls: rewind with `leaveIrreversible: true` to leave them done), `rewind_in_progress`,
 * `walk_stopped` (a compensation waits for a person) or `step_outside_run`.
 */
export class RewindRefused extends UndologError {
  static override readonly defaultCode: string = "rewind_refused";
  get irreversible(): Body[] {
    const found = this.body["irreversible"];
    return Array.isArray(found) ? (found as Body[]) : [];
  }
}

/** A tool declared wrongly (a compensable tool without a compensation...): thrown at definition. */
export class ToolDefinitionError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ToolDefinitionError";
  }
}

type ErrorClass = new (message: string, options: UndologErrorOptions) => UndologError;

const BY_CODE: Record<string, ErrorClass> = {
  tool_not_registered: ToolNotRegistered,
  agent_suspended: AgentSuspended,
  session_not_running: SessionNotRunning,
  // complete/fail of a session in the wrong state (e.g. resuming a completed run)
  session_state_conflict: SessionNotRunning,
  session_awaiting_approval: SessionAwaitingApproval,
  idempotency_key_reused: IdempotencyKeyReused,
  invalid: InvalidRequest,
  irreversible_in_the_way: RewindRefused,
  rewind_in_progress: RewindRefused,
  walk_stopped: RewindRefused,
  step_outside_run: RewindRefused,
};

/** Map one non-2xx answer to its error (the API contract's answers table). */
export function errorFromResponse(status: number, body: unknown, text = ""): UndologError {
  if (!body || typeof body !== "object" || Array.isArray(body)) {
    return new UndologError(text.slice(0, 300) || `HTTP ${status}`, { code: `http_${status}`, status });
  }
  const answer = body as Body;
  const message = String(answer["message"] || answer["detail"] || "");
  if (answer["decision"] === "refused") return refusal(status, answer, message);
  const code = String(answer["error"] || `http_${status}`);
  let cls = BY_CODE[code];
  if (cls === undefined && (status === 401 || status === 403)) cls = AuthenticationError;
  return new (cls ?? UndologError)(message || code, { code, status, body: answer });
}

function refusal(status: number, body: Body, message: string): UndologError {
  const kind = String(body["kind"] || "");
  if (kind === "budget") return new BudgetExceededError(message, { code: "budget", status, body });
  if (kind === "approval") {
    const reviewer = body["reviewer"];
    return new ApprovalRejected(message, {
      reason: String(body["reason"] || message),
      reviewer: typeof reviewer === "string" ? reviewer : undefined,
      code: "rejected", status, body,
    });
  }
  return new Refused(message || `refused (${kind || "policy"})`, { code: kind || "refused", status, body });
}

const STOP = "Stop calling tools and give your final answer.";

/**
 * The text a model should read as the result of a call the server refused.
 *
 * As in the reference guide: a budget refusal is the server's message (it ends with
 * "Stop calling tools and give your final answer."), a rejection is `"DENIED: <reason>"`.
 */
export function refusalAsToolResult(error: unknown): string {
  if (error instanceof BudgetExceededError) return error.message;
  if (error instanceof ApprovalRejected) return `DENIED: ${error.reason || "rejected by a reviewer"}`;
  if (error instanceof ApprovalExpired) {
    return "DENIED: nobody approved this call before its deadline; it was not executed.";
  }
  if (error instanceof Refused && error.code === "rule") return error.message;
  if (error instanceof AgentSuspended) {
    return `Agent suspended (${error.reason || "manual"}); the tool call was not executed. ${STOP}`;
  }
  if (error instanceof SessionNotRunning) {
    return `This run is over (${error.state || "not running"}); the tool call was not executed. ${STOP}`;
  }
  if (error instanceof UndologError) return `ERROR: ${error.message || error.code}`;
  return `ERROR: ${error instanceof Error ? error.message : String(error)}`;
}

/** `Name: message` of a thrown value, as the server records a failure (at most 2000 chars). */
export function describe(error: unknown): string {
  const text = error instanceof Error ? `${error.name}: ${error.message}` : `Error: ${String(error)}`;
  return text.slice(0, 2000);
}
