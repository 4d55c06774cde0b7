"""The intercept and the commit as one SQL statement each, on PostgreSQL.

The common case (a compensable call within its run's limits, on a running session of an
active agent, from a key this process has verified before) needs no read before its write:

1. The key comes from `AgentKey.remembered` (`wire.remembered_key`); the org's tools and the
   agent's budget limits from `config.OrgConfig`, stamped with the org's `config_version`
   (bumped by triggers in the same transaction as any change to tools, compensation functions
   or budget policies).
2. One statement, in autocommit (atomic on its own, no BEGIN/COMMIT round trips): the guarded
   UPDATE of the session's counters (running, its agent's, agent active, key live, config
   version unchanged, every run cap respected, no effect with this signature yet) feeds the
   effect's INSERT, which feeds the undo entry's INSERT. The same statement reads back the
   effect already holding this signature (a replay) and the org's current config version.
3. Anything else returns None and the caller runs the full pipeline (`lifecycle.intercept.pipeline`),
   which owns every rule: a first use of a key, a SAFE step reported again, a daily limit, a cap
   in the way, a session not running, an irreversible call or its replay, a lost race on the
   signature.
   An irreversible call, a compensable one of an org whose rules may hold compensable calls, and
   one that reports an output to fingerprint go to `lifecycle.intercept.two_statements` (a read, then the
   write) before that.
   The fast path only ever gives the answer the pipeline would have given.

Concurrency: the UPDATE takes the session's row lock, so calls of one session still pass one by
one and a waiting call re-checks the caps on the row as the previous call left it. Two
duplicates can both pass `NOT EXISTS` (their snapshots predate each other); the unique
constraint on (session, call_signature) stops the second, which then replays on the slow path.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from types import SimpleNamespace

from django.http import HttpResponse
from django.utils import timezone

from budgets.guard import DEFAULT_WEIGHT
from budgets.models import RUN_LIMITS, TOOL_CAPS, Limits
from core import prepared
from core.errors import DomainError
from effects import longpoll
from effects.models import Effect, Tier, Tool, UndoEntry, announce
from lifecycle.intercept import two_statements
from lifecycle.intercept.answers import executed
from lifecycle.intercept.call import NO_OUTPUT, Call, parse, signature_of
from lifecycle.intercept.config import OrgConfig
from lifecycle.intercept.rows import effect_values, undo_entry_values
from lifecycle.intercept.sql import SAFE_CALLS, Shape, insert_sql, jsonb, live_key
from lifecycle.intercept.wire import json_body, remembered_key, respond
from orgs.models import AgentKey, RememberedKey

# ---------------------------------------------------------------- the statements

_EFFECT, _ENTRY = Shape(Effect), Shape(UndoEntry)
_EXISTING = ("id", "tool_name", "tier", "state", "step_index", "args", "result", "error", "created", "updated",
             "args_digest", "call_signature")
_SQL: dict[tuple, str] = {}
_CAP_GUARDS = {
    "max_tool_calls_per_run": "s.tool_calls + %(calls)s <= %(cap_calls)s",
    "max_irreversible_per_run": "s.irreversible_calls + %(irreversible)s <= %(cap_irreversible)s",
    "max_cost_per_run": "s.cost + %(cost)s <= %(cap_cost)s",
    TOOL_CAPS: "COALESCE((s.tool_counts ->> %(tool)s)::int, 0) + %(tool_calls)s <= %(cap_tool)s",
}


def _intercept_sql(caps: tuple[str, ...], with_safe_calls: bool) -> str:
    cached = _SQL.get((caps, with_safe_calls))
    if cached is not None:
        return cached
    guards = "".join(f" AND {_CAP_GUARDS[cap]}" for cap in caps)
    if with_safe_calls:
        # A retry reports the same SAFE calls again: a step already recorded leaves it to the pipeline.
        # One index probe per reported step, whatever the statistics say: as `step_index = ANY(…)`
        # a generic plan guessed ten steps and filtered the run's every SAFE call instead (its cost
        # grew with the run: 0.45 -> 1.1 ms of PostgreSQL's CPU per intercept within a minute of wrk).
        guards += (" AND NOT EXISTS (SELECT 1 FROM unnest(%(safe_steps)s::int[]) AS st(step), LATERAL ("
                   "SELECT 1 FROM effects_safecall y WHERE y.session_id = s.id AND y.step_index = st.step"
                   " LIMIT 1) seen)")
    effect_sql, entry_sql = insert_sql(Effect, "effect", "s"), insert_sql(UndoEntry, "entry", "e")
    existing = ", ".join(f"x.{name}" for name in _EXISTING)
    sql = f"""
