"""Approval rules: CEL conditions over a call that decide it before a person has to.

An org's rules are walked in `position` order on every irreversible call that would wait for
a person (budgets are checked first, so no rule can approve past a cap). The first rule in
`enforce` mode whose condition is true decides: `approve` (decided at once, `decided_by =
"rule:<name>"`), `deny` (refused with the rule's message, a `Refusal` of kind `rule`) or
`require` (`approvals_required` distinct reviewers, from its `reviewer_group` if it names one:
see `approvals.groups`). Rules in `observe` mode that match on
the way are recorded on the request and as `rule.observed` events, and change nothing.

Conditions are compiled once (the `common-expression-language` package, CEL in Rust) and kept
per org in process, stamped with `Organization.config_version`: a database trigger (PostgreSQL)
or `Rule.save`/`delete` (SQLite) bumps it in the edit's own transaction, and the intercept
already holds the org (loaded with the agent's key), so finding and evaluating rules adds no
query to the intercept. A condition that cannot be evaluated for a call (a missing argument,
a wrong type) or that is not a boolean does not match: the call is left to people.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import cel
from django.core.exceptions import ValidationError
from django.db import connection, models, transaction
from django.db.models import F
from django.utils import timezone

from approvals import runaware
from budgets import day_usage
from core.errors import Invalid
from orgs.models import Agent, Event, Organization

MAX_CONDITION = 4000
MAX_RULES_PER_ORG = 500
MAX_APPROVERS = 10
# The names a condition may read (see `activation`); anything else is a 400 at save time.
VARIABLES = frozenset({"args", "tool", "agent", "run", "day", "now"})
# The functions a condition may call: CEL's own (the Rust crate's) and the run-aware ones
# (approvals/runaware.py); anything else is a 400 at save time (it would never match).
BUILTINS = frozenset({"size", "contains", "startsWith", "endsWith", "matches", "int", "uint", "double", "string",
                      "bytes", "timestamp", "duration", "type", "dyn", "getDayOfWeek", "getDayOfMonth",
                      "getDayOfYear", "getFullYear", "getMonth", "getDate", "getHours", "getMinutes", "getSeconds",
                      "getMilliseconds"})
FUNCTIONS = BUILTINS | runaware.FUNCTIONS
_NO_ARGUMENT = re.compile(rf"(?<![.\w])({'|'.join(runaware.NEEDS_ARGUMENT)})\s*\(\s*\)")
_WINDOW = re.compile(r"\bwindow\s*\(\s*(\"[^\"]*\"|'[^']*')\s*\)")
_READS_CALLS = re.compile(r"\brun\s*\.\s*calls\b")
_LITERAL = re.compile(r"\"([^\"]*)\"|'([^']*)'")
_READS_INPUTS = re.compile(r"\brun\s*\.\s*inputs\b")
_POSITION = re.compile(r"<input>:(\d+):(\d+): (.*?)(?:\n|$)")
# The variable a macro binds (`args.items.exists(x, x > 5)`): the compiler lists it with the free names.
_BINDER = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,")


class ConditionError(Invalid):
    """A condition that does not compile: 400 `invalid_condition`, naming line and column."""

    code = "invalid_condition"

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        where = f" at line {line}, column {column}" if line else ""
        super().__init__({"condition": f"{message}{where}."}, f"The condition does not compile{where}: {message}.")
        self.extra.update(line=line, column=column)


def compile_condition(source: str) -> Any:
    """The compiled program, or ConditionError with the position the parser names."""
    if not isinstance(source, str) or not source.strip():
        raise ConditionError("a condition is required (e.g. tool.name == \"refund\" && args.amount <= 50)")
    if len(source) > MAX_CONDITION:
        raise ConditionError(f"a condition has at most {MAX_CONDITION} characters")
    try:
        program = cel.compile(source)
    except (ValueError, RuntimeError) as exc:
        found = _POSITION.search(str(exc))
        if found is None:
            raise ConditionError(str(exc).splitlines()[0][:300]) from None
        raise ConditionError(found.group(3).strip()[:300], int(found.group(1)), int(found.group(2))) from None
    unknown = sorted(set(program.variables()) - VARIABLES - set(_BINDER.findall(source)))
    if unknown:
        raise ConditionError(f"unknown name {unknown[0]!r}: a condition reads {', '.join(sorted(VARIABLES))}",
                             *_where(source, unknown[0]))
    _check_functions(source, program)
    return program


def _check_functions(source: str, program: Any) -> None:
    """Unknown functions, run-aware ones called with nothing, and windows that are not durations:
    each a 400 now rather than a rule that silently never matches."""
    named = [f for f in program.functions() if f[:1].isalpha()]
    unknown = sorted(set(named) - FUNCTIONS)
    if unknown:
        raise ConditionError(f"unknown function {unknown[0]!r}: a condition calls "
                             f"{', '.join(sorted(runaware.FUNCTIONS))} and CEL's own", *_where(source, unknown[0]))
    empty = _NO_ARGUMENT.search(source)
    if empty:
        raise ConditionError(f"{empty.group(1)}() needs a value, e.g. {empty.group(1)}(args.to)",
                             *_where(source, empty.group(1)))
    for literal in _WINDOW.findall(source):
        try:
            runaware.duration(literal[1:-1])
        except ValueError as exc:
            raise ConditionError(str(exc), *_where(source, "window")) from None


def reads_of(source: str, program: Any) -> frozenset[str]:
    """What of the run a condition reads beyond its counters (each costs a query or more)."""
    functions = set(program.functions())
    reads = {name for name in ("tainted", "requested", "read_untrusted", "asked", "window") if name in functions}
    if _READS_CALLS.search(source):
        reads.add("calls")
    if _READS_INPUTS.search(source):
        reads.add("inputs")
    return frozenset(reads)


def _where(source: str, name: str) -> tuple[int | None, int | None]:
    found = re.search(rf"\b{re.escape(name)}\b", source)
    if found is None:
        return None, None
    before = source[: found.start()]
    return before.count("\n") + 1, found.start() - (before.rfind("\n") + 1) + 1


# ---------------------------------------------------------------- models


class RuleQuerySet(models.QuerySet):
    def for_org(self, org: Organization) -> RuleQuerySet:
        return self.filter(org=org)

    def in_order(self) -> RuleQuerySet:
        return self.order_by("position", "created")


class Rule(models.Model):
    """One approval rule of an org (optionally of one agent or one tool): a CEL condition and
    what happens to a call it matches. Rules are walked by `position`; the first enforcing
    match decides. Edits go through `Rule.change()` so each one leaves a `RuleChange`."""

    class Outcome(models.TextChoices):
        APPROVE = "approve"
        DENY = "deny"
        REQUIRE = "require"
        # A compensable call runs at once and a person reviews it after (issue 38); rejected, it is
        # undone. On an irreversible call (a rule without `tool` may match one) it holds, as require.
        FLAG = "flag"

    class Mode(models.TextChoices):
        ENFORCE = "enforce"
        OBSERVE = "observe"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="rules")
    name = models.SlugField(max_length=64, help_text="Shown as decided_by 'rule:<name>'.")
    position = models.PositiveIntegerField(default=0, help_text="Lower first; the first enforcing match decides.")
    condition = models.TextField(help_text='CEL, e.g. tool.name == "refund" && args.amount <= 50')
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    approvals_required = models.PositiveSmallIntegerField(default=1, help_text="require: distinct approvers.")
    reviewer_group = models.ForeignKey("approvals.ReviewerGroup", null=True, blank=True, on_delete=models.PROTECT,
                                       related_name="rules",
                                       help_text="require: only this group's members may approve.")
    message = models.TextField(blank=True, help_text="Told to the agent (deny) and shown to reviewers.")
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.ENFORCE)
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.CASCADE, related_name="rules",
                              help_text="Empty: every agent of the org.")
    tool = models.CharField(max_length=200, blank=True, help_text="A tool name; empty: every tool.")
    created = models.DateTimeField(default=timezone.now, editable=False)
    updated = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=200, blank=True)

    objects = RuleQuerySet.as_manager()

    class Meta:
        ordering = ["position", "created"]
        constraints = [models.UniqueConstraint(fields=["org", "name"], name="rule_name_unique_in_org")]

    def __str__(self) -> str:
        return f"rule {self.name} ({self.outcome}, {self.mode})"

    FIELDS = ("name", "position", "condition", "outcome", "approvals_required", "reviewer_group", "message", "mode",
              "agent", "tool")

    def settings(self) -> dict[str, Any]:
        return {"name": self.name, "position": self.position, "condition": self.condition,
                "outcome": self.outcome, "approvals_required": self.approvals_required,
                "reviewer_group": self.reviewer_group.name if self.reviewer_group_id else None,
                "message": self.message, "mode": self.mode,
                "agent": self.agent.name if self.agent_id else None, "tool": self.tool or None}

    def as_dict(self) -> dict[str, Any]:
        return {"id": str(self.id), **self.settings(), "created": self.created.isoformat(),
                "updated": self.updated.isoformat(), "updated_by": self.updated_by or None}

    def clean(self) -> None:
        """The admin's check: the same compile as the API's, as a form error on the field."""
        try:
            compile_condition(self.condition)
        except ConditionError as exc:
            raise ValidationError({"condition": exc.extra["fields"]["condition"]}) from None
        if self.agent_id and self.org_id and self.agent.org_id != self.org_id:
            raise ValidationError({"agent": "The agent belongs to another organization."})
        if self.reviewer_group_id and self.org_id and self.reviewer_group.org_id != self.org_id:
            raise ValidationError({"reviewer_group": "The group belongs to another organization."})
        if self.reviewer_group_id and self.outcome != self.Outcome.REQUIRE:
            raise ValidationError({"reviewer_group": "Only a require rule hands calls to a reviewer group."})

    def save(self, *args: Any, **kwargs: Any) -> None:
        with transaction.atomic():
            super().save(*args, **kwargs)
            bump_config_version(self.org_id)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        with transaction.atomic():
            deleted = super().delete(*args, **kwargs)
            bump_config_version(self.org_id)
            return deleted

    # ------------------------------------------------------------ edits, each with its history row

    @classmethod
    def add(cls, org: Organization, settings: dict[str, Any], actor: str) -> Rule:
        rule = cls(org=org, updated_by=actor, **settings)
        compile_condition(rule.condition)
        with transaction.atomic():
            rule.save()
            rule._audit("created", {name: [None, value] for name, value in rule.settings().items()}, actor)
        return rule

    def change(self, changes: dict[str, Any], actor: str) -> None:
        """Save the changed settings, a `RuleChange` (who, each setting from → to) and a
        `rule.changed` event. An edit that changes nothing records nothing."""
        before = self.settings()
        for name, value in changes.items():
            setattr(self, name, value)
        if "condition" in changes:
            compile_condition(self.condition)
        after = self.settings()
        diff = {name: [before[name], after[name]] for name in after if before[name] != after[name]}
        if not diff:
            return
        self.updated_by = actor
        with transaction.atomic():
            self.save()
            self._audit("changed", diff, actor)

    def remove(self, actor: str) -> None:
        with transaction.atomic():
            self._audit("deleted", {name: [value, None] for name, value in self.settings().items()}, actor)
            self.delete()

    def _audit(self, action: str, diff: dict[str, Any], actor: str) -> None:
        RuleChange.objects.create(org_id=self.org_id, rule_id=self.id, rule_name=self.name, action=action,
                                  actor=actor, changes=diff)
        Event.record(self.org, "rule.changed", rule=str(self.id), name=self.name, action=action, by=actor,
                     changes=diff)


class RuleChange(models.Model):
    """Append-only history of rule edits: who created, changed or deleted which rule, and how
    (each setting from → to). Kept after the rule is deleted."""

    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", editable=False)
    rule_id = models.UUIDField(db_index=True, editable=False)
    rule_name = models.CharField(max_length=100, editable=False)
    action = models.CharField(max_length=16, editable=False)
    actor = models.CharField(max_length=200, editable=False)
    changes = models.JSONField(default=dict, editable=False)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} rule {self.rule_name}"

    def as_dict(self) -> dict[str, Any]:
        return {"rule": str(self.rule_id), "name": self.rule_name, "action": self.action, "by": self.actor,
                "changes": self.changes, "at": self.created.isoformat()}


def bump_config_version(org_id: Any) -> None:
    """SQLite has no trigger (orgs/0003): bump the org's version here, in the edit's transaction.
    On PostgreSQL the trigger on approvals_rule already did."""
    if connection.vendor != "postgresql":
        Organization.objects.filter(pk=org_id).update(config_version=F("config_version") + 1)


# ---------------------------------------------------------------- the cache


class GroupRef(NamedTuple):
    """The reviewer group a require rule names, as the intercept needs it (no query)."""

    id: uuid.UUID
    name: str


@dataclass(frozen=True)
class CompiledRule:
    """A rule as the intercept uses it: settings and its compiled program, no model instance."""

    id: uuid.UUID
    name: str
    outcome: str
    mode: str
    approvals_required: int
    reviewer_group: GroupRef | None
    message: str
    agent_id: uuid.UUID | None
    tool: str
    program: Any
    variables: frozenset[str]
    reads: frozenset[str] = frozenset()
    source: str = ""

    def concerns(self, agent_id: Any, tool_name: str) -> bool:
        return (self.agent_id is None or self.agent_id == agent_id) and (not self.tool or self.tool == tool_name)

    def matches(self, context: Any) -> bool:
        """True only for a boolean true: an error or another type leaves the call to people."""
        try:
            return self.program.execute(context) is True
        except Exception:  # CEL's runtime errors (no such key, bad operands) all mean "no match"
            return False


@dataclass
class RuleSet:
    version: int
    rules: list[CompiledRule] = field(default_factory=list)
    sees_compensable: bool = False


_RULESETS: dict[uuid.UUID, RuleSet] = {}


def compiled(rule: Rule) -> CompiledRule | None:
    try:
        program = compile_condition(rule.condition)
    except ConditionError:
        return None  # saved past the API (raw SQL): such a rule matches nothing
    group = GroupRef(rule.reviewer_group_id, rule.reviewer_group.name) if rule.reviewer_group_id else None
    return CompiledRule(rule.id, rule.name, rule.outcome, rule.mode, rule.approvals_required, group,
                        rule.message, rule.agent_id, rule.tool, program, frozenset(program.variables()),
                        reads_of(rule.condition, program), rule.condition)


def rules_of(org: Organization) -> list[CompiledRule]:
    """The org's rules in order, compiled, as of `org.config_version` (a query only when that
    changed since this process last loaded them). The rows are read after the version, so a
    racing edit can only make them newer than their stamp, and the next call loads again."""
    found = _RULESETS.get(org.id)
    if found is not None and found.version == org.config_version:
        return found.rules
    rows = Rule.objects.filter(org_id=org.id).select_related("reviewer_group").in_order()
    rules = [c for c in map(compiled, rows) if c is not None]
    compensable = _compensable_names(org.id) if any(_may_hold(r) for r in rules) else set()
    _RULESETS[org.id] = RuleSet(org.config_version, rules, any(names_compensable(r, compensable) for r in rules))
    return rules


def _may_hold(rule: CompiledRule) -> bool:
    return rule.mode == Rule.Mode.ENFORCE and rule.outcome in (Rule.Outcome.REQUIRE, Rule.Outcome.DENY,
                                                                 Rule.Outcome.FLAG)


def _compensable_names(org_id: Any) -> set[str]:
    """The names and labels of the org's compensable tools: a rule naming either names them."""
    from effects.models import Tier, Tool

    rows = Tool.objects.filter(org_id=org_id, tier=Tier.COMPENSABLE).values_list("name", "labels")
    return {name for name, _ in rows} | {label for _, labels in rows for label in labels or ()}


