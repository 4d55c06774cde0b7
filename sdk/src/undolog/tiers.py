"""The tier model: what a tool is, and the registration body the server reads.

Everything here is plain data with no network code, so a spec can be built,
validated and inspected (or printed by the CLI) without a server.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = [
    "ApprovalSpec",
    "CompensationDescriptor",
    "ToolSpec",
    "ToolTier",
    "annotations_dict",
    "template_fields",
]

# Semver 2.0.0 core plus optional pre-release/build, as the server's registry checks it.
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"
)

_RESULT_REF = re.compile(r"\{result(?:\.([A-Za-z0-9_.-]+))?\}")

# MCP hint names on the wire (camelCase) and in mcp 2.x models (snake_case).
HINTS = {
    "readOnlyHint": "read_only_hint",
    "destructiveHint": "destructive_hint",
    "idempotentHint": "idempotent_hint",
    "openWorldHint": "open_world_hint",
}


class ToolTier(str, Enum):
    """How much care a tool needs. The value is what the API sends."""

    SAFE = "safe"
    COMPENSABLE = "compensable"
    IRREVERSIBLE = "irreversible"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class CompensationDescriptor:
    """The undo of a compensable tool: a registered function and its args template.

    ``args`` values may be templates: ``"{to}"`` is the call's argument ``to``, filled in
    before the tool runs; ``"{result.number}"`` (any dotted path, list items by index) is
    taken from the result the call committed, filled in at commit. A template the result
    cannot fill sends the undo entry to a person at once (``compensation_failed``), and
    an effect that never committed has no result: its entry goes to a person too.
    """

    fn_name: str
    args: Mapping[str, Any] = field(default_factory=dict)
    fn_version: str = "1.0.0"
    max_retries: int = 3
    retry_backoff_ms: int = 1000

    @classmethod
    def new(
        cls,
        fn_name: str,
        args: Mapping[str, Any] | None = None,
        fn_version: str = "1.0.0",
        max_retries: int = 3,
        retry_backoff_ms: int = 1000,
    ) -> CompensationDescriptor:
        return cls(fn_name, dict(args or {}), fn_version, max_retries, retry_backoff_ms)

    def __post_init__(self) -> None:
        if not self.fn_name or not isinstance(self.fn_name, str):
            raise ValueError("CompensationDescriptor needs a non-empty fn_name")
        if not _SEMVER.match(self.fn_version):
            raise ValueError(f"fn_version {self.fn_version!r} is not a semver version like '1.0.0'")
        if self.max_retries < 0 or self.retry_backoff_ms < 0:
            raise ValueError("max_retries and retry_backoff_ms must not be negative")

    def placeholders(self) -> set[str]:
        """Argument names the args template refers to (``{result...}`` paths excluded)."""
        return set().union(*(template_fields(v) for v in _strings(self.args))) - {"result"}

    def result_paths(self) -> set[str]:
        """Paths into the committed result the template reads: ``{result.a.b}`` -> "a.b"."""
        return {m.group(1) or "" for v in _strings(self.args) for m in _RESULT_REF.finditer(v)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "fn_name": self.fn_name,
            "fn_version": self.fn_version,
            "args": dict(self.args),
            "max_retries": self.max_retries,
            "retry_backoff_ms": self.retry_backoff_ms,
        }


@dataclass(frozen=True)
class ApprovalSpec:
    """What a reviewer is shown for an irreversible tool, and its deadline policy."""

    reason: str
    risk_tags: tuple[str, ...] = ()
    estimated_impact: str | None = None
    timeout_s: int | None = None
    auto_approve_on_timeout: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ValueError("an IRREVERSIBLE tool needs a non-empty reason (shown to reviewers)")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError("approval timeout_s must be positive")

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "reason": self.reason,
            "risk_tags": list(self.risk_tags),
            "estimated_impact": self.estimated_impact or "",
        }
        # Absent rather than null: the server then applies the org's defaults.
        if self.timeout_s is not None:
            body["timeout_s"] = self.timeout_s
        if self.auto_approve_on_timeout is not None:
            body["auto_approve_on_timeout"] = self.auto_approve_on_timeout
        return body


@dataclass(frozen=True)
class ToolSpec:
    """A tool as registered with ``POST /api/v1/tools``."""

    name: str
    tier: ToolTier
    cost_weight: float = 1.0
    description: str = ""
    irreversible: bool | None = None
    compensation: CompensationDescriptor | None = None
    approval: ApprovalSpec | None = None
    annotations: Mapping[str, Any] = field(default_factory=dict)
    executor: Mapping[str, Any] | None = None
    # Run-aware policy: free strings rules read as tool.labels; "untrusted": what it returns is text
    # others wrote, so a SAFE call reports its output (the server keeps fingerprints, not the text).
    labels: tuple[str, ...] = ()
    untrusted_fields: tuple[str, ...] = ()
    # A before read and a restore (issue 42, preimages.py): the declaration the server keeps.
    pre_image: Mapping[str, Any] | None = None
    # What a request must say for this tool to be asked for ("password"; "pay", "transfer"): the
    # policy's `asked(tool)`.
    asked: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_tier_fields(self)
        if self.pre_image is not None and self.tier is not ToolTier.COMPENSABLE:
            raise ValueError(f"{self.name}: only a COMPENSABLE tool takes a before read")
        # Frozen: lists given by the caller are kept as tuples.
        object.__setattr__(self, "labels", tuple(self.labels))
        object.__setattr__(self, "untrusted_fields", tuple(self.untrusted_fields))
        object.__setattr__(self, "asked", tuple(self.asked))
        if len(self.asked) > 32 or any(not isinstance(x, str) or not x.strip() or len(x) > 60
                                       for x in self.asked):
            raise ValueError(f"{self.name}: asked is at most 32 words or phrases "
                             "of 1 to 60 characters")
        if len(self.labels) > 16 or any(not isinstance(x, str) or not 0 < len(x) <= 40
                                        for x in self.labels):
            raise ValueError(f"{self.name}: labels are at most 16 strings of 1 to 40 characters")

    @property
    def reports_output(self) -> bool:
        """A SAFE read of text others wrote sends its output with the next request."""
        return self.tier is ToolTier.SAFE and "untrusted" in self.labels

    @property
    def counts_as_irreversible(self) -> bool:
        return self.tier is ToolTier.IRREVERSIBLE or bool(self.irreversible)

    def to_dict(self) -> dict[str, Any]:
        """The tool's entry in the ``{"tools": [...]}`` registration body."""
        body: dict[str, Any] = {"name": self.name, "tier": self.tier.value,
                                "cost_weight": self.cost_weight}
        if self.description:
            body["description"] = self.description
        if self.irreversible is not None:
            body["irreversible"] = self.irreversible
        if self.compensation is not None:
            body["compensation"] = self.compensation.to_dict()
        if self.approval is not None:
            body["approval"] = self.approval.to_dict()
        if self.annotations:
            body["annotations"] = dict(self.annotations)
        if self.executor:
            body["executor"] = dict(self.executor)
        if self.labels:
            body["labels"] = list(self.labels)
        if self.untrusted_fields:
            body["untrusted_fields"] = list(self.untrusted_fields)
        if self.pre_image is not None:
            body["pre_image"] = dict(self.pre_image)
        if self.asked:
            body["asked"] = list(self.asked)
        return body


