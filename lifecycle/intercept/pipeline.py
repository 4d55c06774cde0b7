"""The intercept pipeline: one database transaction per intercepted call (DESIGN.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from approvals import notify, rules
from approvals.models import RULE_PREFIX, ApprovalRequest, Grant, grant_reason
from budgets import guard
from budgets.models import Refusal
from core.errors import Conflict, DomainError, Invalid, NotFound
from effects import outputs
from effects.models import (
    Effect,
    SafeCall,
    Session,
    Tier,
    Tool,
    UndoEntry,
    canonical_json,
    needs_result,
    render_template,
    sha256,
)
from orgs.models import Agent, Event, Organization

ALLOWED_FIELDS = {"tool", "args", "step_index", "reasoning", "safe_calls", "idempotency_key"}
SAFE_CALL_FIELDS = {"tool", "step_index", "args", "output"}
NO_OUTPUT = object()  # a SAFE call reported without its output (an output may be null)
MAX_SAFE_CALLS = 1000
MAX_REASONING = 20_000


@dataclass
class ReportedSafeCall:
    tool: str
    step_index: int
    args: dict
    output: Any = NO_OUTPUT  # the tool's return value: only its fingerprints are kept (effects/outputs.py)

    def prints(self, tool: Tool | None, run_inputs: Any) -> outputs.Prints | None:
        """Its output's fingerprints, by its tool's labels (None: no output, or nothing in it to keep)."""
        if self.output is NO_OUTPUT:
            return None
        return outputs.prints_of_output(self.step_index, self.tool, self.output, labels=tool.labels if tool else (),
                                        untrusted_fields=tool.untrusted_fields if tool else (), args=self.args,
                                        run_inputs=run_inputs)


@dataclass
class Call:
    """A validated intercept request."""

    tool: str
    args: dict
    step_index: int
    reasoning: str = ""
    idempotency_key: str = ""
    safe_calls: list[ReportedSafeCall] = field(default_factory=list)
    args_json: str = ""  # canonical_json(args), written once: the size check, signature and digest read it

    def __post_init__(self) -> None:
        if not self.args_json:
            self.args_json = canonical_json(self.args)

    @property
    def args_digest(self) -> str:
        return sha256(self.args_json)


@dataclass
class Answer:
    status: int
    body: dict[str, Any]


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**31 - 1


def _parse_safe_calls(raw: Any, errors: dict) -> list[ReportedSafeCall]:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_SAFE_CALLS:
        errors["safe_calls"] = f"Must be a list of at most {MAX_SAFE_CALLS} {{tool, step_index, args}} objects."
        return []
    calls = []
    for n, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) - SAFE_CALL_FIELDS:
            errors[f"safe_calls[{n}]"] = "Must be an object with tool, step_index and optional args."
        elif (not isinstance(item.get("tool"), str) or not item["tool"] or len(item["tool"]) > 200
              or not _is_index(item.get("step_index"))):
            # 200: SafeCall.tool_name's column (PostgreSQL refuses longer; SQLite would not say)
            errors[f"safe_calls[{n}]"] = ("tool must be a non-empty string of at most 200 characters and "
                                          "step_index a non-negative integer.")
        elif not isinstance(item.get("args", {}), dict):
            errors[f"safe_calls[{n}]"] = "args must be an object."
        elif "output" in item and len(canonical_json(item["output"]).encode()) > settings.UNDOLOG_MAX_OUTPUT_BYTES:
            limit = settings.UNDOLOG_MAX_OUTPUT_BYTES // 1024
            errors[f"safe_calls[{n}].output"] = f"Must be at most {limit} KiB of JSON."
        else:
            calls.append(ReportedSafeCall(item["tool"], item["step_index"], item.get("args", {}),
                                          item.get("output", NO_OUTPUT)))
    return calls


def parse(data: Any) -> Call:
    """Validate the body by hand: the hot path skips DRF serializers."""
    if not isinstance(data, dict):
        raise Invalid({"non_field_errors": "The body must be a JSON object."}, "The body must be a JSON object.")
    errors: dict[str, str] = {}
    unknown = set(data) - ALLOWED_FIELDS
    if unknown:
        errors.update(dict.fromkeys(sorted(unknown), "Unknown field."))
    tool, args, step = data.get("tool"), data.get("args", {}), data.get("step_index")
    if not isinstance(tool, str) or not tool.strip() or len(tool) > 200:
        errors["tool"] = "A tool name (a non-empty string of at most 200 characters) is required."
    args_json = canonical_json(args) if isinstance(args, dict) else ""
    if not isinstance(args, dict):
        errors["args"] = "Must be a JSON object of the call's arguments."
    elif len(args_json.encode()) > settings.UNDOLOG_MAX_ARGS_BYTES:
        errors["args"] = f"Must be at most {settings.UNDOLOG_MAX_ARGS_BYTES // 1024} KiB of JSON."
    if not _is_index(step):
        errors["step_index"] = "A non-negative integer is required."
    reasoning, key = data.get("reasoning") or "", data.get("idempotency_key") or ""
    if not isinstance(reasoning, str) or len(reasoning) > MAX_REASONING:
        errors["reasoning"] = f"Must be a string of at most {MAX_REASONING} characters."
    if not isinstance(key, str) or len(key) > 200:
        errors["idempotency_key"] = "Must be a string of at most 200 characters."
    safe_calls = _parse_safe_calls(data.get("safe_calls"), errors)
    if errors:
        raise Invalid(errors, next(f"{k}: {v}" for k, v in errors.items()))
    return Call(tool=tool, args=args, step_index=step, reasoning=reasoning, idempotency_key=key,
                safe_calls=safe_calls, args_json=args_json)


def parse_safe_calls(data: Any) -> list[ReportedSafeCall]:
    """`safe_calls` sent with /complete or /fail: the run's last SAFE calls."""
    errors: dict[str, str] = {}
    calls = _parse_safe_calls(data, errors)
    if errors:
        raise Invalid(errors, next(f"{k}: {v}" for k, v in errors.items()))
    return calls


