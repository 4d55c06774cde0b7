"""Rate limits counted in Redis, so that they hold across every web node.

Two uses:

- `check(limits)`: the API's per-key and per-org limits. Each limit is a GCRA (generic cell rate
  algorithm) cell: Redis keeps one number per limiter, the "theoretical arrival time" of the next
  request, so a limit of N per window admits a burst of N and then one request every window/N,
  with an exact `Retry-After`. Every limiter of a request is checked and charged by one Lua
  script (one round trip), and only if all admit it: a request refused by the org's limit does
  not use up its key's. The script reads Redis' clock, so nodes with skewed clocks agree.

  A round trip per request was the largest single cost of the intercept's fast path (~0.3 ms of
  CPU and 0.5 ms of wall time of a ~2 ms request), so a process leases tokens: the script
  charges a batch to the cell at once, and the process spends it locally for at most
  `UNDOLOG_RATE_LIMIT_LEASE_MS`. A batch starts at one token and doubles each time it is used
  up within its lease (up to a lease's worth of the limit's rate), so a slow caller still pays
  one round trip per request and is charged exactly; tokens left when a lease ends are given
  back to the cell on the process's next round trip. Every token is charged in Redis before it
  admits a request, so the limit is never exceeded across nodes; what leasing costs is that a
  process may hold a few tokens another process then misses for up to one lease.
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
from functools import cached_property
from typing import Any

import redis
from django.conf import settings

from core.errors import DomainError

log = logging.getLogger(__name__)

# KEYS: one per limiter. ARGV: per limiter, its limit, its window in microseconds, the tokens
# wanted (0: this limiter still has some in the process; only its refund applies) and the tokens
# given back (a lease's leftovers). Returns {0, granted_1, granted_2, ...} when every limiter that
# wants tokens can give at least one (each gives up to what it was asked, all charged at once),
# else {i, wait_us} for the first limiter i (1-based) that cannot, charging none.
_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tats, granted = {}, {0}
for i, key in ipairs(KEYS) do
  local limit = tonumber(ARGV[4 * i - 3])
  local window = tonumber(ARGV[4 * i - 2])
  local want = tonumber(ARGV[4 * i - 1])
  local refund = tonumber(ARGV[4 * i])
  local interval = math.floor(window / limit)
  local tat = tonumber(redis.call('GET', key) or now) - refund * interval
  if tat < now then tat = now end
  local grant = want
  if want > 0 and interval > 0 then
    grant = math.min(want, math.floor((now + window - tat) / interval))
    if grant < 1 then
      return {i, tat + interval - window - now}
    end
  end
  tats[i] = tat + grant * interval
  granted[i + 1] = grant
end
for i, key in ipairs(KEYS) do
  redis.call('SET', key, string.format('%.0f', tats[i]), 'PX', math.ceil((tats[i] - now) / 1000) + 1000)
end
return granted
"""


@dataclass(frozen=True)
class Limit:
    """At most `max_requests` per `window_s` for one subject (a key's prefix, a person, an org)."""

    scope: str  # "key" | "org"
    subject: str
    max_requests: int
    window_s: int = 60

    @cached_property
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


@dataclass
class _Lease:
    """Tokens of one limiter this process holds until `until` (monotonic), and the next batch."""

    tokens: int = 0
    until: float = 0.0
    batch: int = 1

    def live(self, now: float) -> bool:
        return self.tokens > 0 and self.until > now

    def renew(self, limit: Limit, now: float) -> tuple[int, int]:
        """(tokens to ask for, tokens to give back), adapting the batch: doubled when the last
        one was used up within its lease, shrunk by what was left when it ran out of time."""
        ceiling = max(1, min(_MAX_BATCH, int(limit.max_requests * _lease_s() / limit.window_s)))
        if self.tokens:  # the lease ran out with tokens left: the caller is slower than the batch
            self.batch = max(1, self.batch - self.tokens)
        elif self.until > now:
            self.batch = min(ceiling, self.batch * 2)
        self.batch = min(self.batch, ceiling)
        refund, self.tokens = self.tokens, 0
        return self.batch, refund


_MAX_BATCH = 256
_MAX_LEASES = 10_000


def _lease_s() -> float:
    return settings.UNDOLOG_RATE_LIMIT_LEASE_MS / 1000


class _Redis:
    """One client per process, and the fail-open backoff after an error."""

    def __init__(self) -> None:
        self._client: redis.Redis | None = None
        self._script: Any = None
        self._down_until = 0.0
        self._lock = threading.Lock()
        self.leases: dict[str, _Lease] = {}
        self.leases_lock = threading.Lock()
        self.round_trips = 0

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
    """Charge one request to every limit, or raise `RateLimited` (charging none). Fails open.
    A round trip only when a limit's leased tokens are used up or their lease has ended."""
    limits = [limit for limit in limits if limit.max_requests]
    if not limits:
        return
    now = time.monotonic()
    # The lock guards the leases only: the round trip happens outside it, so a thread whose
    # tokens are live never waits for another thread's Redis call.
    with _redis.leases_lock:
        if len(_redis.leases) > _MAX_LEASES:  # one per key and org seen: drop the idle ones
            _redis.leases = {name: lease for name, lease in _redis.leases.items() if lease.until > now}
        leases = [_redis.leases.setdefault(limit.redis_key, _Lease()) for limit in limits]
        if all(lease.live(now) for lease in leases):
            for lease in leases:
                lease.tokens -= 1
            return
        args: list[int] = []
        for limit, lease in zip(limits, leases, strict=True):
            want, refund = (0, 0) if lease.live(now) else lease.renew(limit, now)
            args += [limit.max_requests, limit.window_s * 1_000_000, want, refund]
        _redis.round_trips += 1
    client = _redis.client()
    if client is None:
        return
    try:
        answer = _redis._script(keys=[limit.redis_key for limit in limits], args=args, client=client)
    except redis.RedisError as exc:
        _redis.failed(exc)
        return
    if answer[0]:
        raise RateLimited(limits[int(answer[0]) - 1], max(1, -(-int(answer[1]) // 1_000_000)))
    until = now + _lease_s()
    with _redis.leases_lock:
        for lease, granted in zip(leases, answer[1:], strict=True):
            if granted:
                # Another thread may have renewed it meanwhile: its tokens are charged too, keep them.
                lease.tokens = (lease.tokens if lease.until > now else 0) + int(granted)
                lease.until = until
            lease.tokens -= 1


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
