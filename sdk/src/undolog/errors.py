"""Exceptions raised by the SDK, one per answer of the API contract.

Every exception carries the server's ``code``, ``message`` and HTTP ``status``
(0 when the error was raised on the client side). ``Refused`` marks the calls the
server did not let through: nothing ran, and a model should be told why with
``refusal_as_tool_result``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "AgentSuspended",
    "ApprovalExpired",
    "ApprovalRejected",
    "ApprovalWaitTimeout",
    "AuthenticationError",
    "BudgetExceededError",
    "EffectFailed",
    "EffectInFlight",
    "EffectUndone",
    "IdempotencyKeyReused",
    "InvalidRequest",
    "Refused",
    "RewindRefused",
    "SessionAwaitingApproval",
    "SessionNotRunning",
    "ToolNotRegistered",
    "UndoLogConnectionError",
    "UndoLogError",
    "UndoLogTimeout",
    "error_from_response",
    "refusal_as_tool_result",
]


class UndoLogError(Exception):
    """Base of every SDK error: ``code``, ``message``, ``status`` and the raw ``body``."""

    default_code = "error"

    def __init__(self, message: str = "", *, code: str | None = None, status: int = 0,
                 body: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.status = status
        self.body: dict[str, Any] = dict(body or {})

    def __str__(self) -> str:
        return self.message or self.code

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(code={self.code!r}, status={self.status}, "
                f"message={self.message!r})")


class UndoLogConnectionError(UndoLogError):
    """The server could not be reached or the connection broke; nothing is known."""

    default_code = "connection_error"


class UndoLogTimeout(UndoLogError):
    """A client-side wait (``wait_compensated``) ran out."""

    default_code = "timeout"


class AuthenticationError(UndoLogError):
    """401/403: the API key is missing, wrong or revoked."""

    default_code = "not_authenticated"


class InvalidRequest(UndoLogError):
    """400 ``invalid``; ``fields`` maps each bad field to what is wrong with it."""

    default_code = "invalid"

    @property
    def fields(self) -> dict[str, Any]:
        return dict(self.body.get("fields") or {})


class ToolNotRegistered(UndoLogError):
    """404 ``tool_not_registered``: call ``client.register(...)`` first."""

    default_code = "tool_not_registered"


class IdempotencyKeyReused(UndoLogError):
    """409: an idempotency key came back with different args."""

    default_code = "idempotency_key_reused"


class SessionAwaitingApproval(UndoLogError):
    """409: another call of this session is waiting for a reviewer."""

    default_code = "session_awaiting_approval"

    @property
    def approval(self) -> Any:
        return self.body.get("approval")


class EffectInFlight(UndoLogError):
    """A replayed effect is still ``executing``: another process is running it."""

    default_code = "effect_in_flight"


class EffectFailed(UndoLogError):
    """A replayed effect had failed; exactly-once means it is not run again."""

    default_code = "effect_failed"


class EffectUndone(UndoLogError):
    """A replayed effect has been (or is being) compensated."""

    default_code = "effect_undone"


class ApprovalWaitTimeout(UndoLogError):
    """The client's ``approval_timeout`` ran out; the request is still pending on the server."""

    default_code = "approval_wait_timeout"

    def __init__(self, message: str, *, effect_id: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.effect_id = effect_id


class Refused(UndoLogError):
    """The server did not let the call through. Nothing was executed."""

    default_code = "refused"


class BudgetExceededError(Refused):
    """429 refused by an autonomy budget. ``str(exc)`` is the message meant for the model."""

    default_code = "budget"

    @property
    def limit(self) -> str | None:
        return self.body.get("limit")

    @property
    def kind(self) -> str:
        return str(self.body.get("kind") or "budget")


class ApprovalRejected(Refused):
    """A reviewer said no (``reason``, ``reviewer``). The session is halted."""

    default_code = "rejected"

    def __init__(self, message: str = "", *, reason: str = "", reviewer: str | None = None,
                 **kw: Any) -> None:
        super().__init__(message or f"rejected by a reviewer: {reason or 'no reason given'}", **kw)
        self.reason = reason
        self.reviewer = reviewer


class ApprovalExpired(Refused):
    """Nobody decided before the deadline and the tool does not auto-approve."""

    default_code = "expired"


class AgentSuspended(Refused):
    """423 ``agent_suspended``: ``reason`` is ``budget`` or ``manual``."""

    default_code = "agent_suspended"

    @property
    def reason(self) -> str | None:
        return self.body.get("reason")


class SessionNotRunning(Refused):
    """409 ``session_not_running`` (completed, failed or halted); ``state`` says which."""

    default_code = "session_not_running"

    @property
    def state(self) -> Any:
        return self.body.get("state")


class RewindRefused(UndoLogError):
    """A rewind the server would not start: ``irreversible_in_the_way`` (``irreversible`` names
    the calls: rewind with ``leave_irreversible=True`` to leave them done), ``rewind_in_progress``,
    ``walk_stopped`` (a compensation waits for a person) or ``step_outside_run``."""

    default_code = "rewind_refused"

    @property
    def irreversible(self) -> list[dict[str, Any]]:
        return list(self.body.get("irreversible") or [])


_BY_CODE: dict[str, type[UndoLogError]] = {
    "irreversible_in_the_way": RewindRefused,
    "rewind_in_progress": RewindRefused,
    "walk_stopped": RewindRefused,
    "step_outside_run": RewindRefused,
    "tool_not_registered": ToolNotRegistered,
    "agent_suspended": AgentSuspended,
    "session_not_running": SessionNotRunning,
    # complete/fail of a session in the wrong state (e.g. resuming a completed run)
    "session_state_conflict": SessionNotRunning,
    "session_awaiting_approval": SessionAwaitingApproval,
    "idempotency_key_reused": IdempotencyKeyReused,
    "invalid": InvalidRequest,
}


def error_from_response(status: int, body: Any, text: str = "") -> UndoLogError:
    """Map one non-2xx answer to its exception (the API contract's answers table)."""
    if not isinstance(body, Mapping):
        return UndoLogError(text[:300] or f"HTTP {status}", code=f"http_{status}", status=status)
    message = str(body.get("message") or body.get("detail") or "")
    if body.get("decision") == "refused":
        return _refusal(status, body, message)
    code = str(body.get("error") or f"http_{status}")
    cls = _BY_CODE.get(code)
    if cls is None and status in (401, 403):
        cls = AuthenticationError
    return (cls or UndoLogError)(message or code, code=code, status=status, body=body)


def _refusal(status: int, body: Mapping[str, Any], message: str) -> UndoLogError:
    kind = str(body.get("kind") or "")
    if kind == "budget":
        return BudgetExceededError(message, code="budget", status=status, body=body)
    if kind == "approval":
        reason = str(body.get("reason") or message)
        return ApprovalRejected(message, reason=reason, reviewer=body.get("reviewer"),
                                code="rejected", status=status, body=body)
    return Refused(message or f"refused ({kind or 'policy'})", code=kind or "refused",
                   status=status, body=body)


_STOP = "Stop calling tools and give your final answer."


def refusal_as_tool_result(exc: BaseException) -> str:
    """The text a model should read as the result of a call the server refused.

    As in the reference guide: a budget refusal is the server's message (it ends with
    "Stop calling tools and give your final answer."), a rejection is
    ``"DENIED: <reason>"``.
    """
    if isinstance(exc, BudgetExceededError):
        return exc.message
    if isinstance(exc, ApprovalRejected):
        return f"DENIED: {exc.reason or 'rejected by a reviewer'}"
    if isinstance(exc, ApprovalExpired):
        return "DENIED: nobody approved this call before its deadline; it was not executed."
    if isinstance(exc, Refused) and exc.code == "rule":
        return exc.message  # "DENIED by rule '<name>': …", written for the model
    if isinstance(exc, AgentSuspended):
        return (f"Agent suspended ({exc.reason or 'manual'}); the tool call was not executed. "
                f"{_STOP}")
    if isinstance(exc, SessionNotRunning):
        return (f"This run is over ({exc.state or 'not running'}); the tool call was not "
                f"executed. {_STOP}")
    if isinstance(exc, UndoLogError):
        return f"ERROR: {exc.message or exc.code}"
    return f"ERROR: {exc}"
