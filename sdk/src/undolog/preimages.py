"""Pre-images: undo for tools that have no undo (issue 42).

A COMPENSABLE tool may declare a *before* read instead of an inverse: right after undolog admits
a call, and before the call runs, the before read looks at the target (a file, a record) and
what it finds is kept, sealed, with the call's undo entry on the server. A rollback puts it
back with the tool's *restore*, as a **compare-and-restore**: only over what this run wrote.

    @undolog_tool(tier=COMPENSABLE, before=read_record, restore=restore_record)
    def update_record(record_id: str, fields: dict) -> dict: ...

    def read_record(record_id: str) -> dict | ABSENT: ...      # the call's args it names
    def restore_record(record_id: str, before: dict) -> None: ...

What the rollback does with an entry (``compare_and_restore``), reading the target again first:

- it is what it was before the call (the call never ran, or was undone already): nothing;
- it is what this run wrote (the after-image's digest, known from the call's args or read
  right after the call): the restore runs (``restore_absent`` where nothing was there before:
  delete what the call created);
- anything else (someone changed it since): not overwritten; the entry goes to a person with
  the digests of what this run wrote and of what is there now
  (``PermanentCompensationError``);
- no after-image known (the process died between the before read and the call, or before the
  read after it): the call's outcome is unknown; the restore runs (the target is put back as
  it was before the call).

A target's state is one JSON value (``None`` when absent); its digest is ``sha256:`` and the
SHA-256 of its canonical JSON (sorted keys, no spaces, UTF-8), as on the server.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import re
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .compensations import PermanentCompensationError

__all__ = [
    "ABSENT",
    "AfterUnknown",
    "PreImage",
    "PreImageError",
    "compare_and_restore",
    "digest",
    "handlers",
    "render",
]

DEFAULT_MAX_BYTES = 256 * 1024
# What a client sends at most: beyond it a pre-image is refused (the server's body limit is 1 MiB).
SEND_MAX_BYTES = 900 * 1024


class _Absent:
    """What a before read returns when nothing is there (a file that does not exist yet)."""

    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT = _Absent()


class PreImageError(Exception):
    """The before read failed: the call was not run (a call never runs without its undo)."""


class AfterUnknown(Exception):
    """Raised by an ``after`` function that cannot say what this call will leave: the target is
    then read again after the call (with ``check``, else ``before``), a second read."""


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest(state: Any) -> str:
    """The digest of a target's state (``None`` or ``ABSENT``: nothing there)."""
    return "sha256:" + hashlib.sha256(canonical(None if state is ABSENT else state)).hexdigest()


# -- templates: the gateway's declarations ({path}, {before.content}, {entities[*].name}) ---------

_PATH = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_-]+|\[\*\]|\[\d+\])*"
_PLACEHOLDER = re.compile(r"\{(" + _PATH + r")\}")
_STEP = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\*|\d+)\]")


class TemplateError(ValueError):
    pass


def _lookup(name: str, roots: Mapping[str, Any]) -> Any:
    root = re.match(r"[A-Za-z_][A-Za-z0-9_]*", name).group(0)  # type: ignore[union-attr]
    if root not in roots:
        raise TemplateError(f"{{{name}}}: nothing named {root!r}")
    return _walk(roots[root], [(k, i) for k, i in _STEP.findall(name[len(root) :])], name)


def _walk(value: Any, steps: list[tuple[str, str]], name: str) -> Any:
    for position, (key, index) in enumerate(steps):
        if index == "*":
            if not isinstance(value, list):
                raise TemplateError(f"{{{name}}}: not a list")
            return [_walk(item, steps[position + 1 :], name) for item in value]
        if index:
            if not isinstance(value, list) or int(index) >= len(value):
                raise TemplateError(f"{{{name}}}: no item {index}")
            value = value[int(index)]
        elif isinstance(value, Mapping) and key in value:
            value = value[key]
        else:
            raise TemplateError(f"{{{name}}}: no {key!r}")
    return value


