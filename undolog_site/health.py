"""GET /healthz: 200 when the database and Redis answer, 503 naming what does not."""

from __future__ import annotations

import redis
from django.conf import settings
from django.db import connection
from django.http import JsonResponse


def healthz(request) -> JsonResponse:
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
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse({"status": "ok" if healthy else "unhealthy", **checks}, status=200 if healthy else 503)
