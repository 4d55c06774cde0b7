"""GET /healthz: 200 `ok` when the database and Redis answer; 200 `degraded` naming Redis when only
Redis does not (the API keeps working on PostgreSQL alone: a load balancer must not take the node
out); 503 `unhealthy` when the database does not."""

from __future__ import annotations

import redis
from django.conf import settings
from django.db import connection

from core.renderers import JsonLineResponse


def healthz(request) -> JsonLineResponse:
    checks = {"database": "ok", "redis": "ok"}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # any driver error means unhealthy
        checks["database"] = f"error: {exc}"
    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        checks["redis"] = f"error: {exc}"
    if checks["database"] != "ok":
        return JsonLineResponse({"status": "unhealthy", "degraded": [], **checks}, status=503)
    degraded = [name for name, value in checks.items() if value != "ok"]
    return JsonLineResponse({"status": "degraded" if degraded else "ok", "degraded": degraded, **checks})