WITH s AS (
    UPDATE effects_session AS s SET
        tool_calls = s.tool_calls + %(calls)s,
        irreversible_calls = s.irreversible_calls + %(irreversible)s,
        cost = s.cost + %(cost)s,
        tool_counts = s.tool_counts || (
            SELECT jsonb_object_agg(t.key, COALESCE((s.tool_counts ->> t.key)::int, 0) + t.value::int)
            FROM jsonb_each_text(%(counts)s::jsonb) AS t),
        step_index = GREATEST(s.step_index, %(step)s),
        updated = %(now)s
    FROM orgs_agent a, orgs_organization o, orgs_agentkey k
    WHERE s.id = %(session)s AND s.agent_id = %(agent)s AND s.state = 'running'
      AND a.id = s.agent_id AND a.state = 'active'
      AND o.id = s.org_id AND o.config_version = %(version)s
      AND k.id = %(key)s AND k.agent_id = s.agent_id AND {live_key('k')}{guards}
      AND NOT EXISTS (SELECT 1 FROM effects_effect x WHERE x.session_id = s.id AND x.call_signature = %(signature)s)
    RETURNING s.id{SAFE_CALLS if with_safe_calls else ""}
), e AS ({effect_sql}), u AS ({entry_sql})
SELECT (SELECT count(*) FROM u), (SELECT config_version FROM orgs_organization WHERE id = %(org)s), {existing}
FROM (SELECT 1) one
LEFT JOIN effects_effect x ON x.session_id = %(session)s AND x.call_signature = %(signature)s
    AND EXISTS (SELECT 1 FROM effects_session s2 JOIN orgs_agentkey k2 ON k2.agent_id = s2.agent_id
                WHERE s2.id = x.session_id AND s2.agent_id = %(agent)s AND k2.id = %(key)s
                  AND {live_key('k2')})
