"""Leased tokens (core/ratelimit.py): a busy process asks Redis once per batch instead of once per
request, a slow one still once per request; several processes together never pass the limit;
tokens a process did not use go back to the cell. Against the real Redis; each `_Redis()` is one
process's limiter (its own leases), all sharing Redis' cells."""

from __future__ import annotations

import uuid

import pytest

from core import ratelimit


@pytest.fixture
def process():
    """A fresh limiter per call: a process of its own; the module's limiter is left alone."""
    saved = ratelimit._redis
    made: list[ratelimit._Redis] = []

    def make() -> ratelimit._Redis:
        made.append(ratelimit._Redis())
        return made[-1]

    yield make
    ratelimit._redis = saved


def limit(max_requests: int, window_s: int = 60) -> ratelimit.Limit:
    return ratelimit.Limit("key", f"test-{uuid.uuid4().hex[:12]}", max_requests, window_s)


def admitted(limiter: ratelimit._Redis, limits: list[ratelimit.Limit], n: int) -> int:
    ratelimit._redis = limiter
    count = 0
    for _ in range(n):
        try:
            ratelimit.check(limits)
            count += 1
        except ratelimit.RateLimited:
            pass
    return count


def test_a_busy_caller_asks_redis_once_per_batch(process):
    one = process()
    cell = limit(1200)  # 20 a second: a batch is at most a 250 ms lease's worth, 5 tokens

    assert admitted(one, [cell], 200) == 200
    assert one.round_trips <= 200 // 5 + 3, one.round_trips  # 1, 2, 4, then 5 at a time


def test_a_slow_caller_is_charged_one_token_per_request(process, settings):
    settings.UNDOLOG_RATE_LIMIT_LEASE_MS = 1
    one = process()
    cell = limit(1200)

    for _ in range(5):
        assert admitted(one, [cell], 1) == 1
        one.leases[cell.redis_key].until = 0  # its lease ran out before the next request
    assert one.round_trips == 5 and one.leases[cell.redis_key].batch == 1


def test_processes_together_never_pass_the_limit(process):
    processes = [process() for _ in range(3)]
    cell = limit(600)  # a burst of 600; batches of up to 2

    total = 0
    for _ in range(300):  # interleaved, as a load balancer would spread them
        total += sum(admitted(p, [cell], 1) for p in processes)

    # 900 asked; at most 600 (plus the few the cell regains while the test runs, 10 a second).
    assert 600 - 3 * 2 <= total <= 600 + 10, total


def test_tokens_a_process_did_not_use_go_back_to_the_cell(process, settings):
    one = process()
    cell = limit(6000)  # 100 a second: batches of up to 25
    assert admitted(one, [cell], 40) == 40
    lease = one.leases[cell.redis_key]
    assert lease.tokens > 0  # holds some it has not used
    client = one.client()
    before = int(client.get(cell.redis_key))

    lease.until = 0  # its lease ends
    assert admitted(one, [cell], 1) == 1

    after = int(client.get(cell.redis_key))
    assert after < before  # the leftovers were given back (less the one token just charged)


def test_the_org_limit_refusing_charges_the_key_nothing(process):
    one = process()
    key, org = limit(1000), limit(2)

    assert admitted(one, [key, org], 5) == 2
    tat_key = int(one.client().get(key.redis_key))
    assert admitted(one, [key, org], 5) == 0
    assert int(one.client().get(key.redis_key)) == tat_key
