"""The dashboard's Rules page: what it reads (the page's script writes through /api/v1/rules)."""

from __future__ import annotations

import json
from typing import Any

from approvals.groups import ReviewerGroup
from approvals.rules import Rule, RuleChange
from effects.models import Tier, Tool
from orgs.models import Agent, Membership, Organization


def rules_context(org: Organization) -> dict[str, Any]:
    """The org's rules in order (each with its settings as JSON for the editor), the agents and
    irreversible tools a rule may be scoped to, the last 20 audited edits, the reviewer groups
    and the reviewers who may join one. Seven queries."""
    rules = list(Rule.objects.for_org(org).select_related("agent", "reviewer_group").in_order())
    groups = list(ReviewerGroup.objects.for_org(org).prefetch_related("members__user"))
    return {
        "groups": [_group_item(group) for group in groups],
        "reviewers": list(Membership.objects.filter(org=org, role__in=[Membership.Role.REVIEWER, Membership.Role.ADMIN])
                          .order_by("user__username").values_list("user__username", flat=True)),
        "rules": [{"rule": rule, "json": json.dumps(rule.as_dict())} for rule in rules],
        "agents": list(Agent.objects.for_org(org).order_by("name").values_list("name", flat=True)),
        "rule_tools": list(Tool.objects.for_org(org).filter(tier=Tier.IRREVERSIBLE).order_by("name")
                           .values_list("name", flat=True)),
        "changes": [change.as_dict() for change in RuleChange.objects.filter(org=org)[:20]],
        "outcomes": Rule.Outcome.values,
        "modes": Rule.Mode.values,
    }


def _group_item(group: ReviewerGroup) -> dict[str, Any]:
    body = group.as_dict()  # members from the prefetch
    return {"group": group, "members": body["members"], "json": json.dumps(body)}
