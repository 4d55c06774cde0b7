"""An irreversible call decided at once (an approve rule, a live grant) or held for people, in two
statements on PostgreSQL (issue 26); and so a compensable call the rules decide (an org whose
rules may hold compensable calls: run at once with its undo entry, or held like an irreversible
one) or that reports an output to fingerprint (issue 25), which the one-statement compensable
path (`lifecycle.intercept.one_statement`) cannot take.

The pipeline (`lifecycle.intercept.pipeline`) answers such a call with ~15-26 statements, each
compiled by the ORM, and fans its event out (channel layer, webhook rows, Slack's row) in the
request. Here:

1. Before any query, from this process's caches (`config.OrgConfig`, the rules' cache, both
   stamped with the org's `config_version`): the tool is irreversible, or compensable with its
   compensation, without an executor, no daily limit or incident switch applies, and no rule that
   concerns the call reads more than its args, tool, agent, run counters, clock, `run.inputs` and
   the run's fingerprints (`tainted()`, `requested()`); `day`, `run.calls` and `window()` each
   cost a query: the pipeline's.
2. One read, each statement its own transaction (no BEGIN and COMMIT round trips): the session
   and the row's version (xmin), its agent and org, the key's liveness, whether this signature
   was seen, the oldest live grant of this tool to this agent, the run's last calls for the
   agent context, and what the fan-out needs (the org's active webhooks, whether it has Slack).
   When SAFE calls are reported with the call: whether one of their steps is recorded already
   (a retry: the pipeline's); when a rule reads the run's taint, or an output is reported: the
   run's fingerprint rows (or only how many it keeps, against its bound).
3. The pipeline's own decision, in memory: the reported SAFE calls charged and their outputs
   fingerprinted (`effects.outputs.prints_of_output`, the raw output never leaves the request),
   `budgets.guard.admit` (budgets before rules), `approvals.rules.decide` on the run's taint as
   read plus these outputs, `lifecycle.intercept.decision.decide` (quorum, reviewer groups, grants), the
   request's fields (`ApprovalRequest.values_for`, with `why`) and the answer
   (`answers.granted`/`awaiting`).
4. One write: the session's counters (and `awaiting_approval`, held), the reported SAFE calls and
   their fingerprints, the effect, a compensable call's undo entry, its request, its history rows
   and the event (a compensable call that runs at once has neither), in one statement,
   guarded by the session row's version and the org's config version as read: a call of the same
   run (or a config change) that came in between makes it write nothing, and the call is decided
   again behind the pipeline's lock (FOR UPDATE, in a transaction: 4 statements), so calls of one
   run still pass one by one.
5. After the write, off the request thread (`core.fanout.after_answer`): the event's fan-out
   (`approvals.notify.dispatch_recorded`), given the request, the webhooks and Slack as this call
   holds them, so that it re-reads none of them, and gathered with the other calls' events of a
   window: one claim and one group message per org for all of them, with no webhook, email or Slack
   row to write. A held request does not wait for the window: reviewers wait for it. The event row
   is the outbox: a crash before it runs delays it to the beat's sweep
   (`approvals.tasks.sweep_events`); nothing is lost.

Anything else steps aside (None), and the pipeline answers as always: a replay, a SAFE step
reported again, a session not running, an agent suspended, a cap in the way (its refusal is
recorded there), a deny rule or an observe-mode match, a config version that moved, a lost race
on the signature, two tainted reads at one step. Stepping aside happens before the write, or is
a write that wrote nothing.
"""

from __future__ import annotations

import contextlib
import functools
import json
import uuid
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.http import HttpResponse
from django.utils import timezone

from approvals import notify, rules
from approvals.models import GRANT_PREFIX, ApprovalRequest, OrgWebhook
from budgets import guard
from budgets.models import Limits
from core import prepared
from core.fanout import after_answer
from effects import outputs
from effects.models import Effect, Session, Tier, Tool, UndoEntry, announce
from lifecycle.intercept.answers import awaiting, executed, granted
from lifecycle.intercept.call import NO_OUTPUT, Call, ReportedSafeCall, signature_of
from lifecycle.intercept.config import OrgConfig
from lifecycle.intercept.decision import decide
from lifecycle.intercept.rows import context_of, new_effect, new_undo_entry
from lifecycle.intercept.sql import SAFE_CALLS, Shape, insert_sql, jsonb, live_key
from lifecycle.intercept.wire import respond
from orgs.models import Agent, AgentKey, Event, Organization, Recorded, RememberedKey, events_recorded


