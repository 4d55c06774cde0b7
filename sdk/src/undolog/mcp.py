"""MCP tools to undolog tiers.

MCP describes tools with four hints, each with a default that assumes the worst:
``readOnlyHint`` (false), ``destructiveHint`` (true), ``idempotentHint`` (false),
``openWorldHint`` (true). The rules here:

1. A name in ``also`` is IRREVERSIBLE, whatever its hints (an email is additive
   but can't be recalled: the guide's ``also=("email_owner",)``).
2. A read-only tool is SAFE only if its server is trusted. MCP says clients must
   treat annotations from untrusted servers as untrusted, so an untrusted
   ``readOnlyHint`` counts for nothing and the tool falls through to rule 3.
3. Anything else may change the world: destructive or additive, closed or open
   world, undolog can only undo it with a compensation. With one it is
   COMPENSABLE, without one IRREVERSIBLE (a human approves each call).

The ``mcp`` package is only needed to talk to a server (``list_mcp_tools``,
``undolog mcp-import``); classification works on any object with ``.annotations``
or on plain dicts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .tiers import (
    HINTS,
    ApprovalSpec,
    CompensationDescriptor,
    ToolSpec,
    ToolTier,
    annotations_dict,
)

__all__ = ["Classification", "classify", "effective_hints", "list_mcp_tools", "spec_for",
           "tier_for"]

# MCP's defaults for a tool that says nothing about itself.
MCP_DEFAULTS = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False,
                "openWorldHint": True}


@dataclass(frozen=True)
class Classification:
    tier: ToolTier
    why: str
    hints: dict[str, bool]


def tool_name(tool: Any) -> str:
    return str(tool.get("name") if isinstance(tool, Mapping) else getattr(tool, "name", ""))


def tool_description(tool: Any) -> str:
    if isinstance(tool, Mapping):
        return str(tool.get("description") or "").strip()
    text = getattr(tool, "description", "")
    return str(text or "").strip()


def declared_hints(tool: Any) -> dict[str, Any]:
    """The hints the tool declares (camelCase keys), without defaults."""
    if isinstance(tool, Mapping):
        if "annotations" in tool:
            return annotations_dict(tool["annotations"])
        return annotations_dict(tool)  # the annotations dict itself
    annotations = getattr(tool, "annotations", None)
    if annotations is None and any(hasattr(tool, s) for s in HINTS.values()):
        annotations = tool  # a ToolAnnotations object itself
    return annotations_dict(annotations)


def effective_hints(tool: Any) -> dict[str, bool]:
    """Declared hints over MCP's defaults: no annotations = destructive, open world."""
    declared = declared_hints(tool)
    return {name: bool(declared.get(name, default)) for name, default in MCP_DEFAULTS.items()}


def classify(tool: Any, trusted: bool = False, also: Iterable[str] = (),
             compensation: CompensationDescriptor | None = None) -> Classification:
    """The tier of an MCP tool and why (the module docstring's three rules)."""
    hints = effective_hints(tool)
    if tool_name(tool) in set(also):
        return Classification(ToolTier.IRREVERSIBLE, "listed in also=", hints)
    if hints["readOnlyHint"] and trusted:
        return Classification(ToolTier.SAFE, "read-only, trusted server", hints)
    why = _change_kind(hints)
    if hints["readOnlyHint"]:
        why = "claims read-only, untrusted server"
    if compensation is not None:
        return Classification(ToolTier.COMPENSABLE, f"{why}, compensation supplied", hints)
    return Classification(ToolTier.IRREVERSIBLE, why, hints)


def tier_for(tool: Any, trusted: bool = False, also: Iterable[str] = (),
             compensation: CompensationDescriptor | None = None) -> ToolTier:
    """``classify(...).tier``."""
    return classify(tool, trusted, also, compensation).tier


def _change_kind(hints: Mapping[str, bool]) -> str:
    if hints["destructiveHint"]:
        return "destructive"
    return "additive, open world" if hints["openWorldHint"] else "additive, closed world"


def spec_for(tool: Any, trusted: bool = False, also: Iterable[str] = (),
             compensation: CompensationDescriptor | None = None, cost_weight: float = 1.0,
             safe_cost_weight: float = 1.0) -> tuple[ToolSpec, Classification]:
    """The ToolSpec to register for an MCP tool; the reason is its description."""
    found = classify(tool, trusted, also, compensation)
    name = tool_name(tool)
    approval = None
    if found.tier is ToolTier.IRREVERSIBLE:
        approval = ApprovalSpec(reason=_reason(tool), risk_tags=_risk_tags(found, trusted))
    spec = ToolSpec(
        name=name,
        tier=found.tier,
        cost_weight=safe_cost_weight if found.tier is ToolTier.SAFE else cost_weight,
        description=tool_description(tool),
        compensation=compensation if found.tier is ToolTier.COMPENSABLE else None,
        approval=approval,
        annotations=declared_hints(tool),
        labels=suggested_labels(found, trusted),
    )
    return spec, found


def suggested_labels(found: Classification, trusted: bool) -> tuple[str, ...]:
    """Labels for run-aware rules: an open-world tool reaches outside (`external`); a read of a
    server you do not trust returns text others wrote (`untrusted`, so its output is reported)."""
    labels = []
    if found.hints["openWorldHint"]:
        labels.append("external")
    if found.hints["readOnlyHint"] and not trusted:
        labels.append("untrusted")
    return tuple(labels)


def _reason(tool: Any) -> str:
    first = tool_description(tool).split("\n", 1)[0].strip()
    return first or f"MCP tool {tool_name(tool)} may change the world (no description given)"


def _risk_tags(found: Classification, trusted: bool) -> tuple[str, ...]:
    tags = ["mcp"]
    if found.hints["destructiveHint"] and not found.hints["readOnlyHint"]:
        tags.append("destructive")
    if found.hints["openWorldHint"]:
        tags.append("open-world")
    if not trusted:
        tags.append("untrusted-hints")
    return tuple(tags)


def server_environment() -> dict[str, str]:
    """The environment for a spawned MCP server: ours, minus undolog's credentials,
    which an untrusted server has no business reading."""
    return {k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_")}


async def list_mcp_tools(command: Sequence[str], env: Mapping[str, str] | None = None) -> list[Any]:
    """Start an MCP server over stdio, list all its tools (every page), stop it."""
    if not command:
        raise ValueError("no command to start the MCP server")
    try:
        import mcp  # noqa: F401  (the optional extra)
    except ImportError as exc:
        raise RuntimeError(
            "the MCP helpers need the mcp package: pip install 'undolog[mcp]'") from exc
    try:
        return await _list_tools(command, server_environment() if env is None else dict(env))
    except Exception as exc:  # anyio wraps the real cause in (nested) exception groups
        raise RuntimeError(f"could not list the tools of the MCP server {' '.join(command)!r}: "
                           f"{_root_cause(exc)!r} (see its stderr above)") from exc


async def _list_tools(command: Sequence[str], env: dict[str, str]) -> list[Any]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.types import PaginatedRequestParams

    params = StdioServerParameters(command=command[0], args=list(command[1:]), env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools: list[Any] = []
        cursor: str | None = None
        while True:
            page = await session.list_tools(
                params=PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools


def _root_cause(exc: BaseException) -> BaseException:
    while getattr(exc, "exceptions", None):
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    return exc
