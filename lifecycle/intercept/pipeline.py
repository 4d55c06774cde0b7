"""The intercept pipeline: one database transaction per intercepted call (DESIGN.md), through the
ORM. It answers every call and owns every rule; the one-statement and two-statement paths answer
the calls they can in fewer statements, with the same decision, rows and answers
(lifecycle/intercept/__init__.py)."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from approvals import notify, rules
from approvals.models import ApprovalRequest, Grant
from budgets import guard
from budgets.models import Refusal
from core.errors import Conflict, DomainError, NotFound
from effects.models import Effect, RunFingerprint, SafeCall, Session, Tier, Tool, UndoEntry
from lifecycle.intercept.answers import Answer, awaiting, executed, granted, refused_by_rule
from lifecycle.intercept.call import Call, ReportedSafeCall, call_signature
from lifecycle.intercept.decision import decide
from lifecycle.intercept.rows import agent_context, new_effect, new_undo_entry
from orgs.models import Agent, Event


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
            RunFingerprint.keep(session.id, found)
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