class _StepAside(Exception):
    """The pipeline answers this call: roll back the read's transaction (nothing was written)."""


class _ConfigMoved(_StepAside):
    """The org's tools, budgets or rules changed since this process cached them."""


class _Raced(_StepAside):
    """The session row, or the org's config, moved between the read and the write: nothing was written."""


def _columns(model: type) -> tuple[list[str], list[str]]:
    fields = model._meta.concrete_fields
    return [f.attname for f in fields], [f.column for f in fields]


_SESSION, _AGENT, _ORG = _columns(Session), _columns(Agent), _columns(Organization)
_CONTEXT = ("step_index", "tool_name", "tier", "args", "state", "result", "error", "reasoning")
# What the event's fan-out reads of an active webhook (`notify._webhook_rows`): read with the
# session, so that the fan-out after the answer reads no webhook, request or Slack row again.
_HOOK = ("id", "url", "event_types", "slack")


def _select(alias: str, columns: list[str]) -> str:
    return ", ".join(f"{alias}.{column}" for column in columns)


_READ = f"""
SELECT {_select('s', _SESSION[1])}, {_select('a', _AGENT[1])}, {_select('o', _ORG[1])},
    {live_key('k')} AS live,
    EXISTS (SELECT 1 FROM effects_effect x WHERE x.session_id = s.id AND x.call_signature = %(signature)s) AS seen,
    (SELECT jsonb_build_array(g.id, g.created_by_label, g.reason) FROM approvals_grant g
     WHERE g.agent_id = s.agent_id AND g.tool_name = %(tool)s AND g.revoked_at IS NULL
       AND (g.expires_at IS NULL OR g.expires_at > now()) AND (g.session_id IS NULL OR g.session_id = s.id)
     ORDER BY g.created LIMIT 1) AS grant,
    (SELECT COALESCE(jsonb_agg(jsonb_build_array({_select('e', list(_CONTEXT))}) ORDER BY e.step_index DESC),
                     '[]')
     FROM (SELECT * FROM effects_effect e WHERE e.session_id = s.id ORDER BY e.step_index DESC
           LIMIT o.context_window) e) AS effects,
    (SELECT COALESCE(jsonb_agg(jsonb_build_array(c.step_index, c.tool_name, c.args) ORDER BY c.step_index DESC),
                     '[]')
     FROM (SELECT * FROM effects_safecall c WHERE c.session_id = s.id ORDER BY c.step_index DESC
           LIMIT o.context_window) c) AS safe,
    (SELECT COALESCE(jsonb_agg(jsonb_build_array({_select('w', list(_HOOK))})), '[]')
     FROM approvals_orgwebhook w WHERE w.org_id = s.org_id AND w.active) AS hooks,
    EXISTS (SELECT 1 FROM approvals_slackconnection c WHERE c.org_id = s.org_id AND c.active) AS slack,
    s.xmin::text AS seen_as{{run}}
FROM effects_session s
JOIN orgs_agent a ON a.id = s.agent_id
JOIN orgs_organization o ON o.id = s.org_id
JOIN orgs_agentkey k ON k.id = %(key)s AND k.agent_id = s.agent_id
WHERE s.id = %(session)s AND s.agent_id = %(agent)s
"""
# What the call reads of the run besides, when it reports SAFE calls or a rule reads `tainted()`:
# whether a reported step is recorded already (a retry: the pipeline charges each step once; one
# index probe per step, as the compensable fast path's guard), and the run's fingerprints: all of
# its rows for `tainted()` (bounded per run, `UNDOLOG_RUN_FINGERPRINTS`), or only how many it keeps
# and whether it is full, when a reported output is to be kept within that bound.
_SAFE_SEEN = """,
    EXISTS (SELECT 1 FROM unnest(%(safe_steps)s::int[]) AS st(step), LATERAL (
        SELECT 1 FROM effects_safecall y WHERE y.session_id = s.id AND y.step_index = st.step LIMIT 1) seen)
        AS safe_seen"""
