"""undolog for the OpenAI Agents SDK: ``pip install "undolog[openai-agents]"``.

``wrap_function_tool(tool, tier, ...)`` / ``wrap_function_tools(tools, tiers)`` give
existing ``FunctionTool`` s (``@function_tool`` functions) an undolog tier; the copies keep
the name, description, JSON schema and failure policy, and carry ``undolog_spec`` so
``client.register(*tools)`` works. Run the agent inside an undolog session::

    async with client.session(agent="cleanup"):
        result = await Runner.run(agent, "Clean up the inactive accounts")

- A refused call (budget, rejection, expiry, a suspended agent) returns
  ``refusal_as_tool_result``'s text as the tool's output: the model reads why.
- An IRREVERSIBLE call waiting for a reviewer is awaited the SDK's way, one of two:
  ``hold="await"`` (the default): the tool's coroutine awaits the decision (async long
  polls; the event loop stays free), then the run goes on; bound the wait with
  ``client.session(..., approval_timeout=...)``. ``hold="interrupt"``: the SDK's own
  human-in-the-loop. The tool ``needs_approval`` while undolog holds the call, so the run
  stops with ``result.interruptions``; ``await decisions(result)`` waits for the undolog
  reviewer and gives the ``RunState`` (approved or rejected with the reviewer's reason as
  the model's message) to pass to ``Runner.run(agent, state)``, in the same session.
- A call a reviewer edited before approving runs with the edited args (the tool gets them
  as its JSON); its output starts with ``_core.edited_note``'s text, so the model knows.
- A tool that raises reports its effect failed; then the tool's ``failure_error_function``
  decides as usual: by default the model reads the error, with
  ``failure_error_function=None`` the exception ends the run, which fails the session
  and rolls it back.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from agents import (
    FunctionTool,
    RunResult,
    RunState,
    ToolOutputFileContent,
    ToolOutputImage,
    ToolOutputText,
)
from agents.tool import with_function_tool_failure_error_handler

from .._context import CURRENT
from ..decorator import DeclaredTool
from ..errors import (
    ApprovalExpired,
    ApprovalRejected,
    Refused,
    SessionAwaitingApproval,
    refusal_as_tool_result,
)
from ..session import _decision
from ..tiers import ToolSpec, ToolTier
from . import _core
from ._core import Declaration

__all__ = ["decisions", "specs", "wrap_function_tool", "wrap_function_tools"]

_HOLD_MODES = ("await", "interrupt")

# hold="interrupt": what the server answered for a call, by the model's call_id, between
# needs_approval (which intercepts it) and the tool's invocation or decisions().
_HELD: dict[str, dict[str, Any]] = {}
_REFUSED: dict[str, Refused] = {}

_STRUCTURED = (ToolOutputText, ToolOutputImage, ToolOutputFileContent)


def wrap_function_tool(tool: FunctionTool, tier: ToolTier | str | None = None, *,
                       declaration: Mapping[str, Any] | None = None, hold: str = "await",
                       **options: Any) -> FunctionTool:
    """A copy of ``tool`` with an undolog tier. ``options`` are ``@undolog_tool``'s
    (``compensation``, ``reason``, ``cost_weight``, ``labels``, ``untrusted_fields``...), or
    pass them all as ``declaration``. A SAFE tool labelled ``untrusted`` reports its output.
    Mistakes raise ``ValueError`` here, as with ``@undolog_tool``."""
    if not isinstance(tool, FunctionTool):
        raise TypeError(f"not a FunctionTool (decorate it with @function_tool): {tool!r}")
    if getattr(tool, "undolog_spec", None) is not None:
        raise ValueError(f"{tool.name} is already wrapped")
    if declaration is None and tier is None:
        raise ValueError(f"{tool.name}: give a tier (or a declaration)")
    if hold not in _HOLD_MODES:
        raise ValueError(f"hold must be one of {_HOLD_MODES}")
    parameters = list((tool.params_json_schema or {}).get("properties", {}))
    declared = _core.declare(tool.name, parameters, tool.description,
                             _core.options_for(declaration if declaration is not None else tier,
                                               **options))
    # The raw invoker, before the SDK turns exceptions into text: undolog must see a
    # failure as a failure (and report the effect failed). The copy re-applies the
    # tool's own failure policy around ours.
    inner = getattr(tool.on_invoke_tool, "_invoke_tool_impl", tool.on_invoke_tool)

    async def invoke(ctx: Any, input_json: str) -> Any:
        args = json.loads(input_json) if input_json else {}
        call_id = getattr(ctx, "tool_call_id", None)
        _HELD.pop(call_id, None)
        refused = _REFUSED.pop(call_id, None)  # already refused in needs_approval
        try:
            if refused is not None:
                raise refused
            outcome = await _core.acall(
                declared, args,
                lambda use: inner(ctx, input_json) if use == args else _run_edited(inner, ctx, use))
        except Refused as exc:
            return refusal_as_tool_result(exc)
        return _noted(tool, outcome)

    changes: dict[str, Any] = {
        "on_invoke_tool": with_function_tool_failure_error_handler(invoke, _handled)}
    if hold == "interrupt" and declared.spec.tier is ToolTier.IRREVERSIBLE:
        changes["needs_approval"] = _needs_approval(declared)
    wrapped = dataclasses.replace(tool, **changes)
    wrapped.undolog_spec = declared.spec  # type: ignore[attr-defined]
    return wrapped


def _run_edited(inner: Any, ctx: Any, edited: dict[str, Any]) -> Any:
    """Run the tool with a reviewer's edited args, in a copy of its context that names them:
    a tool reading ``ctx.tool_arguments`` (or ``ctx.tool_call``) would otherwise see the
    model's proposal, not what it is running."""
    edited_json = json.dumps(edited)
    edited_ctx = copy.copy(ctx)
    if hasattr(edited_ctx, "tool_arguments"):
        edited_ctx.tool_arguments = edited_json
    call = getattr(edited_ctx, "tool_call", None)
    if call is not None and hasattr(call, "model_copy"):
        edited_ctx.tool_call = call.model_copy(update={"arguments": edited_json})
    return inner(edited_ctx, edited_json)