def names_compensable(rule: CompiledRule, compensable: set[str]) -> bool:
    """An enforcing require or deny rule that names compensable calls: by its `tool`, by a
    compensable tool's name or label in its condition (`"external" in tool.labels`), or by the
    word "compensable" (`tool.tier == "compensable"`). Such a rule makes the org's compensable
    calls go through the rules (a label an irreversible tool shares only costs the fast path)."""
    if not _may_hold(rule):
        return False
    if rule.outcome == Rule.Outcome.FLAG:
        return True  # a flag rule decides nothing but compensable calls
    if rule.tool:
        return rule.tool in compensable
    literals = {a or b for a, b in _LITERAL.findall(rule.source)}
    return "compensable" in literals or bool(literals & compensable)


def sees_compensable(org: Organization) -> bool:
    """Whether the org's rules decide its compensable calls too (else they take the fast path)."""
    rules_of(org)
    return _RULESETS[org.id].sees_compensable


def rules_see_compensable(org_id: Any, tools: dict[str, Any]) -> bool:
    """The fast path's reading of `sees_compensable`, from the rows (its config cache has the tools
    and is stamped with the same `config_version` as the rules)."""
    compensable = {name for name, tool in tools.items() if tool.tier == "compensable"}
    compensable |= {label for tool in tools.values() if tool.tier == "compensable" for label in tool.labels or ()}
    rows = Rule.objects.filter(org_id=org_id, mode=Rule.Mode.ENFORCE,
                               outcome__in=[Rule.Outcome.REQUIRE, Rule.Outcome.DENY, Rule.Outcome.FLAG]
                               ).select_related("reviewer_group")
    return any(names_compensable(c, compensable) for c in map(compiled, rows) if c is not None)


