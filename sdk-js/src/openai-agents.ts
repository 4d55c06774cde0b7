/**
 * undolog for the OpenAI Agents SDK for JavaScript (`@openai/agents`):
 * `import { functionTool, decisions } from "@undolog/sdk/openai-agents"`.
 *
 * `functionTool(options, declaration)` is the SDK's `tool(options)` with an undolog tier: the
 * tool keeps its name, description, parameters and failure policy, and carries `spec` so
 * `client.register(...tools)` works. Run the agent inside an undolog session:
 *
 *     await client.session({ agent: "cleanup" }, async () => run(agent, "Clean up"));
 *
 * - A refused call (budget, rejection, expiry, a suspended agent) returns
 *   `refusalAsToolResult`'s text as the tool's output: the model reads why.
 * - An irreversible call waiting for a reviewer is held one of two ways. `hold: "wait"` (the
 *   default): the tool's execution waits for the decision (long polls, aborted by the run's
 *   signal). `hold: "interrupt"`: the SDK's own human-in-the-loop. The tool `needsApproval`
 *   while undolog holds the call, so the run stops with `result.interruptions`;
 *   `await decisions(result)` waits for undolog's reviewer and gives the `RunState` (approved,
 *   or rejected with `DENIED: <reason>` as the model's message) to pass to `run(agent, state)`,
 *   in the same session.
 * - A call a reviewer edited runs with the edited args (the tool's `details.toolCall.arguments`
 *   say so too); its output starts with `editedNote`'s text (not for a tool with an
 *   `outputSchema`, whose output the SDK validates).
 * - A tool that throws reports its effect failed; the tool's `errorFunction` then decides as
 *   usual (by default the model reads the error; with `errorFunction: null` the run throws,
 *   which fails the session and rolls it back).
 *
 * Why a new `functionTool` rather than wrapping an existing `FunctionTool`: the SDK's `tool()`
 * turns a failing `execute` into the error text inside its `invoke`, so a wrapper around
 * `invoke` would commit that text as the call's result instead of reporting the failure.
 */

import {
  type FunctionTool,
  type RunResult,
  type RunState,
  type ToolInputParameters,
  type ToolOptions,
  type ToolOutputSchema,
  type UnknownContext,
  tool,
} from "@openai/agents";
import {
  type Declaration,
  type DecisionOptions,
  callTool,
  decisionOf_,
  declare,
  needsApproval,
  noted,
  parameterNames,
  takeRefusal,
} from "./adapter.js";
import { Refused, refusalAsToolResult } from "./errors.js";
import { currentSession } from "./context.js";
import type { ToolSpec } from "./tiers.js";
import type { ToolArgs } from "./tool.js";

export { editedNote, type Declaration, type DecisionOptions } from "./adapter.js";

export interface WrapOptions {
  /** How an irreversible call waits for its reviewer: in the tool (`"wait"`), or through the
   * SDK's interruptions (`"interrupt"`; answer them with `decisions`). */
  hold?: "wait" | "interrupt";
}

/** A function tool with an undolog tier. */
export type UndologFunctionTool = FunctionTool<any, any, any> & { readonly spec: ToolSpec };

/** The SDK's `tool(options)` with an undolog tier; mistakes throw `ToolDefinitionError` here. */
export function functionTool<P extends ToolInputParameters = undefined, C = UnknownContext,
  S extends ToolOutputSchema | undefined = undefined>(options: ToolOptions<P, C, S>, declaration: Declaration,
  wrapOptions: WrapOptions = {}): UndologFunctionTool {
  const hold = wrapOptions.hold ?? "wait";
  if (hold !== "wait" && hold !== "interrupt") throw new TypeError(`hold must be "wait" or "interrupt", not ${String(hold)}`);
  const execute = options.execute as (input: unknown, context: unknown, details?: Record<string, any>) => unknown;
  const name = options.name ?? execute.name;
  const declared = declare(name, declaration, options.description, parameterNames(options.parameters));
  const structured = options.outputSchema !== undefined;
  const own = options.needsApproval as boolean | ((...args: unknown[]) => Promise<boolean>) | undefined;
  const built = tool({
    ...options,
    name,
    execute: async (input: unknown, context: unknown, details?: Record<string, any>) => {
      const args = (input && typeof input === "object" ? input : {}) as ToolArgs;
      const refused = takeRefusal(details?.["toolCall"]?.["callId"]);
      if (refused) return refusalAsToolResult(refused);
      if (currentSession() === undefined || declared.spec.tier === "safe") {
        return await callTool(declared, args, async (use) => await execute(use, context, details), details?.["signal"]);
      }
      // Not callTool: a tool with an output schema keeps its output as is (no note).
      const session = currentSession()!;
      try {
        const outcome = await session._callTool(declared, args,
          async (use) => await execute(use, context, use === args ? details : edited(details, use)), { signal: details?.["signal"] });
        return structured ? outcome.result : noted(outcome);
      } catch (error) {
        if (error instanceof Refused) return refusalAsToolResult(error);
        throw error;
      }
    },
    ...(hold === "interrupt" && declared.spec.tier === "irreversible" ? {
      needsApproval: async (context: any, input: any, callId?: string) => {
        if (await needsApproval(declared, (input ?? {}) as ToolArgs, callId)) return true;
        return typeof own === "function" ? await own(context, input, callId) : Boolean(own);
      },
    } : {}),
  } as ToolOptions<any, any, any>) as FunctionTool<any, any, any>;
  Object.defineProperty(built, "spec", { value: declared.spec, enumerable: false });
  return built as UndologFunctionTool;
}

/** The call's details as the tool should see them when it runs a reviewer's edit. */
function edited(details: Record<string, any> | undefined, args: ToolArgs): Record<string, any> | undefined {
  if (!details?.["toolCall"]) return details;
  return { ...details, toolCall: { ...details["toolCall"], arguments: JSON.stringify(args) } };
}

/**
 * Wait for undolog's reviewer of each call the run stopped on (`hold: "interrupt"`) and record
 * the decisions in the run's state: `run(agent, state)` goes on. Call it inside the session
 * the run belongs to. A rejection (or an expiry) reaches the model as `"DENIED: <reason>"`;
 * interruptions that are not undolog's are left for you to decide.
 */
export async function decisions<S extends RunState<any, any>>(result: Pick<RunResult<any, any>, "interruptions"> & { state: S },
  options: DecisionOptions = {}): Promise<S> {
  const state = result.state;
  for (const item of result.interruptions ?? []) {
    const callId = (item.rawItem as { callId?: string }).callId;
    const decision = callId ? await decisionOf_(callId, options) : undefined;
    if (!decision) continue;
    if (decision.approved) state.approve(item);
    else state.reject(item, { message: decision.message ?? "DENIED" });
  }
  return state;
}