def render(template: Any, roots: Mapping[str, Any]) -> Any:
    """A template rendered strictly, as the server renders compensation args: a value that is
    exactly one placeholder keeps its JSON type; inside text a placeholder is formatted."""
    if isinstance(template, Mapping):
        return {key: render(value, roots) for key, value in template.items()}
    if isinstance(template, list):
        return [render(value, roots) for value in template]
    if not isinstance(template, str):
        return template
    whole = _PLACEHOLDER.fullmatch(template)
    if whole:
        return _lookup(whole.group(1), roots)

    def text(match: re.Match[str]) -> str:
        value = _lookup(match.group(1), roots)
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    return _PLACEHOLDER.sub(text, template)


# -- the runtime -----------------------------------------------------------------------------------


def _with_args(fn: Callable[..., Any], args: Mapping[str, Any], **extra: Any) -> Any:
    """Call ``fn`` with the call's args it names (all of them when it takes ``**kwargs``)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(**{**args, **extra})
    given = {**args, **extra}
    return fn(**{name: given[name] for name in params if name in given})


@dataclass(frozen=True)
class PreImage:
    """A tool's before read and restore, as callables the agent side runs, and the declaration
    the server keeps (``declaration``).

    ``read(args)``: the target's state, or ``ABSENT``. ``check(args)``: the state the restore
    compares (default ``read``; a move reads its destination). ``restore(args, before)`` puts
    ``before`` back; ``restore_absent(args)`` removes what the call created (None: nothing to
    do). ``after(args, before)``: what the call leaves, from its args (a write's content) and
    what was there (an edit), or None to read it with ``check`` right after the call (as when
    it raises ``AfterUnknown``).
    """

    read: Callable[[Mapping[str, Any]], Any]
    restore: Callable[[Mapping[str, Any], Any], Any] | None
    declaration: Mapping[str, Any] = field(default_factory=dict)
    check: Callable[[Mapping[str, Any]], Any] | None = None
    restore_absent: Callable[[Mapping[str, Any]], Any] | None = None
    after: Callable[[Mapping[str, Any], Any], Any] | None = None
    max_bytes: int = DEFAULT_MAX_BYTES
    over_bound: str = "hold"

    def __post_init__(self) -> None:
        if self.over_bound not in ("hold", "refuse"):
            raise ValueError("over_bound is 'hold' (a person decides) or 'refuse'")
        if self.max_bytes <= 0:
            raise ValueError("max_bytes must be positive")

    @classmethod
    def of_functions(
        cls,
        name: str,
        before: Callable[..., Any],
        restore: Callable[..., Any] | None,
        *,
        restore_absent: Callable[..., Any] | None = None,
        check: Callable[..., Any] | None = None,
        after: Callable[..., Any] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        over_bound: str = "hold",
    ) -> PreImage:
        """The SDKs' form: plain functions taking the call's args by name (``restore`` and
        ``after`` also ``before=``)."""
        declaration: dict[str, Any] = {
            "before": {"fn": _name(before)},
            "max_bytes": max_bytes,
            "over_bound": over_bound,
        }
        if restore is not None:
            declaration["restore"] = {"fn": _name(restore)}
        if restore_absent is not None:
            declaration["restore_absent"] = {"fn": _name(restore_absent)}
        if check is not None:
            declaration["check"] = {"fn": _name(check)}
        if after is not None:
            declaration["after"] = {"fn": _name(after)}
        return cls(
            read=lambda args: _with_args(before, args),
            restore=(lambda args, value: _with_args(restore, args, before=value))
            if restore
            else None,
            declaration=declaration,
            check=(lambda args: _with_args(check, args)) if check else None,
            restore_absent=(lambda args: _with_args(restore_absent, args))
            if restore_absent
            else None,
            after=(lambda args, value: _with_args(after, args, before=value)) if after else None,
            max_bytes=max_bytes,
            over_bound=over_bound,
        )

    def body(self, args: Mapping[str, Any], state: Any) -> dict[str, Any]:
        """What ``POST /effects/{id}/pre-image`` is sent."""
        absent = state is ABSENT
        value = None if absent else state
        size = len(canonical(value))
        if size > SEND_MAX_BYTES or (size > self.max_bytes and self.over_bound == "refuse"):
            return {"size": size, "over_bound": True}
        body: dict[str, Any] = {"value": value, "absent": absent}
        if self.after is not None:
            with contextlib.suppress(AfterUnknown):  # then read after the call (``reads_after``)
                body["after_digest"] = digest(self.after(args, value))
        return body

    def reads_after(self, body: Mapping[str, Any]) -> bool:
        """Whether the target is read again after the call: no after-image came with ``body``."""
        return "after_digest" not in body


def _name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", "") or ""
    return f"{module}.{getattr(fn, '__qualname__', repr(fn))}".strip(".")[:200]


# -- compare-and-restore, one generator for both drivers -------------------------------------------

Steps = Generator[tuple[Callable[..., Any], tuple[Any, ...]], Any, str]


def restore_steps(pre: PreImage, kept: Mapping[str, Any] | None) -> Steps:
    """The compare-and-restore of one claimed entry (``kept``: its ``pre_image``). Yields the
    calls to make (function, args); returns what it did. Raises PermanentCompensationError
    when a person must decide."""
    if not kept:
        return "nothing kept: the call never ran"
    if kept.get("dropped"):
        raise PermanentCompensationError(
            "the pre-image was dropped (the run's undo window passed); restore it by hand "
            f"(before: {kept.get('before_digest')})"
        )
    args = kept.get("call_args") or {}
    current = yield (pre.check or pre.read, (args,))
    now = digest(current)
    before, written = kept.get("before_digest"), kept.get("after_digest")
    # What this run wrote is checked first: a move's destination holds what its source held.
    if not (written and now == written):
        if now == before:
            return "already as it was before the call"
        if written:
            raise PermanentCompensationError(
                f"changed since this run wrote it, not overwritten: this run wrote {written}, "
                f"it is now {now} (before the run: {before}); a person decides"
            )
        # No after-image: the call's outcome is unknown (a crash); it is put back as it was.
    if kept.get("absent"):
        if pre.restore_absent is not None:
            yield (pre.restore_absent, (args,))
        return "removed what the call created"
    if pre.restore is None:
        return "nothing to restore: it was there before (an idempotent call)"
    yield (pre.restore, (args, kept.get("value")))
    return "restored"


def compare_and_restore(pre: PreImage, kept: Mapping[str, Any] | None) -> str:
    steps = restore_steps(pre, kept)
    value: Any = None
    while True:
        try:
            fn, args = steps.send(value)
        except StopIteration as stop:
            return stop.value
        value = fn(*args)


async def acompare_and_restore(pre: PreImage, kept: Mapping[str, Any] | None) -> str:
    steps = restore_steps(pre, kept)
    value: Any = None
    while True:
        try:
            fn, args = steps.send(value)
        except StopIteration as stop:
            return stop.value
        value = fn(*args)
        if inspect.isawaitable(value):
            value = await value


def handler(pre: PreImage) -> Callable[[dict[str, Any], Mapping[str, Any]], str]:
    """A ``serve_compensations`` handler: the compare-and-restore of the claimed entry."""
    return lambda args, context: compare_and_restore(pre, context.get("pre_image"))


def function_name(tool_name: str) -> str:
    """The agent-handler compensation a pre-image tool registers when it names none."""
    return f"preimage.{tool_name}"[:100]


def handlers(*tools: Any) -> dict[str, Callable[[dict[str, Any], Mapping[str, Any]], str]]:
    """``serve_compensations`` handlers for decorated tools that declare a before read: each
    one's compare-and-restore, under the compensation it registered."""
    from .decorator import declared_tool

    found = {}
    for tool in tools:
        declared = declared_tool(tool)
        if declared is None or declared.pre_image is None or declared.spec.compensation is None:
            raise ValueError(f"{tool!r} is not an @undolog_tool with before=")
        found[declared.spec.compensation.fn_name] = handler(declared.pre_image)
    return found
