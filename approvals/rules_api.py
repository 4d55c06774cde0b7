"""The rules API (`/api/v1/rules`): list and read (viewers), try (reviewers), write (admins).

A rule's edits go through `Rule.add`, `Rule.change` and `Rule.remove`, which write the
`RuleChange` history row and the `rule.changed` event; a condition that does not compile is
a 400 `invalid_condition` naming its line and column.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from approvals import shapes, trial
from approvals.groups import ReviewerGroup
from approvals.rules import MAX_APPROVERS, MAX_CONDITION, MAX_RULES_PER_ORG, Rule, RuleChange
from core.errors import Conflict, Invalid
from core.schema import errors, ok
from core.validation import StrictSerializer, StringField, validated
from effects.models import Tier, Tool
from orgs.auth import IsAdmin, IsMember, IsReviewer
from orgs.models import Agent
from orgs.views import OrgScopedViewSet


class RuleSerializer(StrictSerializer):
    name = serializers.RegexField(r"^[A-Za-z0-9_-]{1,64}$", error_messages={
        "invalid": "Letters, digits, - and _ only, at most 64 characters (it shows as rule:<name>)."})
    condition = StringField(max_length=MAX_CONDITION, trim_whitespace=False)  # positions point into it as sent
    outcome = serializers.ChoiceField(choices=Rule.Outcome.choices)
    approvals_required = serializers.IntegerField(min_value=1, max_value=MAX_APPROVERS, required=False, default=1)
    reviewer_group = StringField(max_length=64, required=False, allow_null=True, default=None)
    message = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    mode = serializers.ChoiceField(choices=Rule.Mode.choices, required=False, default=Rule.Mode.ENFORCE)
    position = serializers.IntegerField(min_value=0, max_value=1_000_000, required=False)
    agent = StringField(max_length=100, required=False, allow_null=True, default=None)
    tool = StringField(max_length=200, required=False, allow_null=True, default=None)


class TrialSerializer(StrictSerializer):
    condition = StringField(max_length=MAX_CONDITION, trim_whitespace=False)  # positions point into it as sent
    outcome = serializers.ChoiceField(choices=Rule.Outcome.choices, required=False, default=Rule.Outcome.APPROVE)
    days = serializers.IntegerField(min_value=1, max_value=90, required=False, default=7)
    agent = StringField(max_length=100, required=False, allow_null=True, default=None)
    tool = StringField(max_length=200, required=False, allow_null=True, default=None)


def _scope(org, data: dict[str, Any]) -> dict[str, Any]:
    """The rule's agent, reviewer group and tool names as rows of the org (400 if there is none)."""
    scoped: dict[str, Any] = {}
    for field, rows, what in (("agent", Agent.objects, "agent"), ("reviewer_group", ReviewerGroup.objects,
                                                                     "reviewer group")):
        if field not in data:
            continue
        name = data[field]
        scoped[field] = rows.for_org(org).filter(name=name).first() if name else None
        if name and scoped[field] is None:
            raise Invalid({field: f"No {what} named {name!r} in this organization."},
                          f"{field}: no {what} named {name!r} in this organization.")
    if "tool" in data:
        name = data["tool"] or ""
        tier = Tool.objects.for_org(org).filter(name=name).values_list("tier", flat=True).first() if name else None
        if name and tier is None:
            raise Invalid({"tool": f"No tool named {name!r} is registered."}, f"tool: no tool named {name!r}.")
        if tier == Tier.SAFE:  # SAFE calls are reported, never intercepted: no rule can see one
            raise Invalid({"tool": f"{name} is safe: rules decide irreversible and compensable calls."},
                          f"tool: {name} is safe; rules decide irreversible and compensable calls.")
        scoped["tool"] = name
    return {**data, **scoped}


def _check_group(outcome: str, group: ReviewerGroup | None) -> None:
    if group is not None and outcome != Rule.Outcome.REQUIRE:
        raise Invalid({"reviewer_group": "Only a require rule hands calls to a reviewer group."},
                      f"reviewer_group: only a require rule hands calls to a reviewer group (this one would "
                      f"{outcome}); set outcome to require, or reviewer_group to null.")


def _check_flag(org, outcome: str, tool: str) -> None:
    """`flag` lets a call run and reviews it after: only a compensable call can be undone then."""
    if outcome != Rule.Outcome.FLAG or not tool:
        return
    tier = Tool.objects.for_org(org).filter(name=tool).values_list("tier", flat=True).first()
    if tier == Tier.IRREVERSIBLE:
        raise Invalid({"outcome": f"flag lets a call run and reviews it after, so it needs an undo: {tool} is "
                                  "irreversible (use require to hold it)."},
                      f"outcome: flag on {tool}, an irreversible tool; use require to hold it.")


def _name_taken(name: str) -> Conflict:
    return Conflict(f"A rule named {name!r} exists in this organization; names are unique (decided_by "
                    "says rule:<name>).", code="rule_exists")


RULE_EXAMPLE = OpenApiExample("small refunds", request_only=True, value={
    "name": "small-refunds", "condition": 'tool.name == "refund" && args.amount <= 50', "outcome": "approve",
    "message": "Refunds up to 50 need no person.", "mode": "enforce"})
