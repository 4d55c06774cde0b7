"""The intercept and the commit as one SQL statement each, on PostgreSQL.

The common case (a compensable call within its run's limits, on a running session of an
active agent, from a key this process has verified before) needs no read before its write:

1. The key comes from `AgentKey.remembered`; the org's tools and the agent's budget limits
   from `OrgConfig`, stamped with the org's `config_version` (bumped by triggers in the same
   transaction as any change to tools, compensation functions or budget policies).
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

import functools
import json
import re
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import orjson
import psycopg
from django.core.exceptions import RequestDataTooBig
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, models, transaction
from django.http import HttpResponse
from django.utils import timezone
from psycopg.types.json import Jsonb

from approvals.rules import rules_see_compensable
from budgets.guard import DEFAULT_WEIGHT
from budgets.models import RUN_LIMITS, TOOL_CAPS, Limits
from core import prepared, ratelimit
from core.errors import DomainError
from core.parsers import MAX_JSON_DEPTH, depth_exceeds, has_nul
from effects import longpoll
from effects.models import Effect, Tier, Tool, UndoEntry, announce
from lifecycle.intercept import pipeline
from orgs.models import AgentKey, Organization, RememberedKey

_CONFIGS: dict[uuid.UUID, OrgConfig] = {}


def _dumps(value: Any) -> bytes:
    """JSON by orjson (~5x the standard library), written as DRF's renderer writes it (compact
    UTF-8). orjson refuses integers past 64 bits, which the API's own parser accepts: a tool's
    compensation args or a call's args stored by the full pipeline may hold one, so those values
    are written by the standard library instead of failing."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _jsonb(value: Any) -> Jsonb:
    """A jsonb parameter dumped by `_dumps` rather than psycopg's standard library default."""
    return Jsonb(value, dumps=_dumps)


@dataclass
class OrgConfig:
    """What the fast path reads of an org's registry and budgets, as of `version`.

    The version is read before the rows, so a change racing the load can only make the rows
    newer than their stamp: the statement then sees a different version and falls back.
    """

    version: int
    tools: dict[str, Tool]
    limits: dict[uuid.UUID, Limits] = field(default_factory=dict)
    rate_limit_per_key: int | None = None  # the org's own API rate limits (core/ratelimit.py)
    rate_limit_per_org: int | None = None
    rate_limits: dict[str, list[ratelimit.Limit]] = field(default_factory=dict)  # by key prefix
    # An enforcing rule of the org may hold or refuse compensable calls: they all take the pipeline.
    rules_see_compensable: bool = False

    @classmethod
    def of(cls, org_id: uuid.UUID) -> OrgConfig | None:
        config = _CONFIGS.get(org_id)
        if config is None:
            found = Organization.objects.filter(pk=org_id).values_list(
                "config_version", "rate_limit_per_key", "rate_limit_per_org").first()
            if found is None:
                return None
            tools = {tool.name: tool for tool in Tool.objects.filter(org_id=org_id).select_related("compensation_fn")}
            config = _CONFIGS[org_id] = cls(found[0], tools, rate_limit_per_key=found[1], rate_limit_per_org=found[2],
                                            rules_see_compensable=rules_see_compensable(org_id, tools))
        return config

    def rate_limited(self, request, key: RememberedKey) -> HttpResponse | None:
        """Count the request against its key's and its org's rate limits (one Redis round trip, no
        query: the limits are part of this cache and of its version); the 429 when one is reached.
        Marks the request, so that the pipeline, if it answers instead, does not count it again."""
        if not ratelimit.enabled():
            return None
        request.undolog_rate_checked = True
        limits = self.rate_limits.get(key.prefix)
        if limits is None:
            limits = self.rate_limits[key.prefix] = ratelimit.api_limits(
                key.org_id, f"key:{key.prefix}", self.rate_limit_per_key, self.rate_limit_per_org)
        try:
            ratelimit.check(limits)
        except ratelimit.RateLimited as exc:
            response = _respond(429, exc.body())
            response["Retry-After"] = exc.headers["Retry-After"]
            return response
        return None

    def limits_for(self, org_id: uuid.UUID, agent_id: uuid.UUID) -> Limits:
        limits = self.limits.get(agent_id)
        if limits is None:
            limits = self.limits[agent_id] = Limits.for_agent(org_id, agent_id)
        return limits

    @staticmethod
    def forget(org_id: uuid.UUID, seen_version: int | None) -> None:
        config = _CONFIGS.get(org_id)
        if config is not None and config.version != seen_version:
            _CONFIGS.pop(org_id, None)


