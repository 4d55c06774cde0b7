"""Python compensation handlers for the tests, registered by dotted path."""

from __future__ import annotations

import time

from effects.handlers import PermanentCompensationError

calls: list[tuple[dict, object]] = []


def restore(args: dict, context) -> None:
    calls.append((args, context))


def gone_for_good(args: dict, context) -> None:
    calls.append((args, context))
    raise PermanentCompensationError("the mailbox no longer exists")


def flaky(args: dict, context) -> None:
    calls.append((args, context))
    if context.attempt < 3:
        raise ConnectionError("mail server unreachable")


def slow_then_fast(args: dict, context) -> None:
    calls.append((args, context))
    if context.attempt == 1:
        try:
            time.sleep(5)
        except Exception:  # a careless handler must not swallow its own timeout
            pass
