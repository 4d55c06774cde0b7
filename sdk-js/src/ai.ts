/**
 * undolog for the Vercel AI SDK (`ai` 6.x): `import { wrapTools } from "@undolog/sdk/ai"`.
 *
 * `wrapTools(tools, tiers)` / `wrapTool(name, tool, declaration)` give the tools of a
 * `generateText`/`streamText` call an undolog tier; the copies keep the description, the
 * input schema and everything else, and carry `spec` so `client.register(...Object.values(tools))`
 * works. Call the model inside an undolog session:
 *
 *     await client.session({ agent: "cleanup" }, async () =>
 *       generateText({ model, tools, stopWhen: stepCountIs(10), prompt }));
 *
 * - A refused call (budget, rejection, expiry, a suspended agent) answers
 *   `refusalAsToolResult`'s text as the tool's result: the model reads why.
 * - An irreversible call waiting for a reviewer is held one of two ways:
 *   `hold: "wait"` (the default): `execute` waits for the decision (long polls, aborted by the
 *   call's `abortSignal`), then the step goes on. `hold: "approval"`: the AI SDK's own tool
 *   approval flow. The tool `needsApproval` while undolog holds the call, so the step ends with
 *   `tool-approval-request` parts; `await decisions(result)` waits for undolog's reviewer and
 *   gives the `tool` message of `tool-approval-response`s to append to the conversation
 *   before calling the model again (a denial's reason is what the model reads).
 * - A call a reviewer edited before approving runs with the edited input; its result carries
 *   `editedNote`'s text (a string result gets it as its first line, an object as `note`).
 */

import type { ModelMessage, Tool, ToolSet } from "ai";
import {
  type Declaration,
  type DecisionOptions,
  callTool,
  decisionOf_,
  declare,
  needsApproval,
  parameterNames,
  settled,
  takeRefusal,
} from "./adapter.js";
import { refusalAsToolResult } from "./errors.js";
import type { ToolSpec } from "./tiers.js";
import type { ToolArgs } from "./tool.js";

export { editedNote, type Declaration, type DecisionOptions } from "./adapter.js";

export interface WrapOptions {
  /** How an irreversible call waits for its reviewer: in `execute` (`"wait"`), or through the
   * AI SDK's tool approval flow (`"approval"`; answer it with `decisions`). */
  hold?: "wait" | "approval";
}

/** A wrapped tool: the AI SDK tool, plus its undolog spec. */
export type UndologAiTool<T> = T & { readonly spec: ToolSpec };

/** A copy of an AI SDK `tool(...)` with an undolog tier; mistakes throw `ToolDefinitionError` here. */
export function wrapTool<T extends Tool<any, any>>(name: string, tool: T, declaration: Declaration,
  options: WrapOptions = {}): UndologAiTool<T> {
  const hold = options.hold ?? "wait";
  if (hold !== "wait" && hold !== "approval") throw new TypeError(`hold must be "wait" or "approval", not ${String(hold)}`);
  if ((tool as { spec?: unknown }).spec) throw new TypeError(`${name} is already wrapped`);
  const execute = tool.execute;
  if (typeof execute !== "function") throw new TypeError(`${name}: only tools with an execute function can be wrapped`);
  const declared = declare(name, declaration, tool.description, parameterNames(tool.inputSchema));
  const irreversible = declared.spec.tier === "irreversible";
  const wrapped: Record<string, unknown> = {
    ...tool,
    spec: declared.spec,
    execute: async (input: ToolArgs, callOptions: Parameters<NonNullable<T["execute"]>>[1]) => {
      const refused = takeRefusal(callOptions?.toolCallId);
      if (refused) return refusalAsToolResult(refused);
      return await callTool(declared, input,
        async (use) => await settled(execute.call(tool, use, callOptions)), callOptions?.abortSignal);
    },
  };
  if (hold === "approval" && irreversible) {
    const own = tool.needsApproval;
    wrapped["needsApproval"] = async (input: ToolArgs, approvalOptions: { toolCallId: string }) => {
      if (await needsApproval(declared, input, approvalOptions.toolCallId)) return true;
      // The app's own approval rule still applies to a call undolog lets through.
      return typeof own === "function" ? await own(input as never, approvalOptions as never) : Boolean(own);
    };
  }
  return wrapped as unknown as UndologAiTool<T>;
}

/** Wrap each tool with the declaration `tiers` gives for its name; a tool left out takes
 * `options.default`, and without one it is an error (no tool reaches the world undeclared). */
export function wrapTools<T extends ToolSet>(tools: T, tiers: { [K in keyof T]?: Declaration },
  options: WrapOptions & { default?: Declaration } = {}): { [K in keyof T]: UndologAiTool<T[K]> } {
  const unknown = Object.keys(tiers).filter((name) => !(name in tools)).sort();
  if (unknown.length) throw new TypeError(`tiers names tools that are not given: ${JSON.stringify(unknown)}`);
  const out: Record<string, unknown> = {};
  for (const [name, tool] of Object.entries(tools)) {
    const declaration = tiers[name as keyof T] ?? options.default;
    if (declaration === undefined) throw new TypeError(`no tier for tool ${JSON.stringify(name)}: add it to tiers or pass default`);
    out[name] = wrapTool(name, tool as Tool<any, any>, declaration, options);
  }
  return out as { [K in keyof T]: UndologAiTool<T[K]> };
}

interface ApprovalRequestPart {
  type: "tool-approval-request";
  approvalId: string;
  toolCall: { toolCallId: string };
}

/**
 * Wait for undolog's reviewer of each call the step stopped on (`hold: "approval"`) and answer
 * them the AI SDK's way: the `tool` message of `tool-approval-response` parts to append to
 * `result.response.messages` before calling the model again (empty when none is undolog's).
 * A rejection's `reason` is `"DENIED: <reason>"`, which the model reads. Call it inside the
 * session the step belongs to; approval requests that are not undolog's are left to you.
 */
export async function decisions(result: { content: readonly unknown[] }, options: DecisionOptions = {}): Promise<ModelMessage[]> {
  const parts: { type: "tool-approval-response"; approvalId: string; approved: boolean; reason?: string }[] = [];
  for (const part of result.content as ApprovalRequestPart[]) {
    if (part?.type !== "tool-approval-request") continue;
    const decision = await decisionOf_(part.toolCall.toolCallId, options);
    if (!decision) continue;
    parts.push({ type: "tool-approval-response", approvalId: part.approvalId, approved: decision.approved,
      ...(decision.message ? { reason: decision.message } : {}) });
  }
  return parts.length ? [{ role: "tool", content: parts } as ModelMessage] : [];
}
