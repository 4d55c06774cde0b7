"""Statements prepared on the PostgreSQL server, for the few hot paths written out in SQL (the
fast path's intercept, the fast approval path, the run-aware rules' read of a run's fingerprints):
planning them was most of their time, every call, and psycopg prepares a statement once per
connection when asked to. Logged as Django logs its own, so tests that pin statements count them."""

from __future__ import annotations

import time
from typing import Any


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