def report_safe_calls(agent: Agent, session_id: Any, reported: list[ReportedSafeCall]) -> None:
    """Charge SAFE calls that no intercept carried (those after the run's last intercept)."""
    if not reported:
        return
    with transaction.atomic():
        session = _lock_session(agent, session_id)
        names = {safe.tool for safe in reported}
        tools = {tool.name: tool for tool in Tool.objects.for_org(agent.org_id).filter(name__in=names)}
        _record_safe_calls(session, reported, tools)
        session.save(update_fields=guard.RUN_FIELDS + ["step_index", "updated"])


def call_signature(session: Session, call: Call) -> str:
    return signature_of(session.id, call)


def signature_of(session_id: Any, call: Call) -> str:
    if call.idempotency_key:
        return sha256(canonical_json([str(session_id), "idempotency_key", call.idempotency_key]))
    # canonical_json([str(session_id), call.tool, call.args]), with the args' part already written
    return sha256(f"[{canonical_json(str(session_id))},{canonical_json(call.tool)},{call.args_json}]")


def intercept(agent: Agent, session_id: Any, call: Call) -> Answer:
    """Run one call through the pipeline; a lost race on the unique signature replays."""
    try:
        with transaction.atomic():
            return _pipeline(agent, session_id, call)
    except IntegrityError:
        # Another request inserted the same signature first (the unique constraint held).
        with transaction.atomic():
            session = _lock_session(agent, session_id)
            existing = Effect.objects.filter(session=session, call_signature=call_signature(session, call)).first()
            if existing is None:
                raise
            return _replay(existing, call)


