"""The rows an admitted call writes, as values: its effect and a compensable call's undo entry (the
pipeline makes model instances of them, the fast paths rows of the same values), and the agent
context its approval request shows."""

from __future__ import annotations

from typing import Any

from effects.models import (
    Effect,
    SafeCall,
    Session,
    Tier,
    Tool,
    UndoEntry,
    canonical_json,
    needs_result,
    render_template,
)
from lifecycle.intercept.call import Call


def new_effect(org_id: Any, session_id: Any, tool: Tool, call: Call, signature: str) -> Effect:
    """The effect row of an admitted call, not yet saved."""
    values = effect_values(org_id, session_id, tool, call, signature)
    del values["tool_id"]
    return Effect(tool=tool, **values)


def effect_values(org_id: Any, session_id: Any, tool: Tool, call: Call, signature: str) -> dict[str, Any]:
    """What an admitted call's effect row holds beyond its defaults, by attribute name: the pipeline
    makes an `Effect` of them, the fast path its row (no model instance: they cost it ~0.1 ms)."""
    initial = Effect.State.EXECUTING if tool.tier == Tier.COMPENSABLE else Effect.State.PENDING
    return {
        "org_id": org_id, "session_id": session_id, "tool_id": tool.pk, "tool_name": tool.name, "tier": tool.tier,
        "step_index": call.step_index, "call_signature": signature, "idempotency_key": call.idempotency_key,
        "args": call.args, "args_digest": call.args_digest, "reasoning": call.reasoning,
        "state": initial,
        "undo_needs_result": tool.tier == Tier.COMPENSABLE and needs_result(tool.compensation_args, call.args),
    }


def new_undo_entry(tool: Tool, effect: Effect) -> UndoEntry:
    """The undo entry pushed before a compensable effect runs, not yet saved."""
    values = undo_entry_values(tool, effect.__dict__)
    del values["fn_id"]
    return UndoEntry(effect=effect, fn=tool.compensation_fn, **values)


def undo_entry_values(tool: Tool, effect: dict[str, Any]) -> dict[str, Any]:
    """The undo entry's values (by attribute name) for the effect's values."""
    fn = tool.compensation_fn
    # A template that reads the result is kept on the entry and rendered when the effect commits.
    template = tool.compensation_args if effect["undo_needs_result"] else None
    return {
        "session_id": effect["session_id"], "step_index": effect["step_index"], "fn_id": fn.pk,
        "fn_name": fn.fn_name, "fn_version": fn.fn_version, "args": render_template(tool.compensation_args,
                                                                                 effect["args"]),
        "args_template": template, "max_retries": tool.max_retries, "retry_backoff_ms": tool.retry_backoff_ms,
    }


def agent_context(session: Session, call: Call, effect: Effect) -> dict[str, Any]:
    """The session's last N calls (SAFE ones included) and its reasoning trace."""
    window = session.org.context_window
    effects = list(Effect.objects.for_session(session).exclude(pk=effect.pk).order_by("-step_index")[:window])
    safe = list(SafeCall.objects.filter(session=session).order_by("-step_index")[:window])
    return context_of(window, effects, safe, call)


def context_of(window: int, effects: list[Any], safe: list[Any], call: Call) -> dict[str, Any]:
    """`agent_context` of the run's last `window` effects and SAFE calls (each newest first, read by
    the caller: the pipeline with two queries, the fast approval path inside its one read)."""
    calls = [{"step_index": e.step_index, "tool": e.tool_name, "tier": e.tier, "args": e.args,
              "state": e.state, "result": summarise(e.result), "error": e.error or None} for e in effects]
    calls += [{"step_index": s.step_index, "tool": s.tool_name, "tier": Tier.SAFE, "args": s.args,
               "state": "reported", "result": None, "error": None} for s in safe]
    calls = sorted(calls, key=lambda c: c["step_index"])[-window:] if window else []
    trace = [{"step_index": e.step_index, "text": e.reasoning} for e in sorted(effects, key=lambda e: e.step_index)
             if e.reasoning]
    if call.reasoning:
        trace.append({"step_index": call.step_index, "text": call.reasoning})
    return {"calls": calls, "reasoning": trace}


def summarise(result: Any, limit: int = 300) -> str | None:
    if result is None:
        return None
    text = result if isinstance(result, str) else canonical_json(result)
    return text if len(text) <= limit else text[: limit - 1] + "…"
