"""Wake-ups for long polls on an effect, over Redis pub/sub.

A transition publishes after commit; a waiter re-reads the row when woken and at least
once a second anyway, so a lost message only costs up to a second, never a wrong answer.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from functools import lru_cache

import redis
from django.conf import settings


@lru_cache(maxsize=1)
def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=2)


# The states a long poll waits on (`GET /effects/{id}?wait=`): a move out of any other wakes nobody.
WAITED_ON = frozenset({"pending", "executing", "approved"})


def channel(effect_id: uuid.UUID | str) -> str:
    return f"undolog:effect:{effect_id}"


def publish(effect_id: uuid.UUID | str) -> None:
    try:
        _client().publish(channel(effect_id), b"1")
    except redis.RedisError:
        pass  # waiters fall back to their once-a-second re-read


def wait(effect_id: uuid.UUID | str, seconds: float, changed: Callable[[], bool]) -> None:
    """Return when `changed()` is true, or after `seconds`."""
    deadline = time.monotonic() + seconds
    pubsub = None
    try:
        pubsub = _client().pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(channel(effect_id))
    except redis.RedisError:
        pubsub = None
    try:
        # Check after subscribing, so a change between the caller's read and now is not missed.
        while not changed():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if pubsub is None:
                time.sleep(min(0.25, remaining))
            else:
                try:
                    pubsub.get_message(timeout=min(1.0, remaining))
                except redis.RedisError:
                    pubsub = None
    finally:
        if pubsub is not None:
            try:
                pubsub.close()
            except redis.RedisError:
                pass
