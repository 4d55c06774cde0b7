"""``@undolog_tool``: declare a function's tier once, where it is defined.

Outside a session a decorated tool is the plain function: it runs, nothing is sent.
Inside ``with client.session(...)`` the session decides what happens (see session.py).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._context import CURRENT
from .tiers import (
    ApprovalSpec,
    CompensationDescriptor,
    ToolSpec,
    ToolTier,
    annotations_dict,
    template_fields,
)

__all__ = ["DeclaredTool", "spec_of", "undolog_tool"]

# Bound-method receivers are not call arguments: they are neither JSON nor part of
# what a reviewer should see, and they would make every call signature unique.
_RECEIVERS = frozenset({"self", "cls"})


class DeclaredTool:
    """A decorated function with its spec and a prepared argument binder."""

    __slots__ = (
        "_defaults",
        "_drop",
        "_fast",
        "_keywords",
        "_positional",
        "_signature",
        "_var_kw",
        "_warned_sync",
        "fn",
        "idempotency_key",
        "is_async",
        "pre_image",
        "safe",
        "spec",
    )

    def __init__(self, spec: ToolSpec, fn: Callable[..., Any],
                 idempotency_key: Callable[[dict[str, Any]], str] | None) -> None:
        self.spec = spec
        self.fn = fn
        self.is_async = inspect.iscoroutinefunction(fn)
        self.safe = spec.tier is ToolTier.SAFE
        self.idempotency_key = idempotency_key
        self.pre_image: Any = None  # a PreImage (preimages.py): the before read and restore
        self._signature = inspect.signature(fn)
        params = self._signature.parameters
        self._drop = tuple(n for n in params if n in _RECEIVERS)
        self._var_kw = next((n for n, p in params.items() if p.kind is p.VAR_KEYWORD), None)
        self._warned_sync = False
        self._prepare_fast_bind(params)

    def _prepare_fast_bind(self, params: Mapping[str, inspect.Parameter]) -> None:
        """Signature.bind costs ~8 µs, most of the SAFE path's budget; plain signatures
        (no *args, **kw, self) are bound by hand, anything unusual falls back to it."""
        kinds = {p.kind for p in params.values()}
        self._fast = not self._drop and kinds <= {inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                  inspect.Parameter.KEYWORD_ONLY}
        self._positional = tuple(n for n, p in params.items()
                                 if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self._keywords = frozenset(params)
        self._defaults = tuple((n, p.default) for n, p in params.items()
                               if p.default is not inspect.Parameter.empty)

    @property
    def name(self) -> str:
        return self.spec.name

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments by parameter name, defaults applied (``**kw`` flattened)."""
        if self._fast and len(args) <= len(self._positional):
            arguments = dict(zip(self._positional, args, strict=False))
            if kwargs and (kwargs.keys() - self._keywords or kwargs.keys() & arguments.keys()):
                return self._bind_slowly(args, kwargs)  # raises the right TypeError
            arguments.update(kwargs)
            for name, default in self._defaults:
                arguments.setdefault(name, default)
            if len(arguments) == len(self._keywords):
                return arguments
        return self._bind_slowly(args, kwargs)

    def _bind_slowly(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        for name in self._drop:
            arguments.pop(name, None)
        if self._var_kw is not None:
            arguments.update(arguments.pop(self._var_kw, {}))
        return arguments

    def parameter_names(self) -> set[str] | None:
        """Names a template may refer to; None when ``**kwargs`` accepts anything."""
        if self._var_kw is not None:
            return None
        return {n for n in self._signature.parameters if n not in _RECEIVERS}


def undolog_tool(
    fn: Callable[..., Any] | None = None,
    *,
    tier: ToolTier | str,
    compensation: CompensationDescriptor | None = None,
    reason: str | None = None,
    risk_tags: Iterable[str] = (),
    estimated_impact: str | None = None,
    approval_timeout_s: int | None = None,
    auto_approve_on_timeout: bool | None = None,
    cost_weight: float = 1.0,
    irreversible: bool | None = None,
    annotations: Any = None,
    name: str | None = None,
    description: str | None = None,
    executor: Mapping[str, Any] | None = None,
    idempotency_key: Callable[[dict[str, Any]], str] | None = None,
    labels: Iterable[str] = (),
    untrusted_fields: Iterable[str] = (),
    before: Callable[..., Any] | None = None,
    restore: Callable[..., Any] | None = None,
    restore_absent: Callable[..., Any] | None = None,
    check: Callable[..., Any] | None = None,
    after: Callable[..., Any] | None = None,
    max_bytes: int | None = None,
    over_bound: str = "hold",
    asked: Iterable[str] = (),
) -> Any:
    """Declare a tool's tier. Works on sync and async functions, as ``@undolog_tool(...)``
    or ``undolog_tool(fn, tier=...)``.

    Raises ``ValueError`` at decoration time for a COMPENSABLE tool without a
    ``compensation``, an IRREVERSIBLE tool without a ``reason``, and templates
    (compensation args, ``estimated_impact``) naming a parameter the function lacks.

    ``before``/``restore`` (COMPENSABLE, instead of a ``compensation``): undo by pre-image
    (preimages.py). ``before`` reads the target (taking the call's args it names) and returns
    its state, or ``ABSENT``; ``restore`` takes the same args and ``before=`` and puts it back;
    ``restore_absent`` removes what the call created where nothing was there; ``check`` reads
    what the restore compares (default ``before``); ``after`` says from the args (and
    ``before=``) what the call leaves (default: read again after the call). ``max_bytes`` and
    ``over_bound`` (``"hold"`` or ``"refuse"``) bound the pre-image. Serve the restores with
    ``client.serve_compensations(undolog.preimages.handlers(tool, ...))``.
    """

    def decorate(func: Callable[..., Any]) -> Any:
        pre = None
        declared_compensation = compensation
        if before is not None:
            from .preimages import DEFAULT_MAX_BYTES, PreImage, function_name

            if restore is None and restore_absent is None:
                raise ValueError("a before read needs a restore (or restore_absent)")
            pre = PreImage.of_functions(
                name or func.__name__, before, restore, restore_absent=restore_absent, check=check,
                after=after, max_bytes=max_bytes or DEFAULT_MAX_BYTES, over_bound=over_bound)
            if declared_compensation is None:
                fn_name = function_name(name or func.__name__)
                declared_compensation = CompensationDescriptor(fn_name, {})
        elif restore is not None or restore_absent is not None:
            raise ValueError("restore needs a before read (before=...)")
        spec = ToolSpec(
            name=name or func.__name__,
            tier=ToolTier(tier),
            cost_weight=cost_weight,
            description=description if description is not None else _summary(func),
            irreversible=irreversible,
            compensation=declared_compensation,
            pre_image=pre.declaration if pre is not None else None,
            approval=_approval(ToolTier(tier), reason, risk_tags, estimated_impact,
                               approval_timeout_s, auto_approve_on_timeout),
            annotations=annotations_dict(annotations),
            executor=executor,
            labels=tuple(labels),
            untrusted_fields=tuple(untrusted_fields),
            asked=tuple(asked),
        )
        tool = DeclaredTool(spec, func, idempotency_key)
        tool.pre_image = pre
        _check_templates(tool)
        return _wrap(tool)

    return decorate if fn is None else decorate(fn)


def _approval(tier: ToolTier, reason: str | None, risk_tags: Iterable[str],
              estimated_impact: str | None, timeout_s: int | None,
              auto_approve: bool | None) -> ApprovalSpec | None:
    extras = (tuple(risk_tags), estimated_impact, timeout_s, auto_approve)
    if tier is not ToolTier.IRREVERSIBLE and any(x not in ((), None) for x in extras):
        raise ValueError("risk_tags, estimated_impact and approval settings apply to "
                         "IRREVERSIBLE tools only")
    if reason is None:
        return None  # ToolSpec reports the missing reason of an IRREVERSIBLE tool
    return ApprovalSpec(reason, *extras)


def _check_templates(tool: DeclaredTool) -> None:
    """A placeholder naming no parameter would render wrong on the server, much later."""
    known = tool.parameter_names()
    if known is None:
        return
    used: set[str] = set()
    if tool.spec.compensation is not None:
        used |= tool.spec.compensation.placeholders()
    if tool.spec.approval is not None and tool.spec.approval.estimated_impact:
        used |= template_fields(tool.spec.approval.estimated_impact)
    unknown = used - known
    if unknown:
        raise ValueError(f"{tool.name}: template refers to unknown parameter(s) {sorted(unknown)}")


def _wrap(tool: DeclaredTool) -> Any:
    func = tool.fn
    # The session lookup is inlined in each wrapper: the SAFE path's budget is a few µs.
    if tool.is_async:
        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            session = CURRENT.get()
            if session is None:
                return await func(*args, **kwargs)
            return await session.acall(tool, args, kwargs)

        wrapper: Any = async_wrapper
    else:
        @functools.wraps(func)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            session = CURRENT.get()
            if session is None:
                return func(*args, **kwargs)
            return session.call(tool, args, kwargs)

        wrapper = sync_wrapper
    wrapper.undolog_spec = tool.spec
    wrapper.__undolog_tool__ = tool
    return wrapper


def _summary(func: Callable[..., Any]) -> str:
    doc = inspect.getdoc(func) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def declared_tool(obj: Any) -> DeclaredTool | None:
    """The DeclaredTool behind a decorated function (None for anything else)."""
    return getattr(obj, "__undolog_tool__", None)


def spec_of(obj: Any) -> ToolSpec:
    """The ToolSpec of a decorated function, or the ToolSpec itself."""
    if isinstance(obj, ToolSpec):
        return obj
    spec = getattr(obj, "undolog_spec", None)
    if isinstance(spec, ToolSpec):
        return spec
    raise TypeError(f"{obj!r} is not an @undolog_tool function or a ToolSpec")
