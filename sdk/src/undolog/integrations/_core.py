"""What every adapter shares: declaring a framework's tool, and running one call of it
through the current session with the SDK's own tier paths.

A framework hands us a tool name, its arguments as a dict and a way to run it with given
args (a callback: it gets the model's args, or the ones a reviewer edited before approving);
``@undolog_tool`` wraps a Python function instead. Both end in the same
``Session`` flows, so SAFE, replay, budget and approval behave exactly as documented in
sdk/README.md. This is the one module that reaches into ``Session``'s private flow
methods: if they change, only this file follows.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from contextvars import ContextVar
from typing import Any, NamedTuple

from .._context import CURRENT
from .._http import Call
from ..client import UndoLogClient
from ..decorator import DeclaredTool, declared_tool, undolog_tool
from ..errors import ApprovalWaitTimeout
from ..session import Flow, Session, edited_args
from ..tiers import ToolSpec, ToolTier

__all__ = ["Declaration", "Outcome", "Run", "acall", "call", "declare", "edited_note",
           "options_for", "wait_for_decision"]

#: What a caller may say about a tool: a tier (``"safe"``, ``ToolTier.COMPENSABLE``) or the
#: keyword arguments of ``@undolog_tool`` (``{"tier": ..., "compensation": ..., ...}``).
Declaration = ToolTier | str | Mapping[str, Any] | ToolSpec

#: Called before a long poll for a reviewer's decision, with the intercept's answer.
#: It may raise (LangGraph's ``interrupt()`` does) to stop waiting here.
OnHold = Callable[[Mapping[str, Any]], None]


def options_for(declaration: Declaration, **overrides: Any) -> dict[str, Any]:
    """``@undolog_tool`` keyword arguments from a tier, a mapping of them, or a ``ToolSpec``
    (``spec_of(decorated_fn)``, what ``undolog mcp-import`` classified...)."""
    if isinstance(declaration, ToolSpec):
        options = _spec_options(declaration)
    elif isinstance(declaration, (ToolTier, str)):
        options: dict[str, Any] = {"tier": declaration}
    elif isinstance(declaration, Mapping):
        options = dict(declaration)
    else:
        raise TypeError(f"a tool's declaration is a tier or a mapping of @undolog_tool "
                        f"options, not {declaration!r}")
    options.update({k: v for k, v in overrides.items() if v is not None})
    if "tier" not in options:
        raise ValueError(f"declaration {declaration!r} has no tier")
    return options


def _spec_options(spec: ToolSpec) -> dict[str, Any]:
    options: dict[str, Any] = {"tier": spec.tier, "cost_weight": spec.cost_weight,
                               "compensation": spec.compensation, "irreversible": spec.irreversible,
                               "annotations": spec.annotations or None, "executor": spec.executor,
                               "labels": spec.labels or None,
                               "untrusted_fields": spec.untrusted_fields or None}
    if spec.approval is not None:
        options.update(reason=spec.approval.reason, risk_tags=spec.approval.risk_tags,
                       estimated_impact=spec.approval.estimated_impact,
                       approval_timeout_s=spec.approval.timeout_s,
                       auto_approve_on_timeout=spec.approval.auto_approve_on_timeout)
    return {k: v for k, v in options.items() if v is not None}


def declare(name: str, parameters: Iterable[str] | None, description: str,
            options: Mapping[str, Any]) -> DeclaredTool:
    """A ``DeclaredTool`` for a framework's tool, checked like ``@undolog_tool`` would.

    ``parameters`` are the tool's argument names, so that compensation templates naming
    an argument the tool does not have fail here, at wrapping time (None: accept any).
    """

    def stand_in(**kwargs: Any) -> Any:  # never called: the framework runs the tool
        raise RuntimeError(f"{name} is run by its framework")

    if parameters is not None:
        stand_in.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY) for p in parameters])
    wrapped = undolog_tool(stand_in, **{"name": name, "description": description, **options})
    tool = declared_tool(wrapped)
    assert tool is not None
    return tool


#: How an adapter runs its framework's tool: called with the args to run it with, the
#: model's or (approved_args) the ones a reviewer edited before approving.
Run = Callable[[dict[str, Any]], Any]


class Outcome(NamedTuple):
    """A call's result, and ``edited``: the reviewer's args it ran with (or, replayed, was
    committed with) instead of the model's; None when the model's own args were used."""

    result: Any
    edited: dict[str, Any] | None = None


def edited_note(edited: Mapping[str, Any]) -> str:
    """What the model reads before the output of a call a reviewer edited: without it the
    model would take the output for the outcome of the args it proposed."""
    shown = json.dumps(edited, ensure_ascii=False, default=str)
    return (f"Note: a reviewer edited this call's arguments before approving it; it ran with "
            f"{shown}, not with the arguments you proposed.")


def call(tool: DeclaredTool, args: dict[str, Any], run: Run,
         on_hold: OnHold | None = None) -> Outcome:
    """One call of ``tool`` in the current session (outside one: ``run(args)``)."""
    session = CURRENT.get()
    if session is None:
        return Outcome(run(args))
    if tool.safe:
        if tool.spec.reports_output:
            return Outcome(_reported(session, tool, args, run(args)))
        session._record_safe(tool.name, args)
        return Outcome(run(args))
    seen: dict[str, Any] = {}
    flow = _flow(session, tool, args, on_hold, seen)
    if _HOLDING.get() is session:  # a tool calling a tool: it already has the turn
        return _outcome(session._drive(flow, _with(run, args)), seen)
    with _lock_of(session):
        token = _HOLDING.set(session)
        try:
            return _outcome(session._drive(flow, _with(run, args)), seen)
        finally:
            _HOLDING.reset(token)


async def acall(tool: DeclaredTool, args: dict[str, Any],
                run: Callable[[dict[str, Any]], Awaitable[Any]],
                on_hold: OnHold | None = None) -> Outcome:
    """Async twin of ``call``: ``run(args)`` returns an awaitable."""
    session = CURRENT.get()
    if session is None:
        return Outcome(await run(args))
    if tool.safe:
        if tool.spec.reports_output:
            return Outcome(_reported(session, tool, args, await run(args)))
        session._record_safe(tool.name, args)
        return Outcome(await run(args))
    seen: dict[str, Any] = {}
    flow = _flow(session, tool, args, on_hold, seen)
    if _HOLDING.get() is session:
        return _outcome(await session._adrive(flow, _with(run, args)), seen)
    async with _alock_of(session):
        token = _HOLDING.set(session)
        try:
            return _outcome(await session._adrive(flow, _with(run, args)), seen)
        finally:
            _HOLDING.reset(token)


def _reported(session: Session, tool: DeclaredTool, args: dict[str, Any], output: Any) -> Any:
    """A SAFE read of an ``untrusted`` tool: its output rides with the next request, where
    the server keeps its fingerprints for ``tainted()`` (never the text). A read that raised
    is not reported: there is no output whose text could reach a later call.

    A framework may have turned a tool's dict into its JSON text (LangChain's ToolMessage):
    for a tool naming ``untrusted_fields`` that text is parsed back, or the server could not
    find the fields in it."""
    reported = output
    if tool.spec.untrusted_fields and isinstance(output, str):
        try:
            parsed = json.loads(output)
        except ValueError:
            parsed = None
        if isinstance(parsed, (dict, list)):
            reported = parsed
    session._record_safe(tool.name, args, reported)
    return output


def _with(run: Callable[[dict[str, Any]], Any], args: dict[str, Any]) -> Callable[..., Any]:
    """The session's run instruction (``edited``: the reviewer's args) as the adapter's run."""
    return lambda edited=None: run(args if edited is None else edited)