# ---------------------------------------------------------------- evaluation


@dataclass
class Verdict:
    """What the rules say about one call: the deciding rule (None: people decide as usual),
    the observe-mode rules that matched before it, and why (what `tainted()` found)."""

    rule: CompiledRule | None = None
    observed: list[CompiledRule] = field(default_factory=list)
    why: list[dict[str, Any]] = field(default_factory=list)

    def observations(self) -> list[dict[str, Any]]:
        return [{"rule": r.name, "outcome": r.outcome, "approvals_required": r.approvals_required}
                for r in self.observed]


def now_in(org: Organization, moment=None) -> dict[str, Any]:
    """`now` in conditions: the org's wall clock. weekday: 1 Monday … 7 Sunday (ISO)."""
    local = (moment or timezone.now()).astimezone(org.tz)
    return {"hour": local.hour, "minute": local.minute, "weekday": local.isoweekday(),
            "date": local.date().isoformat(), "time_zone": org.time_zone}


def tool_of(tool: Any) -> dict[str, Any]:
    return {"name": tool.name, "tier": tool.tier, "risk_tags": list(tool.risk_tags or []),
            "cost_weight": float(tool.cost_weight), "irreversible": bool(tool.irreversible),
            "labels": list(tool.labels or []), "asked": list(getattr(tool, "asked", None) or [])}