GROUP_RULE_EXAMPLE = OpenApiExample("large refunds to finance", request_only=True, value={
    "name": "large-refunds", "condition": 'tool.name == "refund" && args.amount > 1000', "outcome": "require",
    "approvals_required": 2, "reviewer_group": "finance", "message": "Two people from finance approve these."})


class RuleViewSet(OrgScopedViewSet):
    """An org's approval rules, in order: the first enforcing match decides an irreversible call."""

    queryset = Rule.objects.select_related("agent", "reviewer_group")
    not_found = ("rule_not_found", "No such rule.")
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_permissions(self):
        if self.action in ("create", "partial_update", "destroy"):
            return [IsAdmin()]
        if self.action == "trial":
            return [IsReviewer()]
        return [IsMember()]

    @extend_schema(operation_id="v1_rules_list", summary="List the rules, in the order they are walked",
                   tags=["rules"], responses=ok(shapes.RuleListDict))
    def list(self, request: Request) -> Response:
        return Response({"rules": [rule.as_dict() for rule in self.get_queryset().in_order()]})

    @extend_schema(summary="Read a rule with its change history", tags=["rules"],
                   responses={**ok(shapes.RuleDetailDict), **errors(404, codes={404: ["rule_not_found"]})})
    def retrieve(self, request: Request, pk: str) -> Response:
        rule = self.get_object()
        changes = RuleChange.objects.filter(org=self.org, rule_id=rule.id)[:50]
        return Response({**rule.as_dict(), "changes": [change.as_dict() for change in changes]})

    @extend_schema(summary="Add a rule (admins)", tags=["rules"], request=RuleSerializer,
                   examples=[RULE_EXAMPLE, GROUP_RULE_EXAMPLE],
                   responses={**ok(shapes.RuleDict, 201),
                              **errors(400, 409, codes={400: ["invalid", "invalid_condition"], 409: ["rule_exists"]})})
    def create(self, request: Request) -> Response:
        data = _scope(self.org, validated(RuleSerializer, request.data))
        if Rule.objects.for_org(self.org).count() >= MAX_RULES_PER_ORG:
            raise Invalid({"name": f"An organization has at most {MAX_RULES_PER_ORG} rules."},
                          f"An organization has at most {MAX_RULES_PER_ORG} rules; delete one first.")
        if "position" not in data:
            last = Rule.objects.for_org(self.org).in_order().values_list("position", flat=True).last()
            data["position"] = 0 if last is None else last + 10  # after the last, with room between
        data["tool"] = data.get("tool") or ""
        _check_group(data["outcome"], data.get("reviewer_group"))
        _check_flag(self.org, data["outcome"], data["tool"])
        try:
            with transaction.atomic():
                rule = Rule.add(self.org, data, actor=self.caller.label)
        except IntegrityError:
            raise _name_taken(data["name"]) from None
        return Response(rule.as_dict(), status=201)

    @extend_schema(summary="Change a rule (admins); the change is audited", tags=["rules"], request=RuleSerializer,
                   responses={**ok(shapes.RuleDict), **errors(400, 404, 409, codes={
                       400: ["invalid", "invalid_condition"], 404: ["rule_not_found"], 409: ["rule_exists"]})})
    def partial_update(self, request: Request, pk: str) -> Response:
        data = _scope(self.org, validated(RuleSerializer, request.data, partial=True))
        if not data:
            raise Invalid({"non_field_errors": "Send at least one setting to change."},
                          "Send at least one setting to change.")
        if "tool" in data:
            data["tool"] = data["tool"] or ""
        rule = self.get_object()
        _check_group(data.get("outcome", rule.outcome),
                     data.get("reviewer_group", rule.reviewer_group))
        _check_flag(self.org, data.get("outcome", rule.outcome), data.get("tool", rule.tool))
        try:
            with transaction.atomic():
                rule.change(data, actor=self.caller.label)
        except IntegrityError:
            raise _name_taken(data["name"]) from None
        return Response(rule.as_dict())

    @extend_schema(summary="Delete a rule (admins); the deletion is audited", tags=["rules"],
                   responses={204: None, **errors(404, codes={404: ["rule_not_found"]})})
    def destroy(self, request: Request, pk: str) -> Response:
        self.get_object().remove(actor=self.caller.label)
        return Response(status=204)

    @extend_schema(summary="Try a rule against the last N days of real approval requests", tags=["rules"],
                   request=TrialSerializer,
                   description="How many of the org's approval requests of the last `days` (default 7) the "
                               "condition would have approved, denied, or left to people, with examples and "
                               "how often it disagrees with what people decided. Nothing is saved.",
                   examples=[OpenApiExample("try", request_only=True, value={
                       "condition": 'tool.name == "refund" && args.amount <= 50', "outcome": "approve",
                       "days": 7})],
                   responses={**ok(shapes.RuleTrialDict), **errors(400, codes={400: ["invalid", "invalid_condition"]})})
    @action(detail=False, methods=["post"])
    def trial(self, request: Request) -> Response:
        data = _scope(self.org, validated(TrialSerializer, request.data))
        return Response(trial.trial(self.org, data["condition"], data["outcome"], data["days"],
                                    agent=data.get("agent"), tool=data.get("tool") or ""))