def _pipeline(agent: Agent, session_id: Any, call: Call) -> Answer:
    """1. The session must be the agent's; lock it (serialises this session's calls).
    2. Record and charge the reported SAFE calls (deduplicated by step).
    3. Same signature seen before: replay it, never execute twice.
    4. The session must be running and the agent active; the tool registered, not SAFE.
    5. Budget first: a call over a limit is refused, recorded, and not counted.
    6. Compensable: effect `executing` and its undo entry, before the answer goes out; a `flag`
       rule's call too, with an approval request of its own for review after (`_flag`).
    7. Irreversible: the org's rules decide first (approve, deny, or how many must approve),
       then effect `pending`, its approval request, session `awaiting_approval` (`_ask`);
       unless a reviewer's live grant covers it: decided at once, the session keeps running.
    """
    session = _lock_session(agent, session_id)
    names = {call.tool} | {safe.tool for safe in call.safe_calls}
    tools = {tool.name: tool for tool in Tool.objects.for_org(agent.org_id).select_related("compensation_fn")
             .filter(name__in=names)}
    _record_safe_calls(session, call.safe_calls, tools)
    signature = call_signature(session, call)
    existing = Effect.objects.filter(session=session, call_signature=signature).first()
    if existing is not None:
        if call.safe_calls:
            guard.settle(session)
            session.save(update_fields=guard.RUN_FIELDS + ["step_index", "updated"])
        return _replay(existing, call)
    _check_open(agent, session)
    tool = _tool_for(call, tools)
    session.step_index = max(session.step_index, call.step_index)
    refusal = guard.admit(session, tool, call)
    if refusal is not None:
        session.save(update_fields=guard.RUN_FIELDS + ["step_index", "updated"])
        return Answer(429, refusal)
    held = _compensable_verdict(agent, session, tool, call) if tool.tier == Tier.COMPENSABLE else None
    flagged = held is not None and held.rule.outcome == rules.Rule.Outcome.FLAG
    effect = _insert_effect(session, tool, call, signature, held=held is not None and not flagged)
    if tool.tier == Tier.COMPENSABLE:
        entry = _push_undo(session, tool, effect)
        if flagged:
            return _flag(agent, session, tool, call, effect, entry, held)
        if held is not None:
            return _ask(agent, session, tool, call, effect, held)
        session.save(update_fields=guard.RUN_FIELDS + ["step_index", "updated"])
        return executed(effect, entry)
    return _ask(agent, session, tool, call, effect)


def _compensable_verdict(agent: Agent, session: Session, tool: Tool, call: Call) -> rules.Verdict | None:
    """The verdict of an org whose rules may hold or refuse compensable calls, when a require or
    deny rule decides this one: its effect is then `pending` like an irreversible one's, with its
    undo entry on the stack (approved, it runs and is undone on rollback like any other; never
    run, the walk skips it). None: it executes at once, as in every org without such a rule."""
    if not rules.sees_compensable(agent.org):
        return None
    verdict = rules.decide(agent.org, agent, session, tool, call.args, step_index=call.step_index)
    for observed in verdict.observed:
        Event.record(agent.org, "rule.observed", agent=agent, session_id=session.pk, rule=observed.name,
                     outcome=observed.outcome, tool=tool.name, applied=False)
    if verdict.rule is None or verdict.rule.outcome == rules.Rule.Outcome.APPROVE:
        return None
    return verdict


def _ask(agent: Agent, session: Session, tool: Tool, call: Call, effect: Effect,
         verdict: rules.Verdict | None = None) -> Answer:
    """An irreversible call that passed the budget.

    1. The org's rules (cached, no query): the first enforcing match decides; observe-mode
       matches are noted on the request and as events.
    2. deny: the effect is rejected by the rule, a refusal of kind `rule` is recorded, the run
       goes on (the agent is told why, with the rule's name); the call stays counted, like a
       person's rejection, and a resubmission replays the refusal.
    3. Otherwise the approval request, with the quorum its tool, risk tags or rule ask for, and
       the reviewer group a require rule names (only its members may approve).
    4. A live grant (a single approver asked, no group, no approving rule) decides it at once as
       `grant:<id>`; the session keeps running.
    5. approve: decided at once by the rule, exactly like a person's decision (`decided_by =
       "rule:<name>"`), and the session keeps running; reviewers are not asked. Else the session
       is `awaiting_approval`.
    """
    held = verdict is not None  # a compensable call a rule holds: its observations are recorded already
    verdict = verdict or rules.decide(agent.org, agent, session, tool, call.args, effect)
    rule = verdict.rule
    for observed in [] if held else verdict.observed:
        Event.record(agent.org, "rule.observed", agent=agent, session_id=session.pk, rule=observed.name,
                     outcome=observed.outcome, tool=tool.name, effect=str(effect.id), applied=False)
    session.save(update_fields=guard.RUN_FIELDS + ["step_index", "updated"])
    if rule is not None and rule.outcome == rules.Rule.Outcome.DENY:
        return _deny(agent, session, tool, call, effect, rule)
    decision = decide(agent.org, tool, verdict,
                      lambda: Grant.objects.matching(agent.pk, tool.name, session.pk).first())
    approval = ApprovalRequest.open_for(effect, tool, session, agent_context(session, call, effect),
                                        **decision.request_fields(verdict))
    if decision.grant is not None:
        approval.approve_by_grant(decision.grant, effect)
        return granted(effect, approval)
    if decision.by_rule:
        approval.approve_at_once(effect, *decision.label_and_reason())
    else:
        session.await_approval(actor=f"agent:{agent.name}")
        notify.approval_requested(approval)
    return awaiting(effect, tool, approval)