def run_of(session: Any, view: runaware.RunView | None = None, reads: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The run's counters as the budget guard left them (this call included), and what of its
    history some rule reads (`calls`, `inputs`)."""
    run = {"tool_calls": session.tool_calls, "irreversible_calls": session.irreversible_calls,
           "cost": float(session.cost), "step_index": session.step_index,
           "tool_counts": dict(session.tool_counts or {}), "started_by": session.started_by or "",
           "metadata": session.metadata or {}}
    if "inputs" in reads:
        run["inputs"] = session.inputs
    if "calls" in reads and view is not None:
        run["calls"] = view.calls()
    return run


def evaluate(rules: list[CompiledRule], activation: dict[str, Any],
             view: runaware.RunView | None = None) -> Verdict:
    """Walk the rules in order: observe-mode matches are noted, the first enforcing match decides."""
    verdict = Verdict()
    try:
        context = cel.Context(activation, view.functions() if view is not None else None)
    except Exception:  # args CEL cannot hold (an integer past 64 bits): people decide
        return verdict
    for rule in rules:
        if view is not None:
            view.hits, view.unrequested, view.unasked, view.untrusted_read = [], None, None, None
        if not rule.matches(context):
            continue
        if rule.mode == Rule.Mode.OBSERVE:
            verdict.observed.append(rule)
            continue
        verdict.rule = rule
        verdict.why = [{"rule": rule.name, "message": rule.message,
                        "tainted": _distinct(view.hits if view is not None else [])}]
        if view is not None and view.unrequested:
            # `requested()` said no on the way: not named in the user's request, and why.
            verdict.why[0].update(requested=False, requested_reason=view.unrequested)
        if view is not None:
            verdict.why[0].update(_because(view))
        break
    return verdict


def _because(view: runaware.RunView) -> dict[str, Any]:
    """What `asked()` and `read_untrusted()` found on the way to the deciding rule, for `why`: e.g.
    "the request never asked for update_password (it says none of: password); the run read untrusted
    text at step 3 (read_inbox)"."""
    found: dict[str, Any] = {}
    said = []
    if view.unasked:
        found.update(asked=False, asked_reason=view.unasked)
        said.append(view.unasked)
    if view.untrusted_read is not None:
        source = view.untrusted_read
        found["read_untrusted"] = {"step": source.step_index, "tool": source.tool}
        said.append(f"the run read untrusted text at step {source.step_index} ({source.tool})")
    if said:
        found["because"] = "; ".join(said)
    return found


def _distinct(hits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen, kept = set(), []
    for hit in hits:
        key = (hit["arg"], hit["token"])
        if key not in seen:
            seen.add(key)
            kept.append(hit)
    return kept


def decide(org: Organization, agent: Agent, session: Any, tool: Any, args: dict[str, Any],
           effect: Any = None, step_index: int | None = None, taint: Any = None) -> Verdict:
    """The verdict for a call on the intercept path (no query: see the module docstring; only a
    rule that reads `day`, `run.calls`, `tainted()` or `window()` costs what it reads, when it is
    wanted). `taint`: the run's fingerprints before this step, when the caller read them already."""
    rules = [r for r in rules_of(org) if r.concerns(agent.id, tool.name)]
    if not rules:
        return Verdict()
    wanted = frozenset().union(*(r.variables for r in rules))
    reads = frozenset().union(*(r.reads for r in rules))
    view = None
    if reads or "run" in wanted:
        step = step_index if step_index is not None else getattr(effect, "step_index", session.step_index)
        view = runaware.RunView(session, agent.id, step_index=step, moment=timezone.now(),
                                exclude=getattr(effect, "pk", None), args=args, taint=taint)
        view.tool = tool
    # Only what some rule reads (the day's usage costs a query; the rest, copies and a time zone).
    builders = {"args": lambda: args, "tool": lambda: tool_of(tool), "agent": lambda: {"name": agent.name},
                "run": lambda: run_of(session, view, reads), "now": lambda: now_in(org),
                "day": lambda: day_of(org, agent)}
    return evaluate(rules, {name: build() for name, build in builders.items() if name in wanted},
                    view if reads else None)


def day_of(org: Organization, agent: Agent) -> dict[str, Any]:
    return usage_of(day_usage.today(org, [agent.id]).get(agent.id))


def usage_of(usage: Any) -> dict[str, Any]:
    """`day` in conditions: a day's usage (None: nothing that day)."""
    if usage is None:
        return {"tool_calls": 0, "irreversible_calls": 0, "cost": 0.0}
    return {"tool_calls": usage.tool_calls, "irreversible_calls": usage.irreversible_calls,
            "cost": float(usage.cost)}