def available() -> bool:
    return connection.vendor == "postgresql"


def _remembered_key(request) -> RememberedKey | None:
    scheme, _, raw = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return AgentKey.remembered(raw.strip()) if scheme == "Bearer" else None


def _json_body(request) -> Any:
    """The body, parsed by orjson (~10x DRF's parser), under the API parser's nesting and NUL
    rules; None when the slow path must answer. orjson refuses a little more than DRF's parser
    (lone surrogates), and reads an integer past 64 bits as a float, losing digits: those too go
    to the slow path, which decides as always, so the fast path never answers differently, it
    only answers less."""
    if request.content_type != "application/json":
        return None
    try:
        raw = request.body
        data = orjson.loads(raw)
    except (orjson.JSONDecodeError, RequestDataTooBig):
        return None
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and depth_exceeds(data):
        return None
    if b"\\u0000" in raw and has_nul(data):
        return None
    if _NINETEEN_DIGITS.search(raw) and has_inexact_number(data):
        return None
    return data


# Every integer of up to 18 digits fits 64 bits; orjson reads a longer one past 64 bits as a float.
_NINETEEN_DIGITS = re.compile(rb"\d{19}")


def has_inexact_number(data: Any) -> bool:
    """Whether `data` holds a float of 2**63 or more: orjson's reading of an integer it could not
    keep (or a float that large, which the slow path reads just as well). Iterative."""
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, float):
            if abs(value) >= 2.0**63:
                return True
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def _respond(status: int, body: dict[str, Any]) -> HttpResponse:
    # Every value is already a str, number, bool, None or JSON that was stored.
    content = _dumps(body) + b"\n"  # as the API's renderer ends its answers (core/renderers.py)
    response = HttpResponse(content, status=status, content_type="application/json")
    response["Content-Length"] = str(len(content))  # CommonMiddleware's, which this answer passes by
    response["X-Undolog-Path"] = "fast"  # which path answered: for operators and tests, never for clients
    return response


# ---------------------------------------------------------------- the statements

def _insert(model: type, param: str, source: str) -> str:
    """`INSERT … SELECT` of one row given as a JSON object of every column: one parameter and a
    short statement (psycopg caches the parsing of statements under 4 KiB and 50 parameters only),
    and a new column with a Python default needs no change here. The record comes from a FROM
    item, not from `(jsonb_populate_record(…)).*` in the select list, which PostgreSQL expands
    into one call per column: 19 parses of the effect's JSON, 24 of the entry's (~0.4 ms)."""
    table = model._meta.db_table
    return (f"INSERT INTO {table} SELECT r.* FROM {source}, jsonb_populate_record(NULL::{table}, %({param})s) AS r "
            "RETURNING 1")