"""
    _SQL[(caps, with_safe_calls)] = sql
    return sql


@dataclass
class Charge:
    """What the call and the SAFE calls it reports add to the run's counters (`budgets.guard`'s
    arithmetic: an unregistered SAFE name weighs 1.0)."""

    calls: int = 0
    irreversible: int = 0
    cost: Decimal = Decimal(0)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, tool: Tool | None) -> None:
        self.calls += 1
        self.irreversible += int(tool.irreversible) if tool else 0
        self.cost += tool.cost_weight if tool else DEFAULT_WEIGHT
        self.counts[name] = self.counts.get(name, 0) + 1


def _run_caps(limits: Limits, tool: Tool) -> tuple[str, ...] | None:
    """The run limits this call must respect, as guards (None: leave it to the pipeline).

    Mirrors `budgets.guard._run_exceeded`: only a counter this call adds to can refuse it."""
    if limits.tracks_day or (limits.incident and tool.irreversible):
        return None
    adds = {"tool_calls": 1, "irreversible_calls": int(tool.irreversible), "cost": tool.cost_weight}
    caps = [name for name, counter, _ in RUN_LIMITS if limits.values[name] is not None and adds[counter]]
    if tool.name in limits.tool_caps:
        caps.append(TOOL_CAPS)
    return tuple(caps)


# ---------------------------------------------------------------- intercept

def intercept(request, session_id: str) -> HttpResponse | None:
    """The answer to an intercept request, or None for the pipeline to give it."""
    key = remembered_key(request)
    data = json_body(request) if key is not None else None
    if not isinstance(data, dict):
        return None
    try:
        call = parse(data)
        session = uuid.UUID(session_id)
    except (DomainError, ValueError):
        return None
    config = OrgConfig.of(key.org_id)
    refused = config.rate_limited(request, key) if config else None
    if refused is not None:
        return refused
    tool = config.tools.get(call.tool) if config else None
    if tool is None or tool.tier not in (Tier.IRREVERSIBLE, Tier.COMPENSABLE):
        return None
    if tool.tier == Tier.IRREVERSIBLE or config.rules_see_compensable or \
            any(c.output is not NO_OUTPUT for c in call.safe_calls):
        # The org's rules decide (compensable calls too, in an org whose rules may hold them), or
        # an output must be fingerprinted: a read, then the write (lifecycle/intercept/two_statements.py).
        return two_statements.intercept(key, config, tool, call, session)
    if tool.compensation_fn is None:
        return None
    limits = config.limits_for(key.org_id, key.agent_id)
    caps = _run_caps(limits, tool)
    if caps is None:
        return None
    AgentKey.touch_remembered(key)
    return _admit(key, config, limits, tool, call, session, caps)


def _admit(key: RememberedKey, config: OrgConfig, limits: Limits, tool: Tool, call: Call,
           session: uuid.UUID, caps: tuple[str, ...]) -> HttpResponse | None:
    now = timezone.now()
    signature = signature_of(session, call)
    effect = _EFFECT.values({**effect_values(key.org_id, session, tool, call, signature),
                             "created": now, "updated": now})
    entry = _ENTRY.values({**undo_entry_values(tool, effect), "effect_id": effect["id"],
                           "created": now, "updated": now})
    safe = {c.step_index: c for c in call.safe_calls}  # a step reported twice counts once (the pipeline's rule)
    charge = Charge()
    for reported in safe.values():
        charge.add(reported.tool, config.tools.get(reported.tool))
    tool_calls_before = charge.counts.get(tool.name, 0)
    charge.add(tool.name, tool)
    sql = _intercept_sql(caps, bool(safe))
    params = {"calls": charge.calls, "irreversible": charge.irreversible, "cost": charge.cost,
              "counts": jsonb(charge.counts), "tool": tool.name, "tool_calls": tool_calls_before + 1,
              "step": max(call.step_index, *safe) if safe else call.step_index, "now": now, "session": session,
              "agent": key.agent_id, "version": config.version, "key": key.id, "signature": signature,
              "org": key.org_id, "cap_calls": limits.values["max_tool_calls_per_run"],
              "cap_irreversible": limits.values["max_irreversible_per_run"],
              "cap_cost": limits.values["max_cost_per_run"], "cap_tool": limits.tool_caps.get(tool.name),
              "safe": jsonb([{"tool": c.tool, "step_index": c.step_index, "args": c.args} for c in safe.values()]),
              "safe_steps": list(safe),
              "effect": _EFFECT.row(effect), "entry": _ENTRY.row(entry)}
    row = prepared.execute(sql, params)
    if row is None:
        return None
    pushed, version, *existing = row
    if pushed:
        made, pushed_entry = SimpleNamespace(**effect), SimpleNamespace(**entry)
        announce(made, "effect", None, Effect.State.EXECUTING, name=tool.name, session_id=session,
                 org_id=key.org_id, step_index=call.step_index)
        answer = executed(made, pushed_entry)
        return respond(answer.status, answer.body)
    OrgConfig.forget(key.org_id, version)
    # A replay that reports SAFE calls may charge some: the pipeline does that bookkeeping.
    return None if safe else _replay(existing, call, session)


def _replay(existing: list, call: Call, session: uuid.UUID) -> HttpResponse | None:
    if existing[0] is None:
        return None
    effect = Effect(session_id=session, **prepared.loaded(Effect, _EXISTING, existing))
    if effect.tier != Tier.COMPENSABLE:
        return None  # an irreversible replay carries its approval: the pipeline builds that
    if call.idempotency_key and (effect.tool_name != call.tool or
                                 effect.args_digest != call.args_digest):
        return None  # the pipeline answers 409 idempotency_key_reused
    return respond(200, {"decision": "replay", "effect": effect.as_dict()})


# ---------------------------------------------------------------- commit

_COMMIT_SQL = f"""
WITH old AS (
    SELECT e.id, e.state FROM effects_effect e
    JOIN effects_session s ON s.id = e.session_id
    JOIN orgs_agentkey k ON k.agent_id = s.agent_id
    WHERE e.id = %(effect)s AND s.agent_id = %(agent)s AND e.state IN ('executing', 'approved')
      AND NOT e.undo_needs_result
      AND NOT EXISTS (SELECT 1 FROM effects_tool t WHERE t.id = e.tool_id AND t.labels @> '["untrusted"]'::jsonb)
      AND k.id = %(key)s AND {live_key('k')}
    FOR UPDATE OF e
), e AS (
    UPDATE effects_effect e SET state = 'committed', updated = %(now)s, result = %(result)s::jsonb
    FROM old WHERE e.id = old.id
    RETURNING e.id, e.org_id, e.session_id, e.tool_name, e.tier, e.step_index, e.call_signature, e.args,
              e.approved_args, e.error, e.created, old.state AS from_state
), t AS (
    INSERT INTO effects_effecttransition (effect_id, from_state, to_state, actor, reason, created)
    SELECT id, from_state, 'committed', %(actor)s, '', %(now)s FROM e
)
SELECT * FROM e
"""
_COMMITTED = ("id", "org_id", "session_id", "tool_name", "tier", "step_index", "call_signature", "args",
              "approved_args", "error", "created", "from_state")


def commit(request, effect_id: str) -> HttpResponse | None:
    """The answer to a commit request, or None for the viewset to give it."""
    key = remembered_key(request)
    data = json_body(request) if key is not None else None
    if not isinstance(data, dict) or set(data) - {"result"}:
        return None
    try:
        effect_uuid = uuid.UUID(effect_id)
    except ValueError:
        return None
    refused = OrgConfig.refusal(request, key)
    if refused is not None:
        return refused
    result = data.get("result")
    now = timezone.now()
    AgentKey.touch_remembered(key)
    row = prepared.execute(_COMMIT_SQL, {"effect": effect_uuid, "agent": key.agent_id, "key": key.id, "now": now,
                                 "result": None if result is None else jsonb(result),  # SQL NULL, as the ORM writes it
                                 "actor": f"agent:{key.agent_name}"})
    if row is None:
        return None  # not this agent's, not executing or approved, or gone: the viewset says which
    found = prepared.loaded(Effect, _COMMITTED, row)
    from_state = found.pop("from_state")
    effect = Effect(state=Effect.State.COMMITTED, result=result, updated=now, **found)
    longpoll.publish(effect.pk)
    announce(effect, "effect", from_state, Effect.State.COMMITTED, name=effect.tool_name,
             session_id=effect.session_id, org_id=effect.org_id, step_index=effect.step_index)
    return respond(200, {"effect": effect.as_dict()})