_PRINTS = {
    "rows": """,
    (SELECT COALESCE(jsonb_agg(jsonb_build_array(f.step_index, f.tool_name, f.tainted, f.vouched, f.named, f.size)
                               ORDER BY f.step_index, f.id), '[]')
     FROM effects_runfingerprint f WHERE f.session_id = s.id) AS prints""",
    "kept": f""",
    (SELECT jsonb_build_array(COALESCE(sum(f.size), 0), COALESCE(bool_or(f.tool_name = '{outputs.FULL}'), false))
     FROM effects_runfingerprint f WHERE f.session_id = s.id) AS prints""",
    "": "",
}


@functools.cache
def _read(safe: bool, prints: str, locked: bool) -> str:
    """The read, with what this call needs of the run. Locked: after a lost race on the session
    row, the read again behind the pipeline's lock, so that calls of one run that come at once
    pass one by one (and stay on this path) instead of all stepping aside."""
    sql = _READ.replace("{run}", (_SAFE_SEEN if safe else "") + _PRINTS[prints])
    return sql + "FOR UPDATE OF s\n" if locked else sql


# The write, in parts (`_write`): each CTE fed by the one before, all by the guarded session update,
# so a lost race writes none of them.
_WRITE_SESSION = """
WITH s AS (
    UPDATE effects_session SET tool_calls = %(tool_calls)s, irreversible_calls = %(irreversible_calls)s,
        cost = %(cost)s, tool_counts = %(tool_counts)s, violation = %(violation)s::jsonb, step_index = %(step)s,
        state = %(state)s, updated = %(now)s
    WHERE id = %(session)s AND xmin::text = %(seen_as)s
      AND (SELECT config_version FROM orgs_organization WHERE id = org_id) = %(version)s
    RETURNING id"""
_WRITE_EFFECT = f"""
), e AS ({insert_sql(Effect, "effect", "s").replace("RETURNING 1", "RETURNING id")}"""
# A compensable call's undo entry, pushed with its effect (held or not), as the pipeline pushes it.
_WRITE_ENTRY = f"""
), u AS ({insert_sql(UndoEntry, "entry", "e")}"""
_WRITE_REQUEST = f"""
), q AS ({insert_sql(ApprovalRequest, "approval", "e")}
), et AS (
    INSERT INTO effects_effecttransition (effect_id, from_state, to_state, actor, reason, created)
    SELECT e.id, 'pending', 'approved', %(label)s, %(reason)s, %(now)s FROM e WHERE %(approved)s
), st AS (
    INSERT INTO effects_sessiontransition (session_id, from_state, to_state, actor, reason, created)
    SELECT s.id, 'running', 'awaiting_approval', %(actor)s, '', %(now)s FROM s WHERE NOT %(approved)s
), v AS ({insert_sql(Event, "event", "q")}"""
# The reported outputs' fingerprints (`effects.outputs.Prints`), written with the run's other rows.
_WRITE_PRINTS = """
), fp AS (
    INSERT INTO effects_runfingerprint (session_id, step_index, tool_name, tainted, vouched, size, named, created)
    SELECT s.id, r.step_index, r.tool_name, r.tainted, r.vouched, r.size, r.named, %(now)s
    FROM s, jsonb_to_recordset(%(prints)s::jsonb)
        AS r(step_index int, tool_name text, tainted jsonb, vouched jsonb, size int, named boolean)
    RETURNING 1"""


@functools.cache
def _write(*, safe: bool, prints: bool, entry: bool, request: bool) -> str:
    """The write: the session's counters, the reported SAFE calls (the compensable fast path's
    insert), the effect, its undo entry (compensable), its request with its history rows and event
    (unless a compensable call executes at once), the outputs' fingerprints. It answers how many
    events (or, with no request, effects) it wrote: 0 after a lost race."""
    parts = [_WRITE_SESSION + (SAFE_CALLS if safe else ""), _WRITE_EFFECT,
             _WRITE_ENTRY if entry else "", _WRITE_REQUEST if request else "", _WRITE_PRINTS if prints else ""]
    return "".join(parts) + f"\n)\nSELECT (SELECT count(*) FROM {'v' if request else 'e'})\n"


_SHAPES = {model: Shape(model) for model in (Effect, UndoEntry, ApprovalRequest, Event)}


def _row(instance: Any) -> Any:
    return _SHAPES[type(instance)].row(instance.__dict__)


# What a rule may read of the run on this path: its fingerprints come with the read (`tainted()`,
# `requested()`), its request with the session row (`run.inputs`). `run.calls`, `window()` and
# `day` cost queries of their own: the pipeline's.
_READ_HERE = frozenset({"tainted", "requested", "read_untrusted", "asked", "inputs"})
_TAINT = frozenset({"tainted", "requested", "read_untrusted"})


