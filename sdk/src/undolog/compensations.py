"""Agent-side compensations: run the undo of a rolled-back run where the credentials are.

A compensation function registered with handler ``"agent"`` is not run by the server's
worker. When the walk reaches its undo entry, the entry waits for this side to claim it
(``POST /api/v1/undo-entries/claim``), run it, and report how it went
(``POST /api/v1/undo-entries/{id}/report``). The server keeps the lease, the attempts, the
backoff and the escalation, exactly as for a webhook: a handler that raises is retried,
one that raises ``PermanentCompensationError`` goes to a person at once, and a claimer
that dies mid-attempt loses nothing (its lease runs out and the entry is claimed again).

A handler must treat "nothing to undo" as success: the same entry may be run again after
a lost lease (``context["idempotency_key"]`` is the entry id, the same on every attempt).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from ._http import Call, Http
from .errors import UndoLogError

__all__ = ["PermanentCompensationError", "claim", "report", "run_one", "serve"]


class PermanentCompensationError(Exception):
    """Raised by a handler that cannot succeed by trying again: a person takes over at once."""


def claim_call(limit: int, lease_s: int, scopes: Sequence[str] | None = None) -> Call:
    """``scopes``: the upstreams this side serves (then only their functions' entries); None: only
    entries of functions registered without a scope."""
    body: dict[str, Any] = {"max": limit, "lease_s": lease_s}
    if scopes is not None:
        body["scopes"] = list(scopes)
    return Call("POST", "/api/v1/undo-entries/claim", body)


def report_call(
    entry: Mapping[str, Any], ok: bool, error: str = "", permanent: bool = False
) -> Call:
    body: dict[str, Any] = {"ok": ok, "attempt": entry["attempt"]}
    if not ok:
        body.update(error=error[:10_000] or "failed", permanent=permanent)
    return Call("POST", f"/api/v1/undo-entries/{entry['id']}/report", body)


def claim(http: Http, limit: int = 10, lease_s: int = 30,
          scopes: Sequence[str] | None = None) -> list[dict[str, Any]]:
    return http.send(claim_call(limit, lease_s, scopes)).get("entries", [])


def report(
    http: Http, entry: Mapping[str, Any], ok: bool, error: str = "", permanent: bool = False
) -> dict[str, Any]:
    return http.send(report_call(entry, ok, error, permanent))


def outcome(exc: BaseException | None) -> tuple[bool, str, bool]:
    """(ok, error, permanent) of a handler that raised ``exc`` (None: it returned)."""
    if exc is None:
        return True, "", False
    return False, f"{type(exc).__name__}: {exc}"[:2000], isinstance(exc, PermanentCompensationError)


def context_of(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "idempotency_key": entry["id"],
        "attempt": entry["attempt"],
        "fn_name": entry["fn_name"],
        "fn_version": entry["fn_version"],
        "session": entry.get("session"),
        "effect": entry.get("effect"),
        "lease_expires_at": entry["lease_expires_at"],
        # A pre-image tool's entry: what was there before the call, the call's args and the
        # digests of the compare-and-restore (preimages.py). Absent for other entries.
        "pre_image": entry.get("pre_image"),
    }


def run_one(
    http: Http, entry: Mapping[str, Any], handlers: Mapping[str, Callable[..., Any]]
) -> bool:
    """Run one claimed entry and report it; True when it succeeded."""
    handler = handlers.get(entry["fn_name"])
    if handler is None:
        error = PermanentCompensationError(f"no handler for {entry['fn_name']} in this process")
        ok, text, permanent = outcome(error)
    else:
        try:
            handler(dict(entry["args"]), context_of(entry))
            ok, text, permanent = outcome(None)
        except Exception as exc:  # reported, retried by the server's rules
            ok, text, permanent = outcome(exc)
    try:
        report(http, entry, ok, text, permanent)
    except UndoLogError:
        return False  # our lease ran out and another claimer took over: its report counts
    return ok


def serve(
    http: Http,
    handlers: Mapping[str, Callable[..., Any]],
    *,
    stop: threading.Event | None = None,
    poll_s: float = 1.0,
    lease_s: int = 30,
    batch: int = 10,
    once: bool = False,
    scopes: Sequence[str] | None = None,
) -> int:
    """Claim and run entries until ``stop`` is set (or one round, with ``once``); how many ran.

    Only entries of functions named in ``handlers`` should be registered with this agent:
    an entry this process cannot run is reported as a permanent failure, so a person sees it.
    ``scopes``: the scopes its functions were registered with (none: unscoped ones only).
    """
    stop = stop or threading.Event()
    ran = 0
    while not stop.is_set():
        try:
            entries = claim(http, batch, lease_s, scopes)
        except UndoLogError:
            entries = []  # the server is away for a moment; the lease rules keep everything safe
        for entry in entries:
            run_one(http, entry, handlers)
            ran += 1
        if once:
            return ran
        if not entries:
            stop.wait(poll_s)
    return ran


async def aclaim(http: Http, limit: int = 10, lease_s: int = 30,
                 scopes: Sequence[str] | None = None) -> list[dict[str, Any]]:
    return (await http.asend(claim_call(limit, lease_s, scopes))).get("entries", [])


async def areport(
    http: Http, entry: Mapping[str, Any], ok: bool, error: str = "", permanent: bool = False
) -> dict[str, Any]:
    return await http.asend(report_call(entry, ok, error, permanent))


async def arun_one(
    http: Http, entry: Mapping[str, Any], handler: Callable[[dict[str, Any]], Awaitable[Any]] | None
) -> bool:
    """The async twin of ``run_one`` for one handler (the gateway's: an upstream tool call)."""
    if handler is None:
        ok, text, permanent = outcome(
            PermanentCompensationError(f"no handler for {entry['fn_name']} in this process")
        )
    else:
        try:
            await handler(dict(entry["args"]))
            ok, text, permanent = outcome(None)
        except Exception as exc:
            ok, text, permanent = outcome(exc)
    try:
        await areport(http, entry, ok, text, permanent)
    except UndoLogError:
        return False
    return ok
