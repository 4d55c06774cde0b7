/**
 * The tier model: what a tool is, and the registration body the server reads (the Python
 * SDK's `undolog.tiers`). Plain data, no network: a spec can be built, checked and printed
 * without a server. Every mistake the server would refuse throws `ToolDefinitionError` here.
 */

import { ToolDefinitionError } from "./errors.js";

/** A tool call's arguments, as the server stores and templates read them. */
export type ToolArgs = Record<string, unknown>;

export type ToolTier = "safe" | "compensable" | "irreversible";
export const TIERS: readonly ToolTier[] = ["safe", "compensable", "irreversible"];

/**
 * The undo of a compensable tool: a registered function and its args template.
 *
 * `args` values may be templates: `"{to}"` is the call's argument `to`, filled in before the
 * tool runs; `"{result.number}"` is taken from the result the call committed.
 */
export interface CompensationDescriptor {
  fnName: string;
  args?: Record<string, unknown>;
  fnVersion?: string;
  maxRetries?: number;
  retryBackoffMs?: number;
}

/** What a reviewer is shown for an irreversible tool, and its deadline policy. */
export interface ApprovalSpec {
  reason: string;
  riskTags?: readonly string[];
  /** A template like the compensation's: `"account {account_id} and its data"`. */
  estimatedImpact?: string;
  timeoutS?: number;
  autoApproveOnTimeout?: boolean;
}

/** MCP hints, as the API takes them. */
export interface ToolAnnotations {
  title?: string;
  readOnlyHint?: boolean;
  destructiveHint?: boolean;
  idempotentHint?: boolean;
  openWorldHint?: boolean;
}

/** Everything `undologTool` (and the adapters) take about a tool. */
export interface ToolDeclaration {
  name: string;
  tier: ToolTier;
  compensation?: CompensationDescriptor;
  approval?: ApprovalSpec;
  description?: string;
  costWeight?: number;
  /** A compensable tool that counts against the irreversible cap anyway. */
  irreversible?: boolean;
  annotations?: ToolAnnotations;
  /** A server-side executor: the worker runs the approved call, never this process. */
  executor?: Record<string, unknown>;
  /**
   * Free labels (`"untrusted"`, `"private"`, `"external"`...: at most 16, each 1 to 40
   * characters) that rules read as `tool.labels`. A safe tool labelled `"untrusted"` reports
   * what it returned with the next request, so a `tainted(args)` rule sees a later call that
   * carries a string others wrote (the server keeps fingerprints, not the text).
   */
  labels?: readonly string[];
  /** The keys of an untrusted tool's output that others wrote (wherever they occur); the rest
   * of the output vouches. Without them the whole output is untrusted. Sent as `untrusted_fields`. */
  untrustedFields?: readonly string[];
  /** The wire's spelling of `untrustedFields`, taken too. */
  untrusted_fields?: readonly string[];
  /** What a request says when it asks for this tool (`"password"`; `"pay"`, `"transfer"`): at most 32
   * words or phrases of 1 to 60 characters, read by the policy's `asked(tool)`. */
  asked?: readonly string[];
  /** The argument names, when known: templates naming another one throw at definition. */
  parameters?: readonly string[];
  /** @internal A before read's declaration as the server keeps it (set by `undologTool`'s `before`). */
  preImageDeclaration?: Record<string, unknown>;
}

const SEMVER = /^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$/;
const FIELD = /\{([A-Za-z_][A-Za-z0-9_]*)(?:[.[][^}]*)?\}/g;

/** A tool as registered with `POST /api/v1/tools`. */
export class ToolSpec {
  readonly name: string;
  readonly tier: ToolTier;
  readonly costWeight: number;
  readonly description: string;
  readonly irreversible: boolean | undefined;
  readonly compensation: CompensationDescriptor | undefined;
  readonly approval: ApprovalSpec | undefined;
  readonly annotations: ToolAnnotations | undefined;
  readonly executor: Record<string, unknown> | undefined;
  readonly labels: readonly string[];
  readonly untrustedFields: readonly string[];
  readonly preImage: Record<string, unknown> | undefined;
  readonly asked: readonly string[];

  constructor(declaration: ToolDeclaration) {
    this.name = declaration.name;
    this.tier = declaration.tier;
    this.costWeight = declaration.costWeight ?? 1;
    this.description = declaration.description ?? "";
    this.irreversible = declaration.irreversible;
    this.compensation = declaration.compensation;
    this.approval = declaration.approval;
    this.annotations = declaration.annotations;
    this.executor = declaration.executor;
    this.labels = copied(declaration.labels);
    this.untrustedFields = copied(declaration.untrustedFields ?? declaration.untrusted_fields);
    this.preImage = declaration.preImageDeclaration;
    this.asked = copied(declaration.asked);
    check(this, declaration.parameters);
    Object.freeze(this);
  }

  get untrusted(): boolean {
    return this.labels.includes("untrusted");
  }

  /** The tool's entry in the `{"tools": [...]}` registration body. */
  toDict(): Record<string, unknown> {
    const body: Record<string, unknown> = { name: this.name, tier: this.tier, cost_weight: this.costWeight };
    if (this.description) body["description"] = this.description;
    if (this.irreversible !== undefined) body["irreversible"] = this.irreversible;
    if (this.compensation) body["compensation"] = compensationDict(this.compensation);
    if (this.approval) body["approval"] = approvalDict(this.approval);
    if (this.annotations && Object.keys(this.annotations).length) body["annotations"] = { ...this.annotations };
    if (this.executor) body["executor"] = { ...this.executor };
    if (this.labels.length) body["labels"] = [...this.labels];
    if (this.untrustedFields.length) body["untrusted_fields"] = [...this.untrustedFields];
    if (this.preImage) body["pre_image"] = { ...this.preImage };
    if (this.asked.length) body["asked"] = [...this.asked];
    return body;
  }
}