def _concerned(org: Any, agent_id: Any, tool: Tool) -> list[rules.CompiledRule] | None:
    """The rules `rules.decide` will walk for this call, or None if one of them reads what costs
    a query (the pipeline's to read)."""
    concerned = [r for r in rules.rules_of(org) if r.concerns(agent_id, tool.name)]
    if any(not r.reads <= _READ_HERE or "day" in r.variables for r in concerned):
        return None
    return concerned


@dataclass
class _Run:
    """What this call brings of its run and needs read of it, worked out before any query."""

    reported: dict[int, ReportedSafeCall]  # by step: a step reported twice counts once
    prints: str  # "rows", "kept" or "" (_PRINTS)
    taint: bool  # a rule reads `tainted()` or `requested()`
    by_rules: bool  # the rules decide it (`_by_rules`)

    @classmethod
    def of(cls, call: Call, concerned: list[rules.CompiledRule], by_rules: bool) -> _Run:
        reported = {c.step_index: c for c in call.safe_calls}
        taint = any(r.reads & _TAINT for r in concerned)
        outputs_reported = any(c.output is not NO_OUTPUT for c in reported.values())
        return cls(reported, "rows" if taint else "kept" if outputs_reported else "", taint, by_rules)

    def read(self, locked: bool) -> str:
        return _read(bool(self.reported), self.prints, locked)

    def besides(self, extra: list) -> tuple[bool, Any]:
        """What the read gave of the run besides, in `_read`'s order: whether a reported step is
        recorded already, and the fingerprints (`_PRINTS[self.prints]`, None when not asked)."""
        seen = bool(extra.pop(0)) if self.reported else False
        return seen, _json(extra.pop(0)) if self.prints else None


def intercept(key: RememberedKey, config: OrgConfig, tool: Tool, call: Call,
              session_id: uuid.UUID) -> HttpResponse | None:
    """The answer to an irreversible intercept, or to a compensable one the compensable fast path
    leaves (the org's rules decide compensable calls, or an output is reported), or None for the
    pipeline to give it."""
    if tool.executor_url or not (tool.tier == Tier.IRREVERSIBLE or
                                 (tool.tier == Tier.COMPENSABLE and tool.compensation_fn is not None)):
        return None
    limits = config.limits_for(key.org_id, key.agent_id)
    if limits.tracks_day or limits.incident:
        return None
    by_rules = _by_rules(config, tool)
    if by_rules:
        # The rules' cache is stamped with the version the config was read at; the read re-checks it.
        concerned = _concerned(SimpleNamespace(id=key.org_id, config_version=config.version), key.agent_id, tool)
        if concerned is None:
            return None
    else:
        concerned = []
    run = _Run.of(call, concerned, by_rules)
    AgentKey.touch_remembered(key)
    signature = signature_of(session_id, call)
    db = connections[DEFAULT_DB_ALIAS]
    # Each statement is its own transaction (no BEGIN and COMMIT round trips: ~0.9 ms of the
    # call's ~3.6, measured): the write is guarded by the session row's version as read (xmin)
    # and the org's config version, so a call or a config change that came between the two
    # makes it write nothing, and the pipeline answers. Inside a caller's transaction (tests, a
    # batch) a savepoint keeps a failed write from breaking it.
    try:
        try:
            with transaction.atomic() if db.in_atomic_block else contextlib.nullcontext():
                return _decide(db, run.read(locked=False), key, config, limits, tool, call, run, session_id,
                               signature)
        except _Raced:
            with transaction.atomic():
                return _decide(db, run.read(locked=True), key, config, limits, tool, call, run, session_id,
                               signature)
    except _ConfigMoved:
        # Reloaded now, so that the next call is fast again at once.
        fresh = OrgConfig.of(key.org_id)
        if fresh is not None:
            fresh.limits_for(key.org_id, key.agent_id)
        return None
    except (_StepAside, IntegrityError, psycopg.IntegrityError):
        return None  # nothing written; a duplicate that won the race on the signature replays there


def _by_rules(config: OrgConfig, tool: Tool) -> bool:
    """Whether the rules decide this call: every irreversible one; a compensable one only in an
    org whose rules may hold or refuse compensable calls (`rules.sees_compensable`)."""
    return tool.tier == Tier.IRREVERSIBLE or config.rules_see_compensable


