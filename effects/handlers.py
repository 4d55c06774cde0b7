"""Compensation handlers: how one attempt of one undo entry is run.

A *webhook* handler POSTs `{fn_name, fn_version, args, effect_id, session_id, attempt}` signed
with the org's webhook secret and an `Idempotency-Key` (the undo entry's id): 2xx is done,
4xx other than 408/429 is permanent, anything else (5xx, timeout, refused connection) is
retried. A *python* handler is a dotted path to `fn(args: dict, context) -> None` run in the
worker; raising `PermanentCompensationError` stops the retries, any other exception is retried.

Handlers run outside any database transaction: a slow receiver must never hold a row lock.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import transaction
from django.utils.module_loading import import_string

from core import outbound as webhooks
from effects.models import CompensationFunction, UndoEntry


class PermanentCompensationError(Exception):
    """Raised by a python compensation that cannot succeed by trying again (e.g. the record
    it should restore is gone for good). The entry goes to a person at once."""


class CompensationTimeout(BaseException):
    """The python handler ran past its function's timeout. A BaseException, so that a handler's
    own `except Exception` cannot swallow it and carry on past its deadline."""


@dataclass(frozen=True)
class CompensationContext:
    """What a python handler knows about the attempt it is running."""

    idempotency_key: str  # the undo entry's id: the same on every attempt of this entry
    entry_id: str
    effect_id: str
    session_id: str
    org_id: str
    fn_name: str
    fn_version: str
    attempt: int
    timeout_s: float


@dataclass(frozen=True)
class Result:
    """The outcome of one attempt, as the walk records it."""

    ok: bool
    permanent: bool
    error: str
    duration_ms: int
    status_code: int | None = None


def run(entry: UndoEntry, fn: CompensationFunction, attempt: int) -> Result:
    if transaction.get_connection().in_atomic_block:
        # A webhook inside a transaction would hold the claim's locks for as long as the receiver
        # takes, and a rollback would forget an attempt the receiver has seen.
        raise RuntimeError("a compensation handler must not run inside a database transaction")
    if fn.handler == CompensationFunction.Handler.WEBHOOK:
        return run_webhook(entry, fn, attempt)
    return run_python(entry, fn, attempt)


def run_webhook(entry: UndoEntry, fn: CompensationFunction, attempt: int) -> Result:
    request = _request(entry, fn, attempt)
    delivery = webhooks.post(request.url, request.payload, secret=request.secret, timeout_s=request.timeout_s,
                             headers=request.headers)
    return _result(delivery)


def run_webhooks(attempts: list[tuple[UndoEntry, CompensationFunction, int]]) -> list[Result]:
    """`run_webhook` for many entries at once, sent concurrently (a fleet rollback's round: one
    entry of each of many runs, so no order among them to keep). Outside any transaction."""
    if transaction.get_connection().in_atomic_block:
        raise RuntimeError("a compensation handler must not run inside a database transaction")
    deliveries = webhooks.post_many([_request(entry, fn, attempt) for entry, fn, attempt in attempts])
    return [_result(delivery) for delivery in deliveries]


def _request(entry: UndoEntry, fn: CompensationFunction, attempt: int) -> webhooks.Request:
    payload = {"fn_name": entry.fn_name, "fn_version": entry.fn_version, "args": entry.args,
               "effect_id": str(entry.effect_id), "session_id": str(entry.session_id), "attempt": attempt}
    return webhooks.Request(fn.target, payload, fn.org.signing_secrets(), fn.timeout_ms / 1000,
                            {"Idempotency-Key": str(entry.id)})


def _result(delivery: webhooks.Delivery) -> Result:
    return Result(ok=delivery.ok, permanent=not delivery.ok and not delivery.retryable, error=delivery.error,
                  duration_ms=delivery.duration_ms, status_code=delivery.status_code)


def run_python(entry: UndoEntry, fn: CompensationFunction, attempt: int) -> Result:
    started = time.monotonic()
    try:
        func = import_string(fn.target)
    except ImportError as exc:
        # Not worth retrying on a backoff: a person must fix the registry or deploy the code.
        return Result(False, True, f"cannot import {fn.target}: {exc}", _ms(started))
    context = CompensationContext(
        idempotency_key=str(entry.id), entry_id=str(entry.id), effect_id=str(entry.effect_id),
        session_id=str(entry.session_id), org_id=str(fn.org_id), fn_name=entry.fn_name,
        fn_version=entry.fn_version, attempt=attempt, timeout_s=fn.timeout_ms / 1000)
    try:
        with deadline(fn.timeout_ms / 1000):
            func(dict(entry.args), context)
    except PermanentCompensationError as exc:
        return Result(False, True, f"PermanentCompensationError: {exc}", _ms(started))
    except CompensationTimeout:
        return Result(False, False, f"timed out after {fn.timeout_ms / 1000:g} s", _ms(started))
    except Exception as exc:
        return Result(False, False, f"{type(exc).__name__}: {exc}"[:2000], _ms(started))
    return Result(True, False, "", _ms(started))


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Interrupt the block after `seconds` with CompensationTimeout.

    SIGALRM works only in the main thread, which is where Celery's prefork pool runs tasks
    (billiard enforces its own time limits from the parent, so the alarm is ours). Elsewhere
    (a threaded pool, a thread in a benchmark) the block runs to completion.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def _expired(signum, frame):
        raise CompensationTimeout

    previous = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
