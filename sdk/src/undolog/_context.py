"""The session a tool call belongs to, carried by a contextvar.

A contextvar (not a global) so that concurrent asyncio tasks and threads each see
their own session, and tasks spawned inside a session (``asyncio.gather``) inherit it.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .session import Session

CURRENT: ContextVar[Session | None] = ContextVar("undolog_session", default=None)


def current_session() -> Session | None:
    """The session the calling code runs in, or None outside ``with client.session(...)``."""
    return CURRENT.get()