class _Shape:
    """A model's row for `_insert`, made from values without a model instance (building one took
    ~0.1 ms of the intercept's ~1.2). The other fields' defaults are read once, callable ones
    called per row, so a column added with a default needs no change here; auto_now fields
    are the caller's to give. `values()` is by attribute name, which `as_dict` and `announce`
    read off a `SimpleNamespace` of them exactly as off an instance."""

    def __init__(self, model: type) -> None:
        fields = model._meta.concrete_fields
        self.fixed = {f.attname: f.get_default() for f in fields if not (f.has_default() and callable(f.default))}
        self.fresh = [(f.attname, f.default) for f in fields if f.has_default() and callable(f.default)]
        # PostgreSQL reads uuids, times and decimals from their text form; JSON fields stay JSON.
        textual = (models.UUIDField, models.ForeignKey, models.DateTimeField, models.DecimalField)
        self.as_text = [(f.attname, f.column) for f in fields if isinstance(f, textual)]
        self.as_is = [(f.attname, f.column) for f in fields if not isinstance(f, textual)]

    def values(self, given: dict[str, Any]) -> dict[str, Any]:
        values = {**self.fixed, **{name: make() for name, make in self.fresh if name not in given}, **given}
        values["pk"] = values["id"]
        return values

    def row(self, values: dict[str, Any]) -> Jsonb:
        row = {column: values[name] for name, column in self.as_is}
        for name, column in self.as_text:
            value = values[name]
            row[column] = None if value is None else str(value)
        return _jsonb(row)


_EFFECT, _ENTRY = _Shape(Effect), _Shape(UndoEntry)


def _live(key: str) -> str:
    """`AgentKey.objects.live()` in SQL: not revoked, not past a rotation's grace period."""
    return f"{key}.revoked_at IS NULL AND ({key}.expires_at IS NULL OR {key}.expires_at > now())"


_EXISTING = ("id", "tool_name", "tier", "state", "step_index", "args", "result", "error", "created", "updated",
             "args_digest", "call_signature")
_SQL: dict[tuple, str] = {}
_CAP_GUARDS = {
    "max_tool_calls_per_run": "s.tool_calls + %(calls)s <= %(cap_calls)s",
    "max_irreversible_per_run": "s.irreversible_calls + %(irreversible)s <= %(cap_irreversible)s",
    "max_cost_per_run": "s.cost + %(cost)s <= %(cap_cost)s",
    TOOL_CAPS: "COALESCE((s.tool_counts ->> %(tool)s)::int, 0) + %(tool_calls)s <= %(cap_tool)s",
}
_SAFE_CALLS = """
), safe AS (
    INSERT INTO effects_safecall (session_id, tool_name, step_index, args, created)
    SELECT s.id, r.tool, r.step_index, r.args, %(now)s
    FROM s, jsonb_to_recordset(%(safe)s::jsonb) AS r(tool text, step_index int, args jsonb)
    RETURNING 1"""


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
    effect_sql, entry_sql = _insert(Effect, "effect", "s"), _insert(UndoEntry, "entry", "e")
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
      AND k.id = %(key)s AND k.agent_id = s.agent_id AND {_live('k')}{guards}
      AND NOT EXISTS (SELECT 1 FROM effects_effect x WHERE x.session_id = s.id AND x.call_signature = %(signature)s)
    RETURNING s.id{_SAFE_CALLS if with_safe_calls else ""}
), e AS ({effect_sql}), u AS ({entry_sql})
SELECT (SELECT count(*) FROM u), (SELECT config_version FROM orgs_organization WHERE id = %(org)s), {existing}
FROM (SELECT 1) one
LEFT JOIN effects_effect x ON x.session_id = %(session)s AND x.call_signature = %(signature)s
    AND EXISTS (SELECT 1 FROM effects_session s2 JOIN orgs_agentkey k2 ON k2.agent_id = s2.agent_id
                WHERE s2.id = x.session_id AND s2.agent_id = %(agent)s AND k2.id = %(key)s
                  AND {_live('k2')})
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


def execute(sql: str, params: dict[str, Any]) -> tuple | None:
    """Run one statement as a server-side prepared statement (planned once per connection, not per
    call: most of its cost otherwise), on its own in autocommit, or in a savepoint inside a caller's
    transaction (tests), so a unique violation leaves that transaction usable. Logged like every
    Django query, so query counts stay honest."""
    db = connections[DEFAULT_DB_ALIAS]  # `connection` is a proxy: each attribute is a lookup
    try:
        if db.in_atomic_block:
            with transaction.atomic():
                return prepared.row(db, sql, params)
        return prepared.row(db, sql, params)
    except (IntegrityError, psycopg.IntegrityError):
        return None  # a duplicate won the race on the signature: the pipeline replays it


