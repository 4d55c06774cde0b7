"""Response shapes of the runs' endpoints that join apps (core/schema.py says how they are used).

The rest of a run's shapes are the records' own: effects/shapes.py, budgets/shapes.py.
"""

from __future__ import annotations

from typing import Any, TypedDict

from budgets.shapes import SessionBudgetDict
from effects.shapes import EffectDict, SessionDict, UndoEntryDict


class SessionDetailDict(SessionDict):
    """A run with its effects, its undo stack (LIFO) and its budget."""

    effects: list[EffectDict]
    undo_stack: list[UndoEntryDict]
    budget: SessionBudgetDict
    savepoints: list[SavepointDict]
    rewinds: list[dict[str, Any]]


class RewoundEffectDict(TypedDict):
    """An effect after the step: undone by the rewind, left done, or withdrawn."""

    effect: str
    step_index: int
    tool: str
    tier: str
    state: str
    at: str


class RewindPreviewDict(TypedDict, total=False):
    """What a rewind to `to_step` undoes (newest first), leaves done, withdraws; the step it resumes at.
    Without a step asked for: the rewind `in_progress` (or null) and the run's `rewinds`."""

    in_progress: dict[str, Any] | None
    rewinds: list[dict[str, Any]]

    session: str
    to_step: int
    savepoint: str | None
    from_step: int
    resumes_at: int
    to_undo: list[RewoundEffectDict]
    left_done: list[RewoundEffectDict]
    withdrawn: list[RewoundEffectDict]
    counts: dict[str, int]
    irreversible_in_the_way: list[RewoundEffectDict]


class RewindDict(TypedDict):
    """A rewind started: the plan, its record, and the run (`compensating` until the walk is done)."""

    session: Any
    to_step: int
    savepoint: str | None
    from_step: int
    resumes_at: int
    to_undo: list[RewoundEffectDict]
    left_done: list[RewoundEffectDict]
    withdrawn: list[RewoundEffectDict]
    counts: dict[str, int]
    rewind: dict[str, Any]


class SavepointDict(TypedDict):
    name: str
    step_index: int
    created: str


class SavepointListDict(TypedDict):
    savepoints: list[SavepointDict]