def _flag(agent: Agent, session: Session, tool: Tool, call: Call, effect: Effect, entry: UndoEntry,
          verdict: rules.Verdict) -> Answer:
    """A compensable call a `flag` rule matched: it runs at once (effect `executing`, its undo entry
    pushed, the session running), and a request of its own opens for review after, with `why`;
    rejected, that call alone is undone (`ApprovalRequest.reject`, lifecycle/flagged.py)."""
    session.save(update_fields=guard.RUN_FIELDS + ["step_index", "updated"])
    approval = ApprovalRequest.open_for(effect, tool, session, agent_context(session, call, effect),
                                        rule=verdict.rule.name, observations=verdict.observations(),
                                        why=verdict.why, flagged=True)
    notify.approval_requested(approval)
    answer = executed(effect, entry)
    answer.body.update(flagged=True, approval={**approval.summary(), "flagged": True, "rule": verdict.rule.name})
    return answer


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


def awaiting(effect: Effect, tool: Tool, approval: ApprovalRequest) -> Answer:
    """The 202 of a call held for people or decided at once by a rule."""
    effect_body = {**effect.as_dict(), "executor": bool(tool.executor_url)}  # the worker runs it, not the caller
    if approval.decision:
        effect_body.update(decision=approval.decision, reason=approval.decision_reason or None)
    return Answer(202, {"decision": "await_approval", "effect": effect_body,
                        "approval": {**approval.summary(), "decided_by": approval.decided_by_label or None,
                                     "approvals_required": approval.approvals_required}})


def quorum_for(org: Organization, tool: Tool, rule: rules.CompiledRule | None) -> int:
    """Distinct approvers a call needs: the most any of its tool, its risk tags (the org's
    `approvals_by_risk_tag`) and a `require` rule ask for. A rule can raise it, never lower it."""
    tags = org.approvals_by_risk_tag or {}
    asked = [tool.approvals_required, *(tags.get(tag, 1) for tag in tool.risk_tags or [])]
    if rule is not None and rule.outcome == rules.Rule.Outcome.REQUIRE:
        asked.append(rule.approvals_required)
    return max(1, *asked)


def _deny(agent: Agent, session: Session, tool: Tool, call: Call, effect: Effect,
          rule: rules.CompiledRule) -> Answer:
    label = f"rule:{rule.name}"
    why = rule.message or "this call is not allowed"
    message = (f"DENIED by rule '{rule.name}': {why}. Tool call '{tool.name}' was not executed; "
               "do not retry it, find another way or give your final answer.")
    effect.reject(actor=label, reason=why)
    refusal = Refusal.record(agent=agent, kind=Refusal.Kind.RULE, tool_name=tool.name, decided_by=label,
                             reason=f"rule {rule.name}: {why}", session_id=session.pk, effect_id=effect.pk,
                             step_index=call.step_index, args=call.args, message=message)
    return Answer(403, refused_by_rule(effect, refusal))


def refused_by_rule(effect: Effect, refusal: Refusal) -> dict[str, Any]:
    """The answer to a call a rule denied, the first time and on every replay."""
    rule = refusal.decided_by.removeprefix("rule:")
    return {"decision": "refused", "kind": "rule", "rule": rule, "message": refusal.message,
            "refusal": str(refusal.id), "effect": {**effect.as_dict(), "decision": "rejected",
                                                   "reason": refusal.reason}}


def executed(effect: Any, entry: Any) -> Answer:
    """The 201 of a compensable call that runs at once, its undo entry pushed (of the model
    instances, or of what reads like them: the compensable fast path's rows)."""
    return Answer(201, {"decision": "execute", "effect": Effect.as_dict(effect),
                        "undo_entry": UndoEntry.as_dict(entry)})


def granted(effect: Effect, approval: ApprovalRequest) -> Answer:
    """The 201 of a call a live grant decided at once (the session keeps running)."""
    view, fields = approval.summary(), approval.caller_fields()
    view.update(decided_by=approval.decided_by_label, decision=approval.decision,
                reason=approval.decision_reason, decided_args_digest=approval.decided_args_digest)
    return Answer(201, {"decision": "approved", "effect": {**effect.as_dict(), **fields}, "approval": view})