function compensationDict(c: CompensationDescriptor): Record<string, unknown> {
  return {
    fn_name: c.fnName,
    fn_version: c.fnVersion ?? "1.0.0",
    args: { ...(c.args ?? {}) },
    max_retries: c.maxRetries ?? 3,
    retry_backoff_ms: c.retryBackoffMs ?? 1000,
  };
}

function approvalDict(a: ApprovalSpec): Record<string, unknown> {
  const body: Record<string, unknown> = {
    reason: a.reason, risk_tags: [...(a.riskTags ?? [])], estimated_impact: a.estimatedImpact ?? "",
  };
  // Absent rather than null: the server then applies the org's defaults.
  if (a.timeoutS !== undefined) body["timeout_s"] = a.timeoutS;
  if (a.autoApproveOnTimeout !== undefined) body["auto_approve_on_timeout"] = a.autoApproveOnTimeout;
  return body;
}

/** A copy of a list option; anything else is kept as given, for `check` to refuse (a string
 * spread would pass as a list of one-letter labels). */
function copied(value: readonly string[] | undefined): readonly string[] {
  if (value === undefined) return [];
  return Array.isArray(value) ? [...value] : value;
}

/** Reject combinations the server would refuse, at declaration time. */
function check(spec: ToolSpec, parameters: readonly string[] | undefined): void {
  const fail = (what: string): never => {
    throw new ToolDefinitionError(spec.name ? `${spec.name}: ${what}` : what);
  };
  if (!spec.name || typeof spec.name !== "string") fail("a tool needs a name");
  if (!TIERS.includes(spec.tier)) fail(`tier must be one of ${TIERS.join(", ")}, not ${JSON.stringify(spec.tier)}`);
  if (typeof spec.costWeight !== "number" || !(spec.costWeight >= 0)) fail("costWeight must be a number >= 0");
  if (spec.tier === "compensable" && !spec.compensation) {
    fail("a compensable tool needs a compensation ({fnName, args}): what undoes it when the run fails");
  }
  if (spec.tier === "irreversible" && !spec.approval) {
    fail("an irreversible tool needs approval: {reason} (shown to reviewers)");
  }
  if (spec.tier !== "compensable" && spec.compensation) fail("only compensable tools take a compensation");
  if (spec.tier !== "irreversible" && spec.approval) fail("approval settings apply to irreversible tools only");
  if (spec.tier === "safe" && spec.irreversible) fail("a safe tool cannot count as irreversible");
  if (spec.tier === "irreversible" && spec.irreversible === false) {
    fail("an irreversible tool always counts as irreversible");
  }
  if (!Array.isArray(spec.labels) || spec.labels.length > 16
    || spec.labels.some((label) => typeof label !== "string" || label.length < 1 || label.length > 40)) {
    fail("labels are at most 16 strings of 1 to 40 characters");
  }
  if (!Array.isArray(spec.asked) || spec.asked.length > 32
    || spec.asked.some((word) => typeof word !== "string" || !word.trim() || word.length > 60)) {
    fail("asked is at most 32 words or phrases of 1 to 60 characters");
  }
  if (!Array.isArray(spec.untrustedFields) || spec.untrustedFields.some((key) => typeof key !== "string" || !key)) {
    fail("untrustedFields are the non-empty keys of the output that others wrote");
  }
  if (spec.compensation) {
    const c = spec.compensation;
    if (!c.fnName || typeof c.fnName !== "string") fail("the compensation needs a non-empty fnName");
    if (c.fnVersion !== undefined && !SEMVER.test(c.fnVersion)) {
      fail(`fnVersion ${JSON.stringify(c.fnVersion)} is not a semver version like '1.0.0'`);
    }
    if ((c.maxRetries ?? 0) < 0 || (c.retryBackoffMs ?? 0) < 0) {
      fail("maxRetries and retryBackoffMs must not be negative");
    }
  }
  if (spec.approval) {
    if (typeof spec.approval.reason !== "string" || !spec.approval.reason.trim()) {
      fail("an irreversible tool needs a non-empty approval reason (shown to reviewers)");
    }
    if (spec.approval.timeoutS !== undefined && !(spec.approval.timeoutS > 0)) fail("approval timeoutS must be positive");
  }
  if (parameters) checkTemplates(spec, new Set(parameters), fail);
}

/** A placeholder naming no parameter would render wrong on the server, much later. */
function checkTemplates(spec: ToolSpec, known: Set<string>, fail: (what: string) => never): void {
  const used = new Set<string>();
  for (const text of strings(spec.compensation?.args ?? {})) for (const name of templateFields(text)) used.add(name);
  for (const name of templateFields(spec.approval?.estimatedImpact ?? "")) used.add(name);
  used.delete("result");
  const unknown = [...used].filter((name) => !known.has(name)).sort();
  if (unknown.length) fail(`template refers to unknown parameter(s) ${JSON.stringify(unknown)}`);
}

/** Root argument names in a template: `"{a.b} {c[0]}"` gives a and c. */
export function templateFields(template: string): string[] {
  return [...template.matchAll(FIELD)].map((match) => match[1] as string);
}

function* strings(value: unknown): Generator<string> {
  if (typeof value === "string") yield value;
  else if (Array.isArray(value)) for (const item of value) yield* strings(item);
  else if (value && typeof value === "object") for (const item of Object.values(value)) yield* strings(item);
}
