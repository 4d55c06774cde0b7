"""GET /healthz: 200 `ok` when the database and Redis answer; 200 `degraded` naming Redis when only
Redis does not (the API keeps working on PostgreSQL alone: a load balancer must not take the node
out); 503 `unhealthy` when the database does not.

It answers within UNDOLOG_HEALTHZ_TIMEOUT_MS (800 ms) whatever is down: both checks run at once in
threads of their own, and a check that has not answered by then counts as failed (a partitioned
database holds a query until the TCP timeout; a load balancer whose check times out first would
see a dead node, not a 503)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import redis
from django.conf import settings
from django.db import connections

from core.renderers import JsonLineResponse

# Checks stuck on a dead peer keep their thread until their own timeouts end; a few at most.
_checks = ThreadPoolExecutor(max_workers=4, thread_name_prefix="healthz")


def healthz(request) -> JsonLineResponse:
    timeout = settings.UNDOLOG_HEALTHZ_TIMEOUT_MS / 1000
    database, cache = _checks.submit(_database, timeout), _checks.submit(_redis, timeout)
    checks = {"database": _outcome(database, timeout), "redis": _outcome(cache, timeout)}
    if checks["database"] != "ok":
        return JsonLineResponse({"status": "unhealthy", "degraded": [], **checks}, status=503)
    degraded = [name for name, value in checks.items() if value != "ok"]
    return JsonLineResponse({"status": "degraded" if degraded else "ok", "degraded": degraded, **checks})


def _outcome(check, timeout: float) -> str:
    try:
        check.result(timeout=timeout)
    except FutureTimeout:
        return f"error: no answer within {timeout:g} s"
    except Exception as exc:  # any driver error means unhealthy
        return f"error: {exc}"
    return "ok"


def _database(timeout: float) -> None:
    db = connections["default"]
    if db.vendor == "postgresql" and db.settings_dict["OPTIONS"].get("pool"):
        # The pool itself, with the check's deadline: a request's wait (DB_POOL_TIMEOUT_MS) is longer.
        db.pool.open()  # Django opens it on a request's first connection; this may come first
        with db.pool.connection(timeout=timeout) as conn:
            conn.execute("SELECT 1")
        return
    try:
        with db.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        db.close()


def _redis(timeout: float) -> None:
    redis.Redis.from_url(settings.REDIS_URL, socket_timeout=timeout, socket_connect_timeout=timeout).ping()