def _lock_session(agent: Agent, session_id: Any) -> Session:
    # FOR UPDATE: calls of one session are checked one by one (the guide's "parallel calls are
    # checked one by one"), so run counters and the replay lookup never race.
    session = Session.objects.select_for_update().filter(pk=session_id, agent=agent).first()
    if session is None:
        raise NotFound("No such session for this agent.", code="session_not_found")
    # The run's agent and org are the caller's, already loaded with its key: the approval request,
    # its agent context and its event read them off the session without a query each.
    session.agent = agent
    if Agent.org.is_cached(agent):
        session.org = agent.org
    return session


def _record_safe_calls(session: Session, reported: list[ReportedSafeCall], tools: dict[str, Tool]) -> None:
    if not reported:
        return
    # A retried request reports the same SAFE calls again; a step is charged once.
    seen = set(SafeCall.objects.filter(session=session, step_index__in=[c.step_index for c in reported])
               .values_list("step_index", flat=True))
    fresh = {c.step_index: c for c in reported if c.step_index not in seen}
    if not fresh:
        return
    SafeCall.objects.bulk_create(
        SafeCall(session=session, tool_name=c.tool, step_index=c.step_index, args=c.args) for c in fresh.values())
    for safe in fresh.values():
        guard.charge_safe_call(session, tools.get(safe.tool), safe.tool)
        found = safe.prints(tools.get(safe.tool), session.inputs)
        if found is not None:
            outputs.keep(session.id, found)
    session.step_index = max(session.step_index, *fresh)


def _replay(existing: Effect, call: Call) -> Answer:
    if call.idempotency_key and (existing.tool_name != call.tool or
                                 existing.args_digest != call.args_digest):
        raise Conflict("This idempotency_key was already used for a different call.",
                       code="idempotency_key_reused", effect=existing.as_dict())
    body: dict[str, Any] = {"decision": "replay", "effect": existing.as_dict()}
    if existing.tier == Tier.IRREVERSIBLE:
        found = ApprovalRequest.for_caller(existing)
        if found is None and existing.state == Effect.State.REJECTED:
            denied = Refusal.objects.filter(effect_id=existing.pk, kind=Refusal.Kind.RULE).first()
            if denied is not None:  # a rule refused it: the same answer again, nothing counted twice
                return Answer(403, refused_by_rule(existing, denied))
        if found is not None:
            body["approval"], fields = found
            body["effect"].update(fields)
            if body["approval"]["reason"]:
                body["reason"] = body["approval"]["reason"]
    return Answer(200, body)


def _check_open(agent: Agent, session: Session) -> None:
    if session.state == Session.State.AWAITING_APPROVAL:
        pending = ApprovalRequest.objects.filter(session=session).pending().first()
        raise Conflict("The session is waiting for a reviewer's decision on an irreversible call.",
                       code="session_awaiting_approval", approval=pending.summary() if pending else None)
    if session.rewind_to is not None and session.state != Session.State.RUNNING:  # rewind (issue 41)
        raise Conflict(f"The run is being rewound to step {session.rewind_to} ({session.state}); call again once "
                       "it runs.", code="session_rewinding", to_step=session.rewind_to, state=session.state)
    if session.state != Session.State.RUNNING:
        raise Conflict(f"The session is {session.state}; open a new session.",
                       code="session_not_running", state=session.state)
    if agent.state != Agent.State.ACTIVE:
        raise DomainError(f"The agent {agent.name} is {agent.state}; a reviewer must resume it.",
                          code="agent_suspended", status_code=423,
                          reason=agent.suspend_reason or agent.state, state=agent.state)


def _tool_for(call: Call, tools: dict[str, Tool]) -> Tool:
    tool = tools.get(call.tool)
    if tool is None:
        raise NotFound(f"No tool named {call.tool!r} is registered in this organization.",
                       code="tool_not_registered", tool=call.tool)
    if tool.tier == Tier.SAFE:
        raise DomainError(f"{call.tool} is SAFE: run it at once and report it in safe_calls.",
                          code="safe_tool_not_intercepted")
    return tool