def _noted(tool: FunctionTool, outcome: _core.Outcome) -> Any:
    """The tool's output for the model, led by the note that a reviewer's edited args ran.

    A tool with a declared output schema keeps its output as is: the SDK validates it
    against that schema, which a note would break.
    """
    output, edited = outcome
    if edited is None or tool.output_json_schema is not None:
        return output
    note = _core.edited_note(edited)
    if isinstance(output, str):
        return f"{note}\n{output}"
    items = list(output) if isinstance(output, (list, tuple)) else [output]
    if items and all(isinstance(i, _STRUCTURED) or (isinstance(i, dict) and "type" in i)
                     for i in items):
        return [ToolOutputText(text=note), *items]  # text, images, files: the note comes first
    return f"{note}\n{output}"


def _needs_approval(declared: DeclaredTool) -> Any:
    async def needs_approval(ctx: Any, params: dict[str, Any], call_id: str) -> bool:
        """Intercept the call now: the run stops (the SDK's interruption) while undolog
        holds it for a reviewer. The tool's invocation intercepts again and replays."""
        session = CURRENT.get()
        if session is None:
            return False
        try:
            answer = await session._adrive(session._intercept(declared, dict(params)))
        except Refused as exc:
            _REFUSED[call_id] = exc
            return False
        except SessionAwaitingApproval:
            # Another call of this turn already waits for a reviewer: this one is asked
            # for when it runs, after that decision (it then waits in place).
            _HELD[call_id] = {"deferred": True}
            return True
        effect = answer.get("effect") or {}
        if effect.get("state") != "pending":
            return False
        _HELD[call_id] = {"effect": effect, "approval": answer.get("approval") or {}}
        return True

    return needs_approval


async def decisions(result: RunResult, *, timeout: float | None = None) -> RunState:
    """Wait for the undolog reviewer of each call the run stopped on (``hold="interrupt"``)
    and record the decisions in the run's state: ``Runner.run(agent, state)`` goes on.

    Call it inside the session the run belongs to. A rejection (or an expiry) reaches the
    model as ``refusal_as_tool_result``'s text ("DENIED: <reason>"); interruptions that are
    not undolog's are left for you to decide.
    """
    session = CURRENT.get()
    if session is None:
        raise RuntimeError("decisions() runs inside the run's undolog session")
    state = result.to_state()
    for item in result.interruptions:
        held = _HELD.pop(item.call_id, None) if item.call_id else None
        if held is None:
            continue
        if held.get("deferred"):
            state.approve(item)  # undolog still gates the call when it runs
            continue
        effect_id = str(held["effect"].get("id"))
        effect = await _core.await_decision(session, effect_id, timeout)
        if effect.get("state") == "rejected":
            reason, reviewer = _decision({}, effect)
            refusal = ApprovalRejected(reason=reason, reviewer=reviewer, body={"effect": effect})
            session.state = "halted"
            state.reject(item, rejection_message=refusal_as_tool_result(refusal))
        elif effect.get("state") == "expired":
            session.state = "halted"
            state.reject(item, rejection_message=refusal_as_tool_result(ApprovalExpired()))
        else:  # approved (or already run by a server-side executor): the invocation replays
            state.approve(item)
    return state


def _handled(tool: FunctionTool, error: Exception, input_json: str) -> None:
    """The tool's failure policy turned the error into the model's tool output; the
    effect was already reported failed."""


def wrap_function_tools(tools: Iterable[FunctionTool], tiers: Mapping[str, Declaration], *,
                        default: Declaration | None = None,
                        hold: str = "await") -> list[FunctionTool]:
    """Wrap each tool with the declaration ``tiers`` gives for its name; a tool left out
    takes ``default``, and without one it is an error (no tool reaches the world
    undeclared)."""
    wrapped = []
    known = set()
    for tool in tools:
        known.add(tool.name)
        declaration = tiers.get(tool.name, default)
        if declaration is None:
            raise ValueError(f"no tier for tool {tool.name!r}: add it to tiers or pass default=")
        wrapped.append(wrap_function_tool(tool, declaration=_core.options_for(declaration),
                                          hold=hold))
    unknown = sorted(set(tiers) - known)
    if unknown:
        raise ValueError(f"tiers names tools that are not given: {unknown}")
    return wrapped


def specs(tools: Iterable[FunctionTool]) -> list[ToolSpec]:
    """The ``ToolSpec`` of wrapped tools (``client.register(*tools)`` works as well)."""
    return [tool.undolog_spec for tool in tools]  # type: ignore[attr-defined]
