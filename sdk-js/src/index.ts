/**
 * undolog for TypeScript agents: declare each tool's tier with `undologTool`, open a run with
 * `client.session({agent}, async (run) => …)`, and call your tools as usual inside it.
 */

export { Undolog, type CompensationRegistration, type UndologOptions } from "./client.js";
export { currentSession } from "./context.js";
export {
  PermanentCompensationError,
  type CompensationContext,
  type CompensationHandler,
  type ServeOptions,
} from "./compensations.js";
export {
  AgentSuspended,
  ApprovalExpired,
  ApprovalRejected,
  ApprovalWaitTimeout,
  AuthenticationError,
  BudgetExceededError,
  EffectFailed,
  EffectInFlight,
  EffectUndone,
  IdempotencyKeyReused,
  InvalidRequest,
  Refused,
  RewindRefused,
  SessionAwaitingApproval,
  SessionNotRunning,
  ToolDefinitionError,
  ToolNotRegistered,
  UndologConnectionError,
  UndologError,
  UndologTimeout,
  errorFromResponse,
  refusalAsToolResult,
  type Body,
  type Json,
} from "./errors.js";
export { VERSION, type FetchLike } from "./http.js";
export {
  Session,
  editedArgs,
  type CallOptions,
  type Logger,
  type Outcome,
  type SessionOptions,
  type WaitInfo,
} from "./session.js";
export {
  ToolSpec,
  type ApprovalSpec,
  type CompensationDescriptor,
  type ToolAnnotations,
  type ToolDeclaration,
  type ToolTier,
} from "./tiers.js";
export {
  ABSENT,
  PreImageError,
  compareAndRestore,
  digest,
  preImageHandlers,
  type KeptPreImage,
  type PreImage,
  type PreImageOptions,
} from "./preimages.js";
export { specOf, undologTool, type DeclaredTool, type ToolArgs, type ToolOptions, type UndologTool } from "./tool.js";
