/** Scripted models for the adapters' tests: each plays its steps in order (tool calls, or a
 * final text) in the framework's real agent loop, and keeps what it was given. */

import type { Model, ModelRequest, ModelResponse } from "@openai/agents";
import { Usage } from "@openai/agents";
import { MockLanguageModelV3 } from "ai/test";

export type Prompt = { role: string; content: unknown }[];
export type Step = { call: string; input: Record<string, unknown> }[] | string;

/** A model that plays `steps` in order (tool calls, or a final text) and keeps every prompt it read. */
export function scriptedModel(steps: Step[]) {
  const prompts: Prompt[] = [];
  let n = 0;
  const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
    outputTokens: { total: 1, text: 1, reasoning: 0 } };
  const model = new MockLanguageModelV3({
    doGenerate: async (options) => {
      prompts.push(options.prompt as Prompt);
      const step = steps[n++] ?? "done";
      if (typeof step === "string") {
        return { content: [{ type: "text", text: step }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] };
      }
      return {
        content: step.map((c, i) => ({ type: "tool-call" as const, toolCallId: `call-${n}-${i}`, toolName: c.call,
          input: JSON.stringify(c.input) })),
        finishReason: { unified: "tool-calls", raw: "tool_calls" }, usage, warnings: [],
      };
    },
  });
  return { model, prompts };
}

/** The tool results the model read in a prompt: [toolName, what it read]. */
export function toolResults(prompt: Prompt | undefined): [string, unknown][] {
  const out: [string, unknown][] = [];
  for (const message of prompt ?? []) {
    if (message.role !== "tool") continue;
    for (const part of message.content as Record<string, any>[]) {
      if (part["type"] !== "tool-result") continue;
      const output = part["output"] as Record<string, any>;
      out.push([part["toolName"], output["type"] === "execution-denied" ? output["reason"] : output["value"]]);
    }
  }
  return out;
}

// -- the Agents SDK ------------------------------------------------------------------------

/** A `Model` that plays `steps` in order (tool calls, or a final message) and keeps every request. */
export class ScriptedModel implements Model {
  readonly requests: ModelRequest[] = [];
  private n = 0;
  constructor(private readonly steps: Step[]) {}

  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    this.requests.push(request);
    const step = this.steps[this.n++] ?? "done";
    const output = typeof step === "string"
      ? [{ type: "message" as const, role: "assistant" as const, status: "completed" as const, id: `m-${this.n}`,
        content: [{ type: "output_text" as const, text: step }] }]
      : step.map((c, i) => ({ type: "function_call" as const, callId: `call-${this.n}-${i}`, name: c.call,
        arguments: JSON.stringify(c.input), status: "completed" as const, id: `fc-${this.n}-${i}` }));
    return { usage: new Usage(), output, responseId: `r-${this.n}` };
  }

  // eslint-disable-next-line require-yield
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("the scripted model does not stream");
  }

  /** The tool outputs the model read in its last request: [call id, text]. */
  read(index = -1): string[] {
    const input = this.requests.at(index)?.input;
    if (!Array.isArray(input)) return [];
    return input.filter((item: any) => item.type === "function_call_result").map((item: any) => {
      const output = item.output;
      return typeof output === "string" ? output : String(output?.text ?? JSON.stringify(output));
    });
  }
}