def _decide(db: Any, read: str, key: RememberedKey, config: OrgConfig, limits: Limits, tool: Tool,
            call: Call, run: _Run, session_id: uuid.UUID, signature: str) -> HttpResponse:
    row = prepared.row(db, read, {"signature": signature, "tool": tool.name, "key": key.id,
                                  "session": session_id, "agent": key.agent_id, "safe_steps": list(run.reported)})
    if row is None:
        raise _StepAside  # not this agent's session: the pipeline's 404
    session, agent, org, (live, seen, grant, effects, safe, hooks, slack, seen_as), extra = _loaded(row)
    if org.config_version != config.version:
        OrgConfig.forget(key.org_id, org.config_version)
        raise _ConfigMoved
    if not live or seen or session.state != Session.State.RUNNING or agent.state != Agent.State.ACTIVE:
        raise _StepAside  # a 401, a replay, a 409 or 423
    safe_seen, known = run.besides(extra)
    if safe_seen:
        raise _StepAside  # a retry reports its SAFE calls again: the pipeline charges each step once
    # The pipeline, step by step (`pipeline._pipeline`, `_record_safe_calls`, `_ask`), on the rows just read.
    for reported in run.reported.values():
        guard.charge_safe_call(session, config.tools.get(reported.tool), reported.tool)
    session.step_index = max(session.step_index, call.step_index, *run.reported)
    prints, taint = _fingerprints(config, session, call, run, known)
    session.__dict__["_budget_limits"] = limits  # guard's own cache of the agent's limits
    if guard.exceeds(session, tool, limits) or guard.admit(session, tool, call) is not None:
        raise _StepAside  # a cap in the way: the pipeline records the refusal
    verdict = rules.decide(org, agent, session, tool, call.args, step_index=call.step_index, taint=taint) \
        if run.by_rules else rules.Verdict()
    if verdict.observed or (verdict.rule is not None and verdict.rule.outcome == rules.Rule.Outcome.DENY):
        raise _StepAside  # observations are events of their own, a denial a refusal row
    if tool.tier == Tier.COMPENSABLE and verdict.rule is not None and verdict.rule.outcome == rules.Rule.Outcome.FLAG:
        raise _StepAside  # run now, review after: the pipeline's `_flag` (an effect and a request that waits)
    compensable = tool.tier == Tier.COMPENSABLE
    if compensable and (verdict.rule is None or verdict.rule.outcome == rules.Rule.Outcome.APPROVE):
        # What no rule holds runs at once, its undo entry pushed first (`pipeline._pipeline`).
        return _execute(db, session, tool, call, run, prints, signature, seen_as, config)
    found = None
    if grant is not None:
        found = SimpleNamespace(pk=uuid.UUID(grant[0]), label=f"{GRANT_PREFIX}{grant[0]}",
                                created_by_label=grant[1], reason=grant[2])
    decision = decide(org, tool, verdict, lambda: found)

    now = timezone.now()
    effect = new_effect(org.id, session.id, tool, call, signature)
    effect.created = effect.updated = now
    entry = None
    if compensable:  # held by a rule: it waits like an irreversible call, its undo entry pushed
        effect.state = Effect.State.PENDING
        entry = _entry(tool, effect, now)
    # The agent context as the pipeline reads it: after the reported SAFE calls were recorded.
    safe = [SimpleNamespace(step_index=c[0], tool_name=c[1], args=c[2]) for c in safe]
    safe += [SimpleNamespace(step_index=c.step_index, tool_name=c.tool, args=c.args) for c in run.reported.values()]
    context = context_of(org.context_window, [SimpleNamespace(**dict(zip(_CONTEXT, e, strict=True)))
                                                       for e in effects], safe, call)
    approval = ApprovalRequest(**ApprovalRequest.values_for(effect, tool, session, context,
                                                            **decision.request_fields(verdict)))
    label = reason = ""
    if decision.held:
        session.state = Session.State.AWAITING_APPROVAL
        event = Event(org=org, kind="approval.requested", agent=agent, session_id=session.pk,
                      data=notify.requested_data(approval))
    else:
        # What `ApprovalRequest.approve_at_once` records: the request approved, bound to the args
        # shown, decided by the rule or the grant; the effect approved; `approval.decided`.
        label, reason = decision.label_and_reason()
        approval.state, approval.decided_by_label = ApprovalRequest.State.APPROVED, label
        approval.decision_reason = reason
        approval.decided_at, approval.decided_args_digest = now, approval.args_digest
        effect.state = Effect.State.APPROVED
        extra = {"grant": str(decision.grant.pk)} if decision.grant is not None else {}
        event = Event(org=org, kind="approval.decided", agent=agent, session_id=session.pk,
                      data={**extra, **approval.event_data()})
    event.created = now
    _write_run(db, session, run, prints, seen_as, config, now, effect=effect, entry=entry, request={
        "approval": _row(approval), "event": _row(event), "approved": not decision.held, "label": label,
        "reason": reason[:2000], "actor": f"agent:{agent.name}"})
    hooks = [_hook(h, org.id) for h in hooks]
    effect.tool = tool  # the payload's `executor`, without a query
    _after_commit(session, effect, event, approval, hooks, slack=slack and decision.held, held=decision.held)
    answer = granted(effect, approval) if decision.grant is not None else \
        awaiting(effect, tool, approval)
    response = respond(answer.status, answer.body)
    response.undolog_outcome = (tool.tier, answer.body["decision"])  # core/observe.py's metrics
    return response


