"""Statements prepared on the PostgreSQL server, for the few hot paths written out in SQL (the
intercept's one-statement and two-statement paths, the walk's claim and record, the run-aware
rules' read of a run's fingerprints): planning them was most of their time, every call, and psycopg
prepares a statement once per connection when asked to. Logged as Django logs its own, so tests
that pin statements count them. And the rows such a statement reads, loaded as the ORM would."""

from __future__ import annotations

import functools
import time
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, models, transaction


def rows(db: Any, sql: str, params: Any) -> list[tuple]:
    return _run(db, sql, params, lambda cursor: cursor.fetchall())


def row(db: Any, sql: str, params: Any) -> tuple | None:
    return _run(db, sql, params, lambda cursor: cursor.fetchone())


def _run(db: Any, sql: str, params: Any, fetch: Any) -> Any:
    import psycopg  # PostgreSQL only: an embedded (SQLite) install need not have it

    db.ensure_connection()
    started = time.monotonic()
    try:
        with psycopg.Cursor(db.connection) as cursor:
            cursor.execute(sql, params, prepare=True)
            return fetch(cursor)
    finally:
        if db.queries_logged:
            db.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})


def available() -> bool:
    """Whether the hot paths' statements can run here (PostgreSQL; SQLite takes the ORM's paths)."""
    return connection.vendor == "postgresql"


def execute(sql: str, params: dict[str, Any]) -> tuple | None:
    """Run one statement as a server-side prepared statement (planned once per connection, not per
    call: most of its cost otherwise), on its own in autocommit, or in a savepoint inside a caller's
    transaction (tests), so a unique violation leaves that transaction usable; None after one.
    Logged like every Django query, so query counts stay honest."""
    db = connections[DEFAULT_DB_ALIAS]  # `connection` is a proxy: each attribute is a lookup
    try:
        if db.in_atomic_block:
            with transaction.atomic():
                return row(db, sql, params)
        return row(db, sql, params)
    except Exception as exc:
        import psycopg  # PostgreSQL only, as in `_run`

        if isinstance(exc, IntegrityError | psycopg.IntegrityError):
            return None  # a duplicate won the race on a unique constraint: the caller's ORM path answers
        raise


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
