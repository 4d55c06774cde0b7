"""undolog for LangChain 1.x and LangGraph: ``pip install "undolog[langchain]"``.

Three ways in, one behaviour (sdk/README.md, "LangChain and LangGraph"):

- ``wrap_tool(tool, tier, ...)`` / ``wrap_tools(tools, tiers)``: an existing tool
  (``BaseTool``, an ``@tool`` function, a plain function) becomes an ``UndologTool`` with
  the same name, description and schema; hand it to ``create_agent``, a ``ToolNode`` or
  ``bind_tools`` as before.
- ``UndologMiddleware(tiers)``: the one-line alternative for ``create_agent`` (its
  ``wrap_tool_call`` hook); ``ToolNode(tools, wrap_tool_call=mw.wrap_tool_call,
  awrap_tool_call=mw.awrap_tool_call)`` for a hand-built graph.
- ``thread_session(client, graph, config)``: a LangGraph run is an undolog session. The
  thread id goes in the session's metadata and the session id in the checkpoints'
  metadata, so a run resumed from its checkpointer resumes the same session, whose
  committed calls replay instead of running again. An exception that ends the run fails
  the session, which rolls it back.

A refused call (budget, rejection, expiry, a suspended agent) is not an exception here:
the model reads ``refusal_as_tool_result``'s text as the tool's output, and can plan
around it. An IRREVERSIBLE call waiting for a reviewer uses LangGraph's ``interrupt()``
when the graph has a checkpointer (``ThreadRun.wait_for_decisions()`` then gives the
``Command`` that resumes it) and blocks otherwise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.types import Command, interrupt
from pydantic import ConfigDict

from ..client import UndoLogClient
from ..decorator import DeclaredTool
from ..errors import Refused, refusal_as_tool_result
from ..session import Session
from ..tiers import ToolSpec, ToolTier
from . import _core
from ._core import Declaration

__all__ = [
    "APPROVAL",
    "ThreadRun",
    "UndologMiddleware",
    "UndologTool",
    "specs",
    "thread_session",
    "wrap_tool",
    "wrap_tools",
]

#: ``interrupt()`` values made by undolog carry ``{"undolog": APPROVAL, ...}``.
APPROVAL = "approval"

# How a call waiting for a reviewer waits: "auto" interrupts a graph that has a
# checkpointer and blocks otherwise; "block" always long-polls in place.
_HOLD_MODES = ("auto", "block")

_RUNNING = frozenset({"running", "awaiting_approval"})


class _ToolFailed(Exception):
    """The framework turned the tool's exception into an error message (handle_tool_errors):
    the effect failed, and the model reads that message."""


# -- declaring tools ------------------------------------------------------------------


def _parameters(tool: BaseTool) -> list[str]:
    """The arguments the model fills (injected ones such as ToolRuntime left out)."""
    return list(tool.tool_call_schema.model_json_schema().get("properties", {}))


def _declare(tool: BaseTool, declaration: Declaration, **options: Any) -> DeclaredTool:
    return _core.declare(tool.name, _parameters(tool), tool.description,
                         _core.options_for(declaration, **options))


def _as_tool(tool: BaseTool | Callable[..., Any]) -> BaseTool:
    if isinstance(tool, BaseTool):
        return tool
    if callable(tool):
        return StructuredTool.from_function(tool)
    raise TypeError(f"not a LangChain tool or a function: {tool!r}")


class UndologTool(BaseTool):
    """An existing tool with an undolog tier: same name, description and schema.

    Inside an undolog session each call takes its tier's path; outside one it is the
    wrapped tool. ``undolog_spec`` is its ``ToolSpec``: ``client.register(*tools)`` works.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool
    declared: Any  # DeclaredTool (not a pydantic type)
    hold: str = "auto"

    @property
    def undolog_spec(self) -> ToolSpec:
        return self.declared.spec

    def _model_args(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        names = set(_parameters(self.inner))
        return {k: v for k, v in kwargs.items() if k in names}

    def _run(self, *args: Any, config: RunnableConfig, run_manager: Any = None,
             **kwargs: Any) -> Any:
        child = _child_config(config, run_manager)
        try:
            return _core.call(self.declared, self._model_args(kwargs),
                              lambda: self.inner.invoke(kwargs, child), _on_hold(self.hold))
        except Refused as exc:
            return refusal_as_tool_result(exc)

    async def _arun(self, *args: Any, config: RunnableConfig, run_manager: Any = None,
                    **kwargs: Any) -> Any:
        child = _child_config(config, run_manager)
        try:
            return await _core.acall(self.declared, self._model_args(kwargs),
                                     lambda: self.inner.ainvoke(kwargs, child),
                                     _on_hold(self.hold))
        except Refused as exc:
            return refusal_as_tool_result(exc)


def _child_config(config: RunnableConfig, run_manager: Any) -> RunnableConfig:
    if run_manager is None:
        return config
    return {**config, "callbacks": run_manager.get_child()}


def wrap_tool(tool: BaseTool | Callable[..., Any], tier: ToolTier | str | None = None, *,
              declaration: Mapping[str, Any] | None = None, hold: str = "auto",
              **options: Any) -> UndologTool:
    """``tool`` with an undolog tier. ``options`` are ``@undolog_tool``'s: ``compensation``
    (COMPENSABLE), ``reason`` (IRREVERSIBLE), ``cost_weight``... or pass them all as
    ``declaration``. Mistakes raise ``ValueError`` here, as with ``@undolog_tool``.
    """
    if hold not in _HOLD_MODES:
        raise ValueError(f"hold must be one of {_HOLD_MODES}")
    base = _as_tool(tool)
    if isinstance(base, UndologTool):
        raise ValueError(f"{base.name} is already wrapped")
    if declaration is None and tier is None:
        raise ValueError(f"{base.name}: give a tier (or a declaration)")
    declared = _declare(base, declaration if declaration is not None else tier, **options)
    return UndologTool(name=base.name, description=base.description,
                       args_schema=base.args_schema, return_direct=base.return_direct,
                       response_format=base.response_format, inner=base, declared=declared,
                       hold=hold)


def wrap_tools(tools: Iterable[BaseTool | Callable[..., Any]],
               tiers: Mapping[str, Declaration], *, default: Declaration | None = None,
               hold: str = "auto") -> list[UndologTool]:
    """Wrap each tool with the declaration ``tiers`` gives for its name.

    A tool the mapping leaves out takes ``default``; without one it is an error, so that
    no tool reaches the world undeclared.
    """
    wrapped = []
    known = set()
    for tool in tools:
        base = _as_tool(tool)
        known.add(base.name)
        declaration = tiers.get(base.name, default)
        if declaration is None:
            raise ValueError(f"no tier for tool {base.name!r}: add it to tiers or pass default=")
        wrapped.append(wrap_tool(base, declaration=_core.options_for(declaration), hold=hold))
    unknown = sorted(set(tiers) - known)
    if unknown:
        raise ValueError(f"tiers names tools that are not given: {unknown}")
    return wrapped


def specs(tools: Iterable[Any]) -> list[ToolSpec]:
    """The ``ToolSpec`` of wrapped tools, for ``client.register(*specs(tools))``."""
    return [t.undolog_spec for t in tools]


# -- the middleware -------------------------------------------------------------------


class UndologMiddleware(AgentMiddleware):
    """``create_agent(model, tools, middleware=[UndologMiddleware(tiers)])``.

    ``tiers`` maps each tool name to a tier or ``@undolog_tool`` options; a tool left out
    takes ``default``, and without one its call fails (ValueError) before it runs. Tools
    already wrapped with ``wrap_tool`` pass through (they do their own interception).
    ``specs(tools)`` gives the ``ToolSpec`` s to register.
    """

    def __init__(self, tiers: Mapping[str, Declaration], *, default: Declaration | None = None,
                 hold: str = "auto") -> None:
        super().__init__()
        if hold not in _HOLD_MODES:
            raise ValueError(f"hold must be one of {_HOLD_MODES}")
        self.tiers = dict(tiers)
        self.default = default
        self.hold = hold
        self._declared: dict[str, DeclaredTool] = {}
        self._lock = threading.Lock()

    def specs(self, tools: Iterable[BaseTool | Callable[..., Any]]) -> list[ToolSpec]:
        """The ``ToolSpec`` of each tool as this middleware declares it."""
        return [self._tool_for(_as_tool(t).name, _as_tool(t)).spec for t in tools]

    def _tool_for(self, name: str, tool: BaseTool | None) -> DeclaredTool:
        with self._lock:
            declared = self._declared.get(name)
            if declared is None:
                declaration = self.tiers.get(name, self.default)
                if declaration is None:
                    raise ValueError(f"UndologMiddleware has no tier for tool {name!r}")
                parameters = _parameters(tool) if tool is not None else None
                description = tool.description if tool is not None else ""
                declared = _core.declare(name, parameters, description,
                                         _core.options_for(declaration))
                self._declared[name] = declared
            return declared

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        if isinstance(request.tool, UndologTool):
            return handler(request)
        call = request.tool_call
        declared = self._tool_for(call["name"], request.tool)
        ran: list[Any] = []
        try:
            result = _core.call(declared, dict(call.get("args") or {}),
                                lambda: _content(handler(request), ran), _on_hold(self.hold))
        except Refused as exc:
            return _message(call, refusal_as_tool_result(exc), declared.name)
        except _ToolFailed:
            return ran[0]
        return ran[0] if ran else _message(call, result, declared.name)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        if isinstance(request.tool, UndologTool):
            return await handler(request)
        call = request.tool_call
        declared = self._tool_for(call["name"], request.tool)
        ran: list[Any] = []

        async def run() -> Any:
            return _content(await handler(request), ran)

        try:
            result = await _core.acall(declared, dict(call.get("args") or {}), run,
                                       _on_hold(self.hold))
        except Refused as exc:
            return _message(call, refusal_as_tool_result(exc), declared.name)
        except _ToolFailed:
            return ran[0]
        return ran[0] if ran else _message(call, result, declared.name)


def _content(outcome: Any, ran: list[Any]) -> Any:
    """What is committed for a tool call the framework ran: the ToolMessage's content."""
    ran.append(outcome)
    if not isinstance(outcome, ToolMessage):
        raise TypeError("undolog records a tool's ToolMessage; tools returning a Command "
                        "are not supported")
    if outcome.status == "error":
        raise _ToolFailed(str(outcome.content))
    return outcome.content


def _message(call: Mapping[str, Any], content: Any, name: str) -> ToolMessage:
    if not isinstance(content, (str, list)):
        content = str(content)
    return ToolMessage(content=content, tool_call_id=call.get("id") or "", name=name)


# -- waiting for a reviewer -----------------------------------------------------------


def _on_hold(mode: str) -> _core.OnHold | None:
    """LangGraph's ``interrupt()`` for a call that must wait, if the graph can resume."""
    if mode == "block" or not _has_checkpointer():
        return None

    def hold(answer: Mapping[str, Any]) -> None:
        effect = answer.get("effect") or {}
        approval = answer.get("approval") or {}
        # The first time, this raises GraphInterrupt and the graph pauses at a checkpoint.
        # Resumed early (before the decision), it returns and the call waits in place.
        interrupt({"undolog": APPROVAL, "effect_id": effect.get("id"),
                   "tool": effect.get("tool"), "args": effect.get("args"),
                   "approval_id": approval.get("id"), "timeout_at": approval.get("timeout_at")})

    return hold


def _has_checkpointer() -> bool:
    try:
        from langgraph.config import get_config

        configurable = get_config().get("configurable") or {}
    except RuntimeError:  # not inside a graph
        return False
    return bool(configurable.get("__pregel_checkpointer"))


# -- a LangGraph run is an undolog session ----------------------------------------------


class ThreadRun:
    """One run of a graph on one thread, as one undolog session (``thread_session``).

    Pass ``run.config`` to ``invoke``/``stream``: it carries the session id into the
    checkpoints. After the block, ``run.interrupted`` says whether the graph paused (the
    session stays running), and ``run.approvals`` lists the calls waiting for a reviewer.
    """

    def __init__(self, client: UndoLogClient, graph: Any, config: RunnableConfig, *,
                 agent: str | None, metadata: Mapping[str, Any] | None,
                 options: Mapping[str, Any]) -> None:
        configurable = config.get("configurable") or {}
        self.thread_id = configurable.get("thread_id")
        self.client = client
        self.graph = graph
        self.base_config = config
        self.agent = agent
        self.metadata = dict(metadata or {})
        self.options = dict(options)
        self.session: Session | None = None
        self.config: RunnableConfig = config
        self.interrupted = False
        self.approvals: list[dict[str, Any]] = []
        self.interrupts: Sequence[Any] = ()
        self._resumed = False

    @property
    def resumed(self) -> bool:
        return self._resumed

    # -- finding the thread's session ---------------------------------------------------

    def _session_of(self, snapshot: Any, state_of: Callable[[str], Mapping[str, Any]]) -> Session:
        previous = ((snapshot.metadata or {}).get("undolog_session")
                    if snapshot is not None else None)
        self._resumed = False
        if previous and state_of(previous).get("state") in _RUNNING:
            self._resumed = True
            return self.client.resume_session(previous, **self.options)
        metadata = {**self.metadata}
        if self.thread_id is not None:
            metadata.setdefault("thread_id", str(self.thread_id))
        return self.client.session(agent=self.agent, metadata=metadata, **self.options)

    def _opened(self, session: Session) -> None:
        self.session = session
        self.config = {**self.base_config,
                       "metadata": {**(self.base_config.get("metadata") or {}),
                                    "undolog_session": str(session.id)}}

    def _paused(self, snapshot: Any) -> bool:
        self.interrupts = tuple(snapshot.interrupts) if snapshot is not None else ()
        self.approvals = [dict(i.value) for i in self.interrupts
                          if isinstance(i.value, Mapping) and i.value.get("undolog") == APPROVAL]
        return bool(self.interrupts)

    def _has_checkpointer(self) -> bool:
        return bool(getattr(self.graph, "checkpointer", None))

    # -- sync ------------------------------------------------------------------------

    def __enter__(self) -> ThreadRun:
        snapshot = self.graph.get_state(self.base_config) if self._has_checkpointer() else None
        session = self._session_of(snapshot, self.client.get_session)
        session.__enter__()
        self._opened(session)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        assert self.session is not None
        if exc is None and self._has_checkpointer() and \
                self._paused(self.graph.get_state(self.base_config)):
            self._leave_running()
            return
        self.session.__exit__(exc_type, exc, tb)

    def wait_for_decisions(self, timeout: float | None = None) -> Command:
        """Block until a reviewer decided each held call; the ``Command`` that resumes
        the graph (``graph.invoke(run.wait_for_decisions(), run.config)`` in a new
        ``thread_session`` block)."""
        decisions = {}
        for interrupt_ in self.interrupts:
            value = interrupt_.value
            if isinstance(value, Mapping) and value.get("undolog") == APPROVAL:
                effect = _core.wait_for_decision(self.client, str(value["effect_id"]), timeout)
                decisions[interrupt_.id] = effect.get("state")
        return _resume(decisions)

    # -- async -----------------------------------------------------------------------

    async def __aenter__(self) -> ThreadRun:
        snapshot = (await self.graph.aget_state(self.base_config)
                    if self._has_checkpointer() else None)
        previous = ((snapshot.metadata or {}).get("undolog_session")
                    if snapshot is not None else None)
        state = (await self.client.aget_session(previous)) if previous else {}
        session = self._session_of(snapshot, lambda _sid: state)
        await session.__aenter__()
        self._opened(session)
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        assert self.session is not None
        if exc is None and self._has_checkpointer() and \
                self._paused(await self.graph.aget_state(self.base_config)):
            self._leave_running()
            return
        await self.session.__aexit__(exc_type, exc, tb)

    async def await_decisions(self, timeout: float | None = None) -> Command:
        """Async twin of ``wait_for_decisions``."""
        decisions = {}
        for interrupt_ in self.interrupts:
            value = interrupt_.value
            if isinstance(value, Mapping) and value.get("undolog") == APPROVAL:
                effect = await _core.await_decision(self.client, str(value["effect_id"]),
                                                    timeout)
                decisions[interrupt_.id] = effect.get("state")
        return _resume(decisions)

    def _leave_running(self) -> None:
        """The graph paused (an interrupt): the run is not over, so the session is neither
        completed nor failed; the next ``thread_session`` on this thread resumes it."""
        assert self.session is not None
        self.interrupted = True
        self.session._deactivate()


def _resume(decisions: Mapping[str, Any]) -> Command:
    if not decisions:
        raise ValueError("the graph is not waiting for an undolog approval")
    return Command(resume=dict(decisions))


def thread_session(client: UndoLogClient, graph: Any, config: RunnableConfig, *,
                   agent: str | None = None, metadata: Mapping[str, Any] | None = None,
                   **options: Any) -> ThreadRun:
    """``with thread_session(client, graph, config, agent="cleanup") as run:
    graph.invoke(inputs, run.config)`` (or ``async with`` and ``ainvoke``).

    A new run of the thread opens a session (metadata ``thread_id``); a thread whose last
    checkpoint belongs to a session still running (a crash, an interrupt) resumes that
    session, so the calls it committed replay. ``options`` are ``client.session``'s.
    """
    return ThreadRun(client, graph, config, agent=agent, metadata=metadata, options=options)