def _outcome(result: Any, seen: Mapping[str, Any]) -> Outcome:
    return Outcome(result, edited_args(seen.get("effect") or {}))


# Frameworks run a model's parallel tool calls at once (LangGraph's ToolNode on threads or
# tasks, the Agents SDK with asyncio.gather). The server answers an intercept made while
# another call of the session waits for a reviewer with 409 session_awaiting_approval, so
# the calls of one session that reach the server go one after the other, in the order
# they arrive. SAFE calls never wait.
_LOCKS: weakref.WeakKeyDictionary[Session, threading.Lock] = weakref.WeakKeyDictionary()
_ALOCKS: weakref.WeakKeyDictionary[Session, tuple[Any, asyncio.Lock]] = \
    weakref.WeakKeyDictionary()
_GUARD = threading.Lock()
_HOLDING: ContextVar[Session | None] = ContextVar("undolog_holding", default=None)


def _lock_of(session: Session) -> threading.Lock:
    with _GUARD:
        lock = _LOCKS.get(session)
        if lock is None:
            lock = _LOCKS[session] = threading.Lock()
        return lock


def _alock_of(session: Session) -> asyncio.Lock:
    loop = asyncio.get_running_loop()
    with _GUARD:
        held = _ALOCKS.get(session)
        if held is None or held[0] is not loop:  # an asyncio.Lock belongs to one loop
            held = _ALOCKS[session] = (loop, asyncio.Lock())
        return held[1]