def loaded(model: type, names: tuple[str, ...] | list[str], values: tuple | list) -> dict[str, Any]:
    """A row a raw statement read, by attribute name, its jsonb decoded as the ORM decodes it
    (Django's connection reads jsonb as text; its JSON fields parse it). Names that are not
    fields of `model` (a from_state) pass through."""
    fields = {f.attname: f for f in model._meta.concrete_fields}
    return {name: fields[name].from_db_value(value, None, connection)
            if isinstance(value, str) and isinstance(fields.get(name), models.JSONField) else value
            for name, value in zip(names, values, strict=True)}


def instance(model: type, values: tuple | list) -> Any:
    """A model instance from a raw statement's row of all its concrete fields, in order, as the ORM
    would load it (`loaded`, for a whole row): the fields' shape is worked out once per model, as
    per row it was a fifth of a fleet walk's CPU (two instances per entry per round)."""
    names, json_fields = _shape(model)
    values = list(values)
    for index, json_field in json_fields:
        if isinstance(values[index], str):
            values[index] = json_field.from_db_value(values[index], None, connection)
    return model.from_db(DEFAULT_DB_ALIAS, names, values)


@functools.cache
def _shape(model: type) -> tuple[list[str], list[tuple[int, Any]]]:
    fields = model._meta.concrete_fields
    return ([f.attname for f in fields],
            [(index, f) for index, f in enumerate(fields) if isinstance(f, models.JSONField)])


# ---------------------------------------------------------------- intercept

def intercept(request, session_id: str) -> HttpResponse | None:
    """The answer to an intercept request, or None for the pipeline to give it."""
    key = _remembered_key(request)
    data = _json_body(request) if key is not None else None
    if not isinstance(data, dict):
        return None
    try:
        call = pipeline.parse(data)
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
            any(c.output is not pipeline.NO_OUTPUT for c in call.safe_calls):
        # The org's rules decide (compensable calls too, in an org whose rules may hold them), or
        # an output must be fingerprinted: a read, then the write (lifecycle/intercept/two_statements.py).
        from lifecycle.intercept import two_statements  # built on this module's statements

        return two_statements.intercept(key, config, tool, call, session)
    if tool.compensation_fn is None:
        return None
    limits = config.limits_for(key.org_id, key.agent_id)
    caps = _run_caps(limits, tool)
    if caps is None:
        return None
    AgentKey.touch_remembered(key)
    return _admit(key, config, limits, tool, call, session, caps)