def _entry(tool: Tool, effect: Effect, now: Any) -> UndoEntry:
    entry = new_undo_entry(tool, effect)
    entry.created = entry.updated = now
    return entry


def _write_run(db: Any, session: Session, run: _Run, prints: list[outputs.Prints], seen_as: str,
               config: OrgConfig, now: Any, *, effect: Effect, entry: UndoEntry | None,
               request: dict[str, Any] | None) -> None:
    """The one write (`_write`), or `_Raced` when it wrote nothing."""
    sql = _write(safe=bool(run.reported), prints=bool(prints), entry=entry is not None, request=request is not None)
    params = {
        "tool_calls": session.tool_calls, "irreversible_calls": session.irreversible_calls, "cost": session.cost,
        "tool_counts": jsonb(session.tool_counts),
        "violation": None if session.violation is None else jsonb(session.violation),
        "step": session.step_index, "state": session.state, "now": now, "session": session.pk,
        "seen_as": seen_as, "version": config.version, "effect": _row(effect), **(request or {})}
    # Only what the statement's parts read (an irreversible call reporting nothing: none of these).
    if entry is not None:
        params["entry"] = _row(entry)
    if run.reported:
        params["safe"] = jsonb([{"tool": c.tool, "step_index": c.step_index, "args": c.args}
                                          for c in run.reported.values()])
    if prints:
        params["prints"] = jsonb([asdict(p) | {"size": p.size} for p in prints])
    written = prepared.row(db, sql, params)
    if not written or written[0] != 1:
        raise _Raced


def _execute(db: Any, session: Session, tool: Tool, call: Call, run: _Run, prints: list[outputs.Prints],
             signature: str, seen_as: str, config: OrgConfig) -> HttpResponse:
    """A compensable call no rule holds: its effect `executing` and its undo entry, the 201 execute."""
    now = timezone.now()
    effect = new_effect(session.org_id, session.id, tool, call, signature)
    effect.created = effect.updated = now
    entry = _entry(tool, effect, now)
    _write_run(db, session, run, prints, seen_as, config, now, effect=effect, entry=entry, request=None)
    announce(effect, "effect", None, Effect.State.EXECUTING, name=effect.tool_name, session_id=session.pk,
             org_id=session.org_id, step_index=effect.step_index)
    answer = executed(effect, entry)
    response = respond(answer.status, answer.body)
    response.undolog_outcome = (tool.tier, "execute")
    return response


