"""Response shapes of the ops API (core.schema.shape)."""

from __future__ import annotations

from typing import TypedDict


class RetentionDict(TypedDict):
    """Days each kind of row is kept (ops/README.md: what goes when, and what never goes)."""

    safe_call_days: int
    transition_days: int
    event_days: int
    session_days: int


class RetentionBodyDict(TypedDict):
    retention: RetentionDict
