/** Bad declarations throw at definition, before anything reaches a server. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { ToolDefinitionError, ToolSpec, undologTool } from "../src/index.js";

describe("definition", () => {
  it("it throws at definition for a compensable tool without a compensation", () => {
    assert.throws(() => undologTool({ name: "send_email", tier: "compensable" }, async () => 1),
      (e: unknown) => e instanceof ToolDefinitionError && /send_email: a compensable tool needs a compensation/.test(e.message));
  });

  it("it throws at definition for an irreversible tool without a reason", () => {
    assert.throws(() => undologTool({ name: "delete_account", tier: "irreversible" }, async () => 1), ToolDefinitionError);
    assert.throws(() => undologTool({ name: "d", tier: "irreversible", approval: { reason: "  " } }, async () => 1),
      ToolDefinitionError);
  });

  it("it throws for settings of another tier, an unknown tier and a bad version", () => {
    assert.throws(() => new ToolSpec({ name: "r", tier: "safe", compensation: { fnName: "u" } }), ToolDefinitionError);
    assert.throws(() => new ToolSpec({ name: "r", tier: "compensable", compensation: { fnName: "u" },
      approval: { reason: "x" } }), ToolDefinitionError);
    assert.throws(() => new ToolSpec({ name: "r", tier: "dangerous" as never }), ToolDefinitionError);
    assert.throws(() => new ToolSpec({ name: "r", tier: "compensable", compensation: { fnName: "u", fnVersion: "1" } }),
      /semver/);
  });

  it("it throws for a template naming a parameter the tool does not have", () => {
    assert.throws(() => undologTool({ name: "send_email", tier: "compensable", parameters: ["to"],
      compensation: { fnName: "undo", args: { to: "{recipient}", id: "{result.id}" } } }, async () => 1),
    /unknown parameter\(s\) \["recipient"\]/);
  });

  it("it writes the registration body the server reads", () => {
    const spec = new ToolSpec({ name: "delete_account", tier: "irreversible", costWeight: 5,
      approval: { reason: "Deletes an account", riskTags: ["data-loss"], estimatedImpact: "account {account_id}" } });
    assert.deepEqual(spec.toDict(), { name: "delete_account", tier: "irreversible", cost_weight: 5,
      approval: { reason: "Deletes an account", risk_tags: ["data-loss"], estimated_impact: "account {account_id}" } });
  });
});
