"""The one decision of an irreversible call (and of a compensable call an org's rules hold) that
passed its budget and no deny rule: by a live grant, by an approve rule, or by people, how many
of them and from which group. Every path asks it in the same order, budgets before rules
(`budgets.guard.admit`, then `approvals.rules.decide` on what the run did and read, then
`decide` here), so the paths never disagree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from approvals import rules
from approvals.models import RULE_PREFIX, grant_reason
from effects.models import Tool
from orgs.models import Organization


@dataclass
class Decision:
    """How an irreversible call that passed the budget and no deny rule is decided: by a grant
    (one reviewer's standing approval), by an approve rule, or by people (`approvals_required`
    of them, from `group` if a require rule names one). The pipeline and the fast approval path
    (lifecycle/intercept/two_statements.py) both decide with `decide`, so they never disagree."""

    rule: rules.CompiledRule | None
    approvals_required: int
    group: Any = None  # rules.GroupRef
    grant: Any = None  # approvals.models.Grant (or what reads like one: pk, label, created_by_label, reason)

    @property
    def by_rule(self) -> bool:
        return self.grant is None and self.rule is not None and self.rule.outcome == rules.Rule.Outcome.APPROVE

    @property
    def held(self) -> bool:
        """Waits for a person: the session becomes `awaiting_approval`."""
        return self.grant is None and not self.by_rule

    def label_and_reason(self) -> tuple[str, str]:
        """decided_by and the reason of a call decided at once."""
        if self.grant is not None:
            return self.grant.label, grant_reason(self.grant)
        rule = self.rule
        return f"{RULE_PREFIX}{rule.name}", rule.message or f"Approved by rule {rule.name}."

    def request_fields(self, verdict: rules.Verdict) -> dict[str, Any]:
        """`ApprovalRequest.open_for`'s keyword arguments for this decision."""
        rule = self.rule
        return {"approvals_required": self.approvals_required, "rule": rule.name if rule else "",
                "reviewer_group": self.group, "observations": verdict.observations(),
                "why": verdict.why if rule is not None and rule.outcome != "approve" else []}


def decide(org: Organization, tool: Tool, verdict: rules.Verdict, find_grant) -> Decision:
    """The decision for a call no deny rule refused. `find_grant()` (called only when a grant
    could decide: the pipeline's one indexed query) gives the live grant that matches, or None."""
    rule = verdict.rule
    required = quorum_for(org, tool, rule)
    group = rule.reviewer_group if rule is not None and rule.outcome == rules.Rule.Outcome.REQUIRE else None
    decision = Decision(rule, required, group)
    # A grant is one reviewer's standing approval: it never beats a deny rule (above), and never
    # stands in for a quorum of several people or for the reviewer group a rule names.
    if required == 1 and group is None and (rule is None or rule.outcome == rules.Rule.Outcome.REQUIRE):
        decision.grant = find_grant()
    return decision


def quorum_for(org: Organization, tool: Tool, rule: rules.CompiledRule | None) -> int:
    """Distinct approvers a call needs: the most any of its tool, its risk tags (the org's
    `approvals_by_risk_tag`) and a `require` rule ask for. A rule can raise it, never lower it."""
    tags = org.approvals_by_risk_tag or {}
    asked = [tool.approvals_required, *(tags.get(tag, 1) for tag in tool.risk_tags or [])]
    if rule is not None and rule.outcome == rules.Rule.Outcome.REQUIRE:
        asked.append(rule.approvals_required)
    return max(1, *asked)
