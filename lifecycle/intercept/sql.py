"""The SQL the fast paths share: a model's row made from values and inserted from one jsonb
parameter, a live agent key's test, the reported SAFE calls' insert, and jsonb parameters dumped
as the answers are (`wire.dumps`). Running such a statement is `core.prepared.execute`."""

from __future__ import annotations

from typing import Any

from django.db import models
from psycopg.types.json import Jsonb

from lifecycle.intercept.wire import dumps


def insert_sql(model: type, param: str, source: str) -> str:
    """`INSERT … SELECT` of one row given as a JSON object of every column: one parameter and a
    short statement (psycopg caches the parsing of statements under 4 KiB and 50 parameters only),
    and a new column with a Python default needs no change here. The record comes from a FROM
    item, not from `(jsonb_populate_record(…)).*` in the select list, which PostgreSQL expands
    into one call per column: 19 parses of the effect's JSON, 24 of the entry's (~0.4 ms)."""
    table = model._meta.db_table
    return (f"INSERT INTO {table} SELECT r.* FROM {source}, jsonb_populate_record(NULL::{table}, %({param})s) AS r "
            "RETURNING 1")


class Shape:
    """A model's row for `insert_sql`, made from values without a model instance (building one took
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
        return jsonb(row)


def live_key(key: str) -> str:
    """`AgentKey.objects.live()` in SQL: not revoked, not past a rotation's grace period."""
    return f"{key}.revoked_at IS NULL AND ({key}.expires_at IS NULL OR {key}.expires_at > now())"


SAFE_CALLS = """
), safe AS (
    INSERT INTO effects_safecall (session_id, tool_name, step_index, args, created)
    SELECT s.id, r.tool, r.step_index, r.args, %(now)s
    FROM s, jsonb_to_recordset(%(safe)s::jsonb) AS r(tool text, step_index int, args jsonb)
    RETURNING 1"""


def jsonb(value: Any) -> Jsonb:
    """A jsonb parameter dumped by `dumps` rather than psycopg's standard library default."""
    return Jsonb(value, dumps=dumps)
