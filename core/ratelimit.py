"""Rate limits counted in Redis, so that they hold across every web node.

Two uses:

- `check(limits)`: the API's per-key and per-org limits. Each limit is a GCRA (generic cell rate
  algorithm) cell: Redis keeps one number per limiter, the "theoretical arrival time" of the next
  request, so a limit of N per window admits a burst of N and then one request every window/N,
  with an exact `Retry-After`. Every limiter of a request is checked and charged by one Lua
  script (one round trip), and only if all admit it: a request refused by the org's limit does
  not use up its key's. The script reads Redis' clock, so nodes with skewed clocks agree.
- `failures(...)`, `fail(...)`, `forget(...)`: fixed-window counters of failed sign-ins
  (orgs/login.py), read with one MGET and bumped with one pipeline.

Redis down fails open: a limit is a protection, not a rule the rows depend on, and the API keeps
working on PostgreSQL alone. After an error the limiter does not ask Redis again for
`UNDOLOG_RATE_LIMIT_BACKOFF_S`, so a dead Redis costs one short timeout, not one per request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings

from undolog_site.errors import DomainError

log = logging.getLogger(__name__)

# KEYS: one per limiter. ARGV: per limiter, its limit and its window in microseconds.
# Returns {0, 0} when every limiter admits (and charges them all), else {i, wait_us} for the
# first limiter i (1-based) that refuses, charging none.
_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tats = {}
for i, key in ipairs(KEYS) do
  local limit = tonumber(ARGV[2 * i - 1])
  local window = tonumber(ARGV[2 * i])
  local interval = math.floor(window / limit)
  local tat = tonumber(redis.call('GET', key) or now)
  if tat < now then tat = now end
  local next_tat = tat + interval
  if next_tat - window > now then
    return {i, next_tat - window - now}
  end
  tats[i] = next_tat
end
for i, key in ipairs(KEYS) do
  redis.call('SET', key, string.format('%.0f', tats[i]), 'PX', math.ceil((tats[i] - now) / 1000) + 1000)
end
return {0, 0}
"""


@dataclass(frozen=True)
class Limit:
    """At most `max_requests` per `window_s` for one subject (a key's prefix, a person, an org)."""

    scope: str  # "key" | "org"
    subject: str
    max_requests: int
    window_s: int = 60

    @property
    def redis_key(self) -> str:
        # The limit is part of the name: a changed limit starts a fresh cell instead of inheriting
        # a theoretical arrival time computed at another rate.
        return f"undolog:rl:{self.scope}:{self.subject}:{self.max_requests}:{self.window_s}"


class RateLimited(DomainError):
    """429: the caller sends faster than its key's or its org's limit. Not the budget's 429
    (`decision: refused`): nothing about the call was judged, it was not looked at."""

    status_code = 429
    code = "rate_limited"

    def __init__(self, limit: Limit, retry_after_s: int) -> None:
        whose = "this key" if limit.scope == "key" else "this organization"
        super().__init__(
            f"Rate limit reached: {whose} may send {limit.max_requests} requests per {limit.window_s} s. "
            f"Nothing was done; retry in {retry_after_s} s.",
            limit={"scope": limit.scope, "max_requests": limit.max_requests, "window_s": limit.window_s},
            retry_after_s=retry_after_s)
        self.headers = {"Retry-After": str(retry_after_s)}


class _Redis:
    """One client per process, and the fail-open backoff after an error."""

    def __init__(self) -> None:
        self._client: redis.Redis | None = None
        self._script: Any = None
        self._down_until = 0.0
        self._lock = threading.Lock()

    def client(self) -> redis.Redis | None:
        if time.monotonic() < self._down_until:
            return None
        if self._client is None:
            with self._lock:
                if self._client is None:
                    timeout = settings.UNDOLOG_RATE_LIMIT_TIMEOUT_MS / 1000
                    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=timeout,
                                                  socket_connect_timeout=timeout)
                    self._script = client.register_script(_GCRA)
                    self._client = client
        return self._client

    def failed(self, exc: Exception) -> None:
        self._down_until = time.monotonic() + settings.UNDOLOG_RATE_LIMIT_BACKOFF_S
        log.warning("rate limits not counted for %s s (Redis: %s); requests are let through",
                    settings.UNDOLOG_RATE_LIMIT_BACKOFF_S, exc)


_redis = _Redis()


def enabled() -> bool:
    return settings.UNDOLOG_RATE_LIMITS


def check(limits: Sequence[Limit]) -> None:
    """Charge one request to every limit, or raise `RateLimited` (charging none). Fails open."""
    limits = [limit for limit in limits if limit.max_requests]
    client = _redis.client() if limits else None
    if client is None:
        return
    args: list[int] = []
    for limit in limits:
        args += [limit.max_requests, limit.window_s * 1_000_000]
    try:
        refused, wait_us = _redis._script(keys=[limit.redis_key for limit in limits], args=args, client=client)
    except redis.RedisError as exc:
        _redis.failed(exc)
        return
    if refused:
        raise RateLimited(limits[int(refused) - 1], max(1, -(-int(wait_us) // 1_000_000)))


def api_limits(org_id: Any, subject: str, per_key: int | None, per_org: int | None) -> list[Limit]:
    """The limits of one API request: its key's (`key:<agent key prefix>` or `user:<id>`) and its org's,
    each the org's own setting or else the server's default."""
    return [Limit("key", subject, settings.UNDOLOG_RATE_LIMIT_PER_KEY if per_key is None else per_key),
            Limit("org", str(org_id), settings.UNDOLOG_RATE_LIMIT_PER_ORG if per_org is None else per_org)]


# ---------------------------------------------------------------- failure counters (sign-in)

def failures(keys: Sequence[str]) -> list[tuple[int, int]]:
    """(count, seconds until the window ends) of each counter; zeros when Redis is down."""
    client = _redis.client()
    if client is None:
        return [(0, 0)] * len(keys)
    try:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
            pipe.ttl(key)
        answers = pipe.execute()
    except redis.RedisError as exc:
        _redis.failed(exc)
        return [(0, 0)] * len(keys)
    return [(int(answers[i] or 0), max(0, int(answers[i + 1]))) for i in range(0, len(answers), 2)]


def fail(keys: Sequence[str], window_s: int) -> None:
    """Count one failure on each counter (a window starts at its first failure)."""
    client = _redis.client()
    if client is None:
        return
    try:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.set(key, 0, ex=window_s, nx=True)  # not EXPIRE NX: the embedded Redis predates it
            pipe.incr(key)
        pipe.execute()
    except redis.RedisError as exc:
        _redis.failed(exc)


def forget(keys: Sequence[str]) -> None:
    client = _redis.client()
    if client is None:
        return
    try:
        client.delete(*keys)
    except redis.RedisError as exc:
        _redis.failed(exc)