def _insert_effect(session: Session, tool: Tool, call: Call, signature: str, *, held: bool = False) -> Effect:
    effect = new_effect(session.org_id, session.id, tool, call, signature)
    if held:  # a compensable call a rule holds or refuses: it waits like an irreversible one
        effect.state = Effect.State.PENDING
    effect.save(force_insert=True)
    effect.announce(None, effect.state)  # after commit, off this thread: no query, no wait
    return effect


def _push_undo(session: Session, tool: Tool, effect: Effect) -> UndoEntry:
    entry = new_undo_entry(tool, effect)
    entry.save(force_insert=True)
    return entry


def new_effect(org_id: Any, session_id: Any, tool: Tool, call: Call, signature: str) -> Effect:
    """The effect row of an admitted call, not yet saved."""
    values = effect_values(org_id, session_id, tool, call, signature)
    del values["tool_id"]
    return Effect(tool=tool, **values)


def effect_values(org_id: Any, session_id: Any, tool: Tool, call: Call, signature: str) -> dict[str, Any]:
    """What an admitted call's effect row holds beyond its defaults, by attribute name: the pipeline
    makes an `Effect` of them, the fast path its row (no model instance: they cost it ~0.1 ms)."""
    initial = Effect.State.EXECUTING if tool.tier == Tier.COMPENSABLE else Effect.State.PENDING
    return {
        "org_id": org_id, "session_id": session_id, "tool_id": tool.pk, "tool_name": tool.name, "tier": tool.tier,
        "step_index": call.step_index, "call_signature": signature, "idempotency_key": call.idempotency_key,
        "args": call.args, "args_digest": call.args_digest, "reasoning": call.reasoning,
        "state": initial,
        "undo_needs_result": tool.tier == Tier.COMPENSABLE and needs_result(tool.compensation_args, call.args),
    }


def new_undo_entry(tool: Tool, effect: Effect) -> UndoEntry:
    """The undo entry pushed before a compensable effect runs, not yet saved."""
    values = undo_entry_values(tool, effect.__dict__)
    del values["fn_id"]
    return UndoEntry(effect=effect, fn=tool.compensation_fn, **values)


def undo_entry_values(tool: Tool, effect: dict[str, Any]) -> dict[str, Any]:
    """The undo entry's values (by attribute name) for the effect's values."""
    fn = tool.compensation_fn
    # A template that reads the result is kept on the entry and rendered when the effect commits.
    template = tool.compensation_args if effect["undo_needs_result"] else None
    return {
        "session_id": effect["session_id"], "step_index": effect["step_index"], "fn_id": fn.pk,
        "fn_name": fn.fn_name, "fn_version": fn.fn_version, "args": render_template(tool.compensation_args,
                                                                                 effect["args"]),
        "args_template": template, "max_retries": tool.max_retries, "retry_backoff_ms": tool.retry_backoff_ms,
    }


def agent_context(session: Session, call: Call, effect: Effect) -> dict[str, Any]:
    """The session's last N calls (SAFE ones included) and its reasoning trace."""
    window = session.org.context_window
    effects = list(Effect.objects.for_session(session).exclude(pk=effect.pk).order_by("-step_index")[:window])
    safe = list(SafeCall.objects.filter(session=session).order_by("-step_index")[:window])
    return context_of(window, effects, safe, call)


def context_of(window: int, effects: list[Any], safe: list[Any], call: Call) -> dict[str, Any]:
    """`agent_context` of the run's last `window` effects and SAFE calls (each newest first, read by
    the caller: the pipeline with two queries, the fast approval path inside its one read)."""
    calls = [{"step_index": e.step_index, "tool": e.tool_name, "tier": e.tier, "args": e.args,
              "state": e.state, "result": summarise(e.result), "error": e.error or None} for e in effects]
    calls += [{"step_index": s.step_index, "tool": s.tool_name, "tier": Tier.SAFE, "args": s.args,
               "state": "reported", "result": None, "error": None} for s in safe]
    calls = sorted(calls, key=lambda c: c["step_index"])[-window:] if window else []
    trace = [{"step_index": e.step_index, "text": e.reasoning} for e in sorted(effects, key=lambda e: e.step_index)
             if e.reasoning]
    if call.reasoning:
        trace.append({"step_index": call.step_index, "text": call.reasoning})
    return {"calls": calls, "reasoning": trace}


def summarise(result: Any, limit: int = 300) -> str | None:
    if result is None:
        return None
    text = result if isinstance(result, str) else canonical_json(result)
    return text if len(text) <= limit else text[: limit - 1] + "…"
