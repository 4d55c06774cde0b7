"""undolog for the OpenAI Agents SDK: ``pip install "undolog[openai-agents]"``.

``wrap_function_tool(tool, tier, ...)`` / ``wrap_function_tools(tools, tiers)`` give
existing ``FunctionTool`` s (``@function_tool`` functions) an undolog tier; the copies keep
the name, description, JSON schema and failure policy, and carry ``undolog_spec`` so
``client.register(*tools)`` works. Run the agent inside an undolog session::

    async with client.session(agent="cleanup"):
        result = await Runner.run(agent, "Clean up the inactive accounts")

- A refused call (budget, rejection, expiry, a suspended agent) returns
  ``refusal_as_tool_result``'s text as the tool's output: the model reads why.
- An IRREVERSIBLE call waiting for a reviewer is awaited the SDK's way: the tool's
  coroutine awaits the decision (async long polls; the event loop stays free), then the
  run goes on. Bound the wait with ``client.session(..., approval_timeout=...)``.
- A tool that raises reports its effect failed; then the tool's ``failure_error_function``
  decides as usual: by default the model reads the error, with
  ``failure_error_function=None`` the exception ends the run, which fails the session
  and rolls it back.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from agents import FunctionTool
from agents.tool import with_function_tool_failure_error_handler

from ..errors import Refused, refusal_as_tool_result
from ..tiers import ToolSpec, ToolTier
from . import _core
from ._core import Declaration

__all__ = ["specs", "wrap_function_tool", "wrap_function_tools"]


def wrap_function_tool(tool: FunctionTool, tier: ToolTier | str | None = None, *,
                       declaration: Mapping[str, Any] | None = None,
                       **options: Any) -> FunctionTool:
    """A copy of ``tool`` with an undolog tier. ``options`` are ``@undolog_tool``'s
    (``compensation``, ``reason``, ``cost_weight``...), or pass them all as
    ``declaration``. Mistakes raise ``ValueError`` here, as with ``@undolog_tool``."""
    if not isinstance(tool, FunctionTool):
        raise TypeError(f"not a FunctionTool (decorate it with @function_tool): {tool!r}")
    if getattr(tool, "undolog_spec", None) is not None:
        raise ValueError(f"{tool.name} is already wrapped")
    if declaration is None and tier is None:
        raise ValueError(f"{tool.name}: give a tier (or a declaration)")
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
        try:
            return await _core.acall(declared, args, lambda: inner(ctx, input_json))
        except Refused as exc:
            return refusal_as_tool_result(exc)

    wrapped = dataclasses.replace(
        tool, on_invoke_tool=with_function_tool_failure_error_handler(invoke, _handled))
    wrapped.undolog_spec = declared.spec  # type: ignore[attr-defined]
    return wrapped


def _handled(tool: FunctionTool, error: Exception, input_json: str) -> None:
    """The tool's failure policy turned the error into the model's tool output; the
    effect was already reported failed."""


def wrap_function_tools(tools: Iterable[FunctionTool], tiers: Mapping[str, Declaration], *,
                        default: Declaration | None = None) -> list[FunctionTool]:
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
        wrapped.append(wrap_function_tool(tool, declaration=_core.options_for(declaration)))
    unknown = sorted(set(tiers) - known)
    if unknown:
        raise ValueError(f"tiers names tools that are not given: {unknown}")
    return wrapped


def specs(tools: Iterable[FunctionTool]) -> list[ToolSpec]:
    """The ``ToolSpec`` of wrapped tools (``client.register(*tools)`` works as well)."""
    return [tool.undolog_spec for tool in tools]  # type: ignore[attr-defined]
