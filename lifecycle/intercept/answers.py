"""The answers of the intercept: each outcome's status and body, the same whichever path decided
it (the pipeline from model instances, the fast paths from what reads like them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from approvals.models import ApprovalRequest
from budgets.models import Refusal
from effects.models import Effect, Tool, UndoEntry


@dataclass
class Answer:
    status: int
    body: dict[str, Any]


def awaiting(effect: Effect, tool: Tool, approval: ApprovalRequest) -> Answer:
    """The 202 of a call held for people or decided at once by a rule."""
    effect_body = {**effect.as_dict(), "executor": bool(tool.executor_url)}  # the worker runs it, not the caller
    if approval.decision:
        effect_body.update(decision=approval.decision, reason=approval.decision_reason or None)
    return Answer(202, {"decision": "await_approval", "effect": effect_body,
                        "approval": {**approval.summary(), "decided_by": approval.decided_by_label or None,
                                     "approvals_required": approval.approvals_required}})


def refused_by_rule(effect: Effect, refusal: Refusal) -> dict[str, Any]:
    """The answer to a call a rule denied, the first time and on every replay."""
    rule = refusal.decided_by.removeprefix("rule:")
    return {"decision": "refused", "kind": "rule", "rule": rule, "message": refusal.message,
            "refusal": str(refusal.id), "effect": {**effect.as_dict(), "decision": "rejected",
                                                   "reason": refusal.reason}}


def executed(effect: Any, entry: Any) -> Answer:
    """The 201 of a compensable call that runs at once, its undo entry pushed (of the model
    instances, or of what reads like them: the compensable fast path's rows)."""
    return Answer(201, {"decision": "execute", "effect": Effect.as_dict(effect),
                        "undo_entry": UndoEntry.as_dict(entry)})


def granted(effect: Effect, approval: ApprovalRequest) -> Answer:
    """The 201 of a call a live grant decided at once (the session keeps running)."""
    view, fields = approval.summary(), approval.caller_fields()
    view.update(decided_by=approval.decided_by_label, decision=approval.decision,
                reason=approval.decision_reason, decided_args_digest=approval.decided_args_digest)
    return Answer(201, {"decision": "approved", "effect": {**effect.as_dict(), **fields}, "approval": view})
