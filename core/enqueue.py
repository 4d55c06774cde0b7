"""Sending a Celery task without letting a broker outage fail the request that sends it.

Every task undolog sends has a row behind it (an undo entry due, a delivery, an escalation) that
a beat sweep finds when its message never arrives, so a message is only the fast way to start
the work. When Redis is down, `enqueue` logs and returns False instead of raising into a request
whose transaction has already committed, and for `UNDOLOG_ENQUEUE_BACKOFF_S` afterwards it does
not try at all (a publish against a dead broker costs kombu's retries, not something to pay on
every intercept). When Redis is back, the sweeps catch up from the rows.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from kombu.exceptions import KombuError, OperationalError
from redis import RedisError

log = logging.getLogger(__name__)

_down_until = 0.0


def enqueue(task: Any, *args: Any, countdown: float | None = None) -> bool:
    """`task.apply_async(args, countdown=)`; False (logged) when the broker cannot take it."""
    global _down_until
    if time.monotonic() < _down_until:
        log.info("%s%s not sent (broker down a moment ago); its sweep will pick it up", task.name, args)
        return False
    try:
        task.apply_async(args, countdown=countdown or None)
    except (OperationalError, KombuError, RedisError, OSError) as exc:
        _down_until = time.monotonic() + settings.UNDOLOG_ENQUEUE_BACKOFF_S
        log.warning("%s%s not sent (broker: %s); its sweep will pick it up", task.name, args, exc)
        return False
    return True
