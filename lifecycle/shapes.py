"""Response shapes of the runs' endpoints that join apps (core/schema.py says how they are used).

The rest of a run's shapes are the records' own: effects/shapes.py, budgets/shapes.py.
"""

from __future__ import annotations

from budgets.shapes import SessionBudgetDict
from effects.shapes import EffectDict, SessionDict, UndoEntryDict


class SessionDetailDict(SessionDict):
    """A run with its effects, its undo stack (LIFO) and its budget."""

    effects: list[EffectDict]
    undo_stack: list[UndoEntryDict]
    budget: SessionBudgetDict
