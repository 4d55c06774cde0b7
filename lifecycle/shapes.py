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


# What a rewind to a step does (`rewind.Plan.as_dict`): written once for the preview and the rewind
# started, which say it alike. The two are made from it with TypedDict's call form, as neither can
# inherit it: the preview's fields are all optional (without a step asked for it says something
# else), the rewind's all required, and the rewind's `session` is the run itself, not its id.
_PLAN: dict[str, Any] = {
    "session": str,
    "to_step": int,
    "savepoint": str | None,
    "from_step": int,
    "resumes_at": int,
    "to_undo": list[RewoundEffectDict],
    "left_done": list[RewoundEffectDict],
    "withdrawn": list[RewoundEffectDict],
    "counts": dict[str, int],
}

RewindPreviewDict = TypedDict("RewindPreviewDict", {
    "in_progress": dict[str, Any] | None,
    "rewinds": list[dict[str, Any]],
    **_PLAN,
    "irreversible_in_the_way": list[RewoundEffectDict],
}, total=False)
RewindPreviewDict.__doc__ = (
    "What a rewind to `to_step` undoes (newest first), leaves done, withdraws; the step it resumes at.\n"
    "Without a step asked for: the rewind `in_progress` (or null) and the run's `rewinds`.")

RewindDict = TypedDict("RewindDict", {**_PLAN, "session": Any, "rewind": dict[str, Any]})
RewindDict.__doc__ = """A rewind started: the plan, its record, and the run (`compensating` until the walk is done)."""


class SavepointDict(TypedDict):
    name: str
    step_index: int
    created: str


class SavepointListDict(TypedDict):
    savepoints: list[SavepointDict]