def _fingerprints(config: OrgConfig, session: Session, call: Call, run: _Run,
                  known: Any) -> tuple[list[outputs.Prints], outputs.RunTaint | None]:
    """The reported outputs' fingerprints to write, within the run's bound (`outputs.Bound`, on
    what the read gave: the run's rows, or how many it keeps and whether it is full), and the run's
    taint as `tainted()` reads it before this call's step, these outputs included."""
    if not run.prints:
        return [], None  # no output reported, no rule reads the run's taint
    rows = known if run.prints == "rows" else []
    if run.prints == "rows":
        bound = outputs.Bound(sum(r[5] for r in rows), any(r[1] == outputs.FULL for r in rows))
    else:
        bound = outputs.Bound(*known)
    prints: list[outputs.Prints] = []
    for reported in run.reported.values():
        found = reported.prints(config.tools.get(reported.tool), session.inputs)
        kept = bound.admit(found) if found is not None else None
        if kept is not None:
            prints.append(kept)
    if not run.taint:
        return prints, None
    steps = {r[0] for r in rows}
    if any(p.step_index in steps for p in prints):
        # Two reads' outputs at one step: `requested()` would read both calls' args, and the
        # fresh one is not written yet. The pipeline answers (it records first, then decides).
        raise _StepAside
    fresh = [(p.step_index, p.tool_name, p.tainted, p.vouched, p.named) for p in prints]
    # In order: the run's rows by step (then id), these after them at a step (their ids are newer).
    ordered = sorted((r for r in [*(tuple(r[:5]) for r in rows), *fresh] if r[0] < call.step_index),
                     key=lambda r: r[0])
    return prints, outputs.RunTaint.of(ordered)


def _loaded(row: tuple) -> tuple[Session, Agent, Organization, tuple, list]:
    """The read's row as model instances (no query: as the ORM would have loaded them), the rest,
    and what was read of the run besides (`_SAFE_SEEN`, `_PRINTS`), in order."""
    at = 0
    instances = []
    for model, (names, _) in ((Session, _SESSION), (Agent, _AGENT), (Organization, _ORG)):
        values = row[at:at + len(names)]
        at += len(names)
        instances.append(prepared.instance(model, values))
    session, agent, org = instances
    live, seen, grant, effects, safe, hooks, slack, seen_as, *extra = row[at:]
    agent.org = session.org = org  # the pipeline's `_lock_session`: no query to reach them
    session.agent = agent
    return session, agent, org, (live, seen, _json(grant), _json(effects) or [], _json(safe) or [],
                                 _json(hooks) or [], slack, seen_as), extra


_HOOK_FIELDS = [f.attname for f in OrgWebhook._meta.concrete_fields if f.attname in (*_HOOK, "org_id", "active")]


def _hook(values: list, org_id: Any) -> OrgWebhook:
    """An active webhook as the read gave it, its other fields deferred (`from_db` takes them in
    the model's field order)."""
    known = {**dict(zip(_HOOK, values, strict=True)), "org_id": org_id, "active": True}
    known["id"] = uuid.UUID(known["id"])
    return OrgWebhook.from_db(DEFAULT_DB_ALIAS, _HOOK_FIELDS, [known[name] for name in _HOOK_FIELDS])


def _json(value: Any) -> Any:
    # Django's connection reads jsonb as text (the ORM's JSON fields parse it); the standard
    # library keeps integers past 64 bits, as the ORM does.
    return json.loads(value) if isinstance(value, str) else value


def _after_commit(session: Session, effect: Effect, event: Event, approval: ApprovalRequest,
                  hooks: list[OrgWebhook], *, slack: bool, held: bool) -> None:
    """What the pipeline's verbs register after commit, the event's fan-out off this thread, given
    what this call already holds: the request (the event's payload, built without re-reading
    it), the org's active webhooks, and whether a Slack row can be due (a held request of an org
    with Slack; a request decided at once was never posted, so it has no message to re-sync).
    No long-poll wake-up: nobody can wait on an effect created in this call's own statement (a
    waiter subscribes, then re-reads the effect, and finds its decision)."""
    announce(effect, "effect", None, Effect.State.PENDING, name=effect.tool_name, session_id=session.pk,
             org_id=session.org_id, step_index=effect.step_index)
    if held:
        announce(session, "session", Session.State.RUNNING, Session.State.AWAITING_APPROVAL, session_id=session.pk,
                 org_id=session.org_id, step_index=session.step_index)
    else:
        announce(effect, "effect", Effect.State.PENDING, Effect.State.APPROVED, name=effect.tool_name,
                 session_id=session.pk, org_id=session.org_id, step_index=effect.step_index)
    # A held request goes out at once (reviewers wait for it); a decision made at once waits for
    # the window's others, so that a busy process sends them in one claim and one message.
    transaction.on_commit(lambda: after_answer.add(_fan_out, Recorded(event, approval, hooks, slack), urgent=held))


def _fan_out(recorded: list[Recorded]) -> None:
    """A window's events of this process, fanned out together (`core.fanout.after_answer`)."""
    events_recorded.send(sender=Event, recorded=recorded)
