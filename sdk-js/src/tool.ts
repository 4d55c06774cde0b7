/**
 * `undologTool`: declare a function's tier once, where it is defined (the Python SDK's
 * `@undolog_tool`).
 *
 * Outside a session the tool is the plain function: it runs, nothing is sent. Inside
 * `client.session(...)` the session decides what happens (see session.ts).
 */

import { type PreImage, type PreImageOptions, preImageFunctionName, preImageOf } from "./preimages.js";
import { type CallOptions, type DeclaredTool, SCOPE } from "./session.js";
import { type ToolArgs, type ToolDeclaration, ToolSpec } from "./tiers.js";

// Declared where they are read (a session runs a declared tool; the tier model has the args), and
// named here too, where a tool's author looks for them.
export type { DeclaredTool, ToolArgs };

/** `undologTool`'s first argument: the tool's declaration, plus how to key its calls. */
export interface ToolOptions<A extends ToolArgs = ToolArgs> extends ToolDeclaration, Partial<PreImageOptions<A>> {
  /** Your own key for a call (default: the server keys a call by tool and args). */
  idempotencyKey?: (args: A) => string;
}

/** A declared tool: call it like the function it wraps (it always answers a promise). */
export interface UndologTool<A extends ToolArgs = ToolArgs, R = unknown> extends DeclaredTool<A> {
  (args: A, options?: CallOptions): Promise<Awaited<R>>;
  /** The function as written: calling it skips undolog. */
  readonly fn: (args: A) => R;
}

/**
 * Declare a tool's tier: `undologTool({name, tier, compensation?, approval?}, fn)`.
 *
 * Throws `ToolDefinitionError` here, at definition, for a compensable tool without a
 * `compensation`, an irreversible tool without `approval.reason`, and templates naming a
 * parameter that `parameters` (when given) does not list.
 */
export function undologTool<A extends ToolArgs, R>(options: ToolOptions<A>, fn: (args: A) => R): UndologTool<A, R> {
  if (typeof fn !== "function") throw new TypeError(`${options.name}: undologTool needs the tool's function`);
  const { before, restore, restoreAbsent, check, after, maxBytes, overBound } = options;
  let preImage: PreImage | undefined;
  let declaration: ToolDeclaration = options;
  if (before) {
    preImage = preImageOf(options.name, { before, restore, restoreAbsent, check, after, maxBytes, overBound } as PreImageOptions<any>);
    declaration = { ...options, preImageDeclaration: preImage.declaration,
      compensation: options.compensation ?? { fnName: preImageFunctionName(options.name), args: {} } };
  } else if (restore || restoreAbsent) {
    throw new TypeError(`${options.name}: restore needs a before read (before)`);
  }
  const spec = new ToolSpec(declaration);
  const safe = spec.tier === "safe";
  const untrusted = spec.untrusted;
  const name = spec.name;
  // The SAFE path is inlined here: its budget is a few microseconds.
  const tool = async function (args: A, callOptions?: CallOptions): Promise<Awaited<R>> {
    const scope = SCOPE.getStore();
    if (scope === undefined) return await fn(args);
    if (safe) {
      if (!untrusted) {
        scope.session._recordSafe(name, args);
        return await fn(args);
      }
      const step = scope.session._nextStep();
      const output = await fn(args);
      scope.session._recordSafe(name, args, step, output);
      return output;
    }
    const outcome = await scope.session._callTool(tool, args, async (use) => await fn(use as A), callOptions);
    return outcome.result as Awaited<R>;
  } as UndologTool<A, R>;
  Object.defineProperties(tool, {
    name: { value: name },
    spec: { value: spec, enumerable: true },
    fn: { value: fn, enumerable: true },
    idempotencyKey: { value: options.idempotencyKey, enumerable: true },
    preImage: { value: preImage, enumerable: true },
  });
  return tool;
}

/** The spec of a declared tool, or the spec itself. */
export function specOf(tool: DeclaredTool | ToolSpec): ToolSpec {
  if (tool instanceof ToolSpec) return tool;
  if (tool && tool.spec instanceof ToolSpec) return tool.spec;
  throw new TypeError(`${String(tool)} is not an undologTool or a ToolSpec`);
}
