"""The dashboard's Rules page: what it reads (the page's script writes through /api/v1/rules)."""

from __future__ import annotations

import json
from typing import Any

from approvals.rules import Rule, RuleChange
from effects.models import Tier, Tool
from orgs.models import Agent, Organization


def rules_context(org: Organization) -> dict[str, Any]:
    """The org's rules in order (each with its settings as JSON for the editor), the agents and
    irreversible tools a rule may be scoped to, and the last 20 audited edits. Four queries."""
    rules = list(Rule.objects.for_org(org).select_related("agent").in_order())
    return {
        "rules": [{"rule": rule, "json": json.dumps(rule.as_dict())} for rule in rules],
        "agents": list(Agent.objects.for_org(org).order_by("name").values_list("name", flat=True)),
        "rule_tools": list(Tool.objects.for_org(org).filter(tier=Tier.IRREVERSIBLE).order_by("name")
                           .values_list("name", flat=True)),
        "changes": [change.as_dict() for change in RuleChange.objects.filter(org=org)[:20]],
        "outcomes": Rule.Outcome.values,
        "modes": Rule.Mode.values,
    }