def _check_tier_fields(spec: ToolSpec) -> None:
    """Reject combinations the server would refuse, at declaration time."""
    if not spec.name:
        raise ValueError("a tool needs a name")
    if not isinstance(spec.cost_weight, (int, float)) or spec.cost_weight < 0:
        raise ValueError(f"{spec.name}: cost_weight must be a number >= 0")
    tier = spec.tier
    if tier is ToolTier.COMPENSABLE and spec.compensation is None:
        raise ValueError(f"{spec.name}: a COMPENSABLE tool needs a CompensationDescriptor")
    if tier is ToolTier.IRREVERSIBLE and spec.approval is None:
        raise ValueError(f"{spec.name}: an IRREVERSIBLE tool needs a reason")
    if tier is not ToolTier.COMPENSABLE and spec.compensation is not None:
        raise ValueError(f"{spec.name}: only COMPENSABLE tools take a compensation")
    if tier is not ToolTier.IRREVERSIBLE and spec.approval is not None:
        raise ValueError(f"{spec.name}: reason/approval settings apply to IRREVERSIBLE tools only")
    if tier is ToolTier.SAFE and spec.irreversible:
        raise ValueError(f"{spec.name}: a SAFE tool cannot count as irreversible")
    if tier is ToolTier.IRREVERSIBLE and spec.irreversible is False:
        raise ValueError(f"{spec.name}: an IRREVERSIBLE tool always counts as irreversible")


def template_fields(template: str) -> set[str]:
    """Root argument names in a ``str.format`` template: ``"{a.b} {c[0]}"`` -> {a, c}."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"bad template {template!r}: {exc}") from None
    names = set()
    for _, name, _, _ in parsed:
        if name:
            names.add(re.split(r"[.\[]", name, maxsplit=1)[0])
    return names


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def annotations_dict(annotations: Any) -> dict[str, Any]:
    """MCP hints as the camelCase dict the API takes.

    Accepts a dict (camelCase or snake_case keys) or an object such as
    ``mcp.types.ToolAnnotations`` (snake_case attributes in mcp 2.x, camelCase in 1.x).
    Unset hints are left out so the server, like MCP, applies the defaults.
    """
    if annotations is None:
        return {}
    out: dict[str, Any] = {}
    for camel, snake in HINTS.items():
        value = _hint(annotations, camel, snake)
        if value is not None:
            out[camel] = bool(value)
    title = _hint(annotations, "title", "title")
    if title:
        out["title"] = str(title)
    return out


def _hint(annotations: Any, camel: str, snake: str) -> Any:
    if isinstance(annotations, Mapping):
        value = annotations.get(camel)
        return annotations.get(snake) if value is None else value
    value = getattr(annotations, snake, None)
    return getattr(annotations, camel, None) if value is None else value
