"""undolog: make AI agents safe to let loose.

Declare each tool's tier with ``@undolog_tool``, open a session with
``UndoLogClient().session(agent=...)``, and call your tools as usual inside it.
"""

from __future__ import annotations

from ._context import current_session
from ._version import __version__
from .client import UndoLogClient, tool_specs
from .decorator import spec_of, undolog_tool
from .errors import (
    AgentSuspended,
    ApprovalExpired,
    ApprovalRejected,
    ApprovalWaitTimeout,
    AuthenticationError,
    BudgetExceededError,
    EffectFailed,
    EffectInFlight,
    EffectUndone,
    IdempotencyKeyReused,
    InvalidRequest,
    Refused,
    RewindRefused,
    SessionAwaitingApproval,
    SessionNotRunning,
    ToolNotRegistered,
    UndoLogConnectionError,
    UndoLogError,
    UndoLogTimeout,
    refusal_as_tool_result,
)
from .session import Session, WaitInfo
from .tiers import ApprovalSpec, CompensationDescriptor, ToolSpec, ToolTier

__all__ = [
    "AgentSuspended",
    "ApprovalExpired",
    "ApprovalRejected",
    "ApprovalSpec",
    "ApprovalWaitTimeout",
    "AuthenticationError",
    "BudgetExceededError",
    "CompensationDescriptor",
    "EffectFailed",
    "EffectInFlight",
    "EffectUndone",
    "IdempotencyKeyReused",
    "InvalidRequest",
    "Refused",
    "RewindRefused",
    "Session",
    "SessionAwaitingApproval",
    "SessionNotRunning",
    "ToolNotRegistered",
    "ToolSpec",
    "ToolTier",
    "UndoLogClient",
    "UndoLogConnectionError",
    "UndoLogError",
    "UndoLogTimeout",
    "WaitInfo",
    "__version__",
    "current_session",
    "refusal_as_tool_result",
    "spec_of",
    "tool_specs",
    "undolog_tool",
]