def _flow(session: Session, tool: DeclaredTool, args: dict[str, Any],
          on_hold: OnHold | None, seen: dict[str, Any]) -> Flow:
    return _watching(session._effect_flow(tool, args), on_hold, seen)


def _watching(flow: Flow, on_hold: OnHold | None, seen: dict[str, Any]) -> Flow:
    """Pass ``flow``'s I/O through, keeping the last effect the server answered in
    ``seen["effect"]`` (a replayed call's approved_args are only there) and calling
    ``on_hold`` before it long-polls a pending effect, i.e. before it waits for a reviewer."""
    value: Any = None
    error: BaseException | None = None
    last: Mapping[str, Any] = {}
    while True:
        try:
            op = flow.throw(error) if error is not None else flow.send(value)
        except StopIteration as stop:
            return stop.value
        value, error = None, None
        if (on_hold is not None and isinstance(op, Call) and op.method == "GET" and op.params
                and "wait" in op.params and (last.get("effect") or {}).get("state") == "pending"):
            on_hold(last)
        try:
            value = yield op
        except Exception as exc:
            error = exc
        else:
            if isinstance(value, Mapping) and isinstance(value.get("effect"), Mapping):
                # A poll's answer may leave out the approval the intercept announced.
                last = {"effect": value["effect"],
                        "approval": value.get("approval") or last.get("approval") or {}}
                seen["effect"] = value["effect"]


def wait_for_decision(client: UndoLogClient | Session, effect_id: str,
                      timeout: float | None = None, poll_wait: float = 30.0) -> dict[str, Any]:
    """The effect once a reviewer decided it (not pending any more), waiting by long poll."""
    flow = _decision_flow(effect_id, timeout, poll_wait)
    answer: Any = None
    while True:
        try:
            call = flow.send(answer)
        except StopIteration as stop:
            return stop.value
        answer = client._http.send(call)


async def await_decision(client: UndoLogClient | Session, effect_id: str,
                         timeout: float | None = None, poll_wait: float = 30.0) -> dict[str, Any]:
    """Async twin of ``wait_for_decision``."""
    flow = _decision_flow(effect_id, timeout, poll_wait)
    answer: Any = None
    while True:
        try:
            call = flow.send(answer)
        except StopIteration as stop:
            return stop.value
        answer = await client._http.asend(call)


def _decision_flow(effect_id: str, timeout: float | None,
                   poll_wait: float) -> Generator[Call, Any, dict[str, Any]]:
    # A plain read first: the server long-polls an approved effect too (until it runs),
    # so ?wait= is only for an effect still pending.
    effect = ((yield Call("GET", f"/api/v1/effects/{effect_id}")).get("effect") or {})
    started = time.monotonic()
    while effect.get("state") == "pending":
        wait = poll_wait
        if timeout is not None:
            remaining = timeout - (time.monotonic() - started)
            if remaining <= 0:
                raise ApprovalWaitTimeout(f"effect {effect_id}: no decision after {timeout:g}s",
                                          effect_id=effect_id)
            wait = min(wait, remaining)
        answer = yield Call("GET", f"/api/v1/effects/{effect_id}",
                            params={"wait": min(60, max(1, int(wait)))}, timeout=wait + 15)
        effect = answer.get("effect") or {}
    return effect