def _admit(key: RememberedKey, config: OrgConfig, limits: Limits, tool: Tool, call: pipeline.Call,
           session: uuid.UUID, caps: tuple[str, ...]) -> HttpResponse | None:
    now = timezone.now()
    signature = pipeline.signature_of(session, call)
    effect = _EFFECT.values({**pipeline.effect_values(key.org_id, session, tool, call, signature),
                             "created": now, "updated": now})
    entry = _ENTRY.values({**pipeline.undo_entry_values(tool, effect), "effect_id": effect["id"],
                           "created": now, "updated": now})
    safe = {c.step_index: c for c in call.safe_calls}  # a step reported twice counts once (the pipeline's rule)
    charge = Charge()
    for reported in safe.values():
        charge.add(reported.tool, config.tools.get(reported.tool))
    tool_calls_before = charge.counts.get(tool.name, 0)
    charge.add(tool.name, tool)
    sql = _intercept_sql(caps, bool(safe))
    params = {"calls": charge.calls, "irreversible": charge.irreversible, "cost": charge.cost,
              "counts": _jsonb(charge.counts), "tool": tool.name, "tool_calls": tool_calls_before + 1,
              "step": max(call.step_index, *safe) if safe else call.step_index, "now": now, "session": session,
              "agent": key.agent_id, "version": config.version, "key": key.id, "signature": signature,
              "org": key.org_id, "cap_calls": limits.values["max_tool_calls_per_run"],
              "cap_irreversible": limits.values["max_irreversible_per_run"],
              "cap_cost": limits.values["max_cost_per_run"], "cap_tool": limits.tool_caps.get(tool.name),
              "safe": _jsonb([{"tool": c.tool, "step_index": c.step_index, "args": c.args} for c in safe.values()]),
              "safe_steps": list(safe),
              "effect": _EFFECT.row(effect), "entry": _ENTRY.row(entry)}
    row = execute(sql, params)
    if row is None:
        return None
    pushed, version, *existing = row
    if pushed:
        made, pushed_entry = SimpleNamespace(**effect), SimpleNamespace(**entry)
        announce(made, "effect", None, Effect.State.EXECUTING, name=tool.name, session_id=session,
                 org_id=key.org_id, step_index=call.step_index)
        answer = pipeline.executed(made, pushed_entry)
        return _respond(answer.status, answer.body)
    OrgConfig.forget(key.org_id, version)
    # A replay that reports SAFE calls may charge some: the pipeline does that bookkeeping.
    return None if safe else _replay(existing, call, session)


def _replay(existing: list, call: pipeline.Call, session: uuid.UUID) -> HttpResponse | None:
    if existing[0] is None:
        return None
    effect = Effect(session_id=session, **loaded(Effect, _EXISTING, existing))
    if effect.tier != Tier.COMPENSABLE:
        return None  # an irreversible replay carries its approval: the pipeline builds that
    if call.idempotency_key and (effect.tool_name != call.tool or
                                 effect.args_digest != call.args_digest):
        return None  # the pipeline answers 409 idempotency_key_reused
    return _respond(200, {"decision": "replay", "effect": effect.as_dict()})


# ---------------------------------------------------------------- commit

_COMMIT_SQL = f"""
WITH old AS (
    SELECT e.id, e.state FROM effects_effect e
    JOIN effects_session s ON s.id = e.session_id
    JOIN orgs_agentkey k ON k.agent_id = s.agent_id
    WHERE e.id = %(effect)s AND s.agent_id = %(agent)s AND e.state IN ('executing', 'approved')
      AND NOT e.undo_needs_result
      AND NOT EXISTS (SELECT 1 FROM effects_tool t WHERE t.id = e.tool_id AND t.labels @> '["untrusted"]'::jsonb)
      AND k.id = %(key)s AND {_live('k')}
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
    key = _remembered_key(request)
    data = _json_body(request) if key is not None else None
    if not isinstance(data, dict) or set(data) - {"result"}:
        return None
    try:
        effect_uuid = uuid.UUID(effect_id)
    except ValueError:
        return None
    config = OrgConfig.of(key.org_id)
    refused = config.rate_limited(request, key) if config else None
    if refused is not None:
        return refused
    result = data.get("result")
    now = timezone.now()
    AgentKey.touch_remembered(key)
    row = execute(_COMMIT_SQL, {"effect": effect_uuid, "agent": key.agent_id, "key": key.id, "now": now,
                                 "result": None if result is None else _jsonb(result),  # SQL NULL, as the ORM writes it
                                 "actor": f"agent:{key.agent_name}"})
    if row is None:
        return None  # not this agent's, not executing or approved, or gone: the viewset says which
    found = loaded(Effect, _COMMITTED, row)
    from_state = found.pop("from_state")
    effect = Effect(state=Effect.State.COMMITTED, result=result, updated=now, **found)
    longpoll.publish(effect.pk)
    announce(effect, "effect", from_state, Effect.State.COMMITTED, name=effect.tool_name,
             session_id=effect.session_id, org_id=effect.org_id, step_index=effect.step_index)
    return _respond(200, {"effect": effect.as_dict()})
