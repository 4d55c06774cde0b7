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
  the session, which rolls it back. Each checkpoint also records the run's step, so a
  thread resumed from an earlier checkpoint (time travel, a fork) rewinds the run to that
  step before the graph goes on (``_timetravel.py``).

A refused call (budget, rejection, expiry, a suspended agent) is not an exception here:
the model reads ``refusal_as_tool_result``'s text as the tool's output, and can plan
around it. A call a reviewer edited before approving runs with the edited args, and its
ToolMessage starts with a note saying so. An IRREVERSIBLE call waiting for a reviewer uses
LangGraph's ``interrupt()`` when the graph has a checkpointer
(``ThreadRun.wait_for_decisions()`` then gives the ``Command`` that resumes it) and blocks
otherwise.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.types import Command, interrupt
from pydantic import ConfigDict

from .._http import Call
from ..client import UndoLogClient
from ..decorator import DeclaredTool
from ..errors import (
    ApprovalExpired,
    ApprovalRejected,
    Refused,
    RewindRefused,
    SessionAwaitingApproval,
    refusal_as_tool_result,
)
from ..session import Session, _decision
from ..tiers import ToolSpec, ToolTier
from . import _core, _timetravel
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
_ROLLED_BACK = frozenset({"failed", "compensating", "compensated", "compensation_failed"})
# LangGraph lends a parent graph's checkpointer to its subgraphs through this config key; a
# thread_session lends the graph its own checkpointer, stamping (_timetravel.StampingSaver).
_CHECKPOINTER_KEY = "__pregel_checkpointer"


class _HeldBehind(Refused):
    """With interrupts, a model's parallel calls are not serialized past a pause: the first
    held call pauses the graph, and a sibling that reaches the server meanwhile is told to
    call again (it is answered 409 session_awaiting_approval; nothing ran)."""

    default_code = "session_awaiting_approval"


_HELD_BEHIND = ("Another call of this run is waiting for a reviewer; this call was not "
                "executed. Call it again once that call is decided.")


def _refusal_text(exc: Refused) -> str:
    return exc.message if isinstance(exc, _HeldBehind) else refusal_as_tool_result(exc)


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
    model_args: frozenset[str] = frozenset()  # computed once: a JSON schema costs ~100 µs

    @property
    def undolog_spec(self) -> ToolSpec:
        return self.declared.spec

    def _model_args(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in kwargs.items() if k in self.model_args}

    def _input(self, kwargs: Mapping[str, Any], args: Mapping[str, Any]) -> dict[str, Any]:
        """The inner tool's input: ``args`` (the model's, or a reviewer's edit, which the
        inner tool's schema validates) plus what the framework injected (ToolRuntime...)."""
        return {**{k: v for k, v in kwargs.items() if k not in self.model_args}, **args}

    def _run(self, *args: Any, config: RunnableConfig, run_manager: Any = None,
             **kwargs: Any) -> Any:
        child, kept = _child_config(config, run_manager), _Artifact(self._with_artifact)

        def run(use: dict[str, Any]) -> Any:
            return kept.content_of(self.inner.invoke(self._inner_input(kwargs, use), child))

        try:
            outcome = _call(self.declared, self._model_args(kwargs), run, self.hold)
        except Refused as exc:
            return self._answer(_refusal_text(exc), None)
        return self._answer(_noted(outcome.result, outcome.edited), kept.value)

    async def _arun(self, *args: Any, config: RunnableConfig, run_manager: Any = None,
                    **kwargs: Any) -> Any:
        child, kept = _child_config(config, run_manager), _Artifact(self._with_artifact)

        async def run(use: dict[str, Any]) -> Any:
            return kept.content_of(await self.inner.ainvoke(self._inner_input(kwargs, use), child))

        try:
            outcome = await _acall(self.declared, self._model_args(kwargs), run, self.hold)
        except Refused as exc:
            return self._answer(_refusal_text(exc), None)
        return self._answer(_noted(outcome.result, outcome.edited), kept.value)

    # A tool with response_format="content_and_artifact" answers (content, artifact): the model
    # reads the content, the artifact (raw output, maybe not JSON at all) goes to the rest of the
    # graph. Invoked with plain args, LangChain hands back only the content, so the inner tool is
    # invoked as a tool call and its ToolMessage carries both. What is committed (and replayed)
    # is the content, the part the model read; a replay has no artifact (None).

    @property
    def _with_artifact(self) -> bool:
        return self.response_format == "content_and_artifact"

    def _inner_input(self, kwargs: Mapping[str, Any], args: Mapping[str, Any]) -> dict[str, Any]:
        """The inner tool's input; a tool call when it answers an artifact too."""
        if not self._with_artifact:
            return self._input(kwargs, args)
        return {"type": "tool_call", "name": self.inner.name, "args": self._input(kwargs, args),
                "id": f"undolog-{uuid.uuid4().hex}"}

    def _answer(self, content: Any, artifact: Any) -> Any:
        return (content, artifact) if self._with_artifact else content


class _Artifact:
    """The artifact of the one call that ran (none for a replay or a refusal); a tool without
    one answers its content directly, which passes through."""

    def __init__(self, wanted: bool) -> None:
        self.wanted, self.value = wanted, None

    def content_of(self, message: Any) -> Any:
        if not self.wanted:
            return message
        if not isinstance(message, ToolMessage):
            raise TypeError(f"a content_and_artifact tool answered {type(message).__name__}, "
                            "not a ToolMessage")
        self.value = message.artifact
        return message.content


def _call(declared: DeclaredTool, args: dict[str, Any], run: _core.Run,
          hold: str) -> _core.Outcome:
    refused = _decided_refusal(declared.name, args)
    if refused is not None:
        raise refused
    on_hold = _on_hold(hold)
    try:
        return _core.call(declared, args, run, on_hold)
    except SessionAwaitingApproval as exc:
        if on_hold is None:
            raise
        raise _HeldBehind(_HELD_BEHIND, body=exc.body) from exc


async def _acall(declared: DeclaredTool, args: dict[str, Any],
                 run: Callable[[dict[str, Any]], Awaitable[Any]], hold: str) -> _core.Outcome:
    refused = _decided_refusal(declared.name, args)
    if refused is not None:
        raise refused
    on_hold = _on_hold(hold)
    try:
        return await _core.acall(declared, args, run, on_hold)
    except SessionAwaitingApproval as exc:
        if on_hold is None:
            raise
        raise _HeldBehind(_HELD_BEHIND, body=exc.body) from exc


def _child_config(config: RunnableConfig, run_manager: Any) -> RunnableConfig:
    if run_manager is None:
        return config
    return {**config, "callbacks": run_manager.get_child()}


def wrap_tool(tool: BaseTool | Callable[..., Any], tier: ToolTier | str | None = None, *,
              declaration: Mapping[str, Any] | None = None, hold: str = "auto",
              **options: Any) -> UndologTool:
    """``tool`` with an undolog tier. ``options`` are ``@undolog_tool``'s: ``compensation``
    (COMPENSABLE), ``reason`` (IRREVERSIBLE), ``cost_weight``, ``labels`` and
    ``untrusted_fields`` (run-aware rules: the output of a SAFE tool labelled ``untrusted`` is
    reported, so ``tainted()`` sees what it carried)... or pass them all as ``declaration``.
    Mistakes raise ``ValueError`` here, as with ``@undolog_tool``.
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
                       hold=hold, model_args=frozenset(_parameters(base)))


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
                 hold: str = "auto",
                 on_refused: Callable[[Mapping[str, Any], Refused], None] | None = None) -> None:
        super().__init__()
        if hold not in _HOLD_MODES:
            raise ValueError(f"hold must be one of {_HOLD_MODES}")
        self.tiers = dict(tiers)
        self.default = default
        self.hold = hold
        self.on_refused = on_refused
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
        args = dict(call.get("args") or {})
        ran: dict[str, Any] = {}
        try:
            outcome = _call(declared, args,
                            lambda use: _content(handler(_with_args(request, args, use)), ran, use),
                            self.hold)
        except Refused as exc:
            return self._refused(call, exc, declared.name)
        except _ToolFailed:
            return _ran(ran, args)
        return _ran(ran, args) if ran else _replayed(call, outcome, declared.name)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        if isinstance(request.tool, UndologTool):
            return await handler(request)
        call = request.tool_call
        declared = self._tool_for(call["name"], request.tool)
        args = dict(call.get("args") or {})
        ran: dict[str, Any] = {}

        async def run(use: dict[str, Any]) -> Any:
            return _content(await handler(_with_args(request, args, use)), ran, use)

        try:
            outcome = await _acall(declared, args, run, self.hold)
        except Refused as exc:
            return self._refused(call, exc, declared.name)
        except _ToolFailed:
            return _ran(ran, args)
        return _ran(ran, args) if ran else _replayed(call, outcome, declared.name)

    def _refused(self, call: Mapping[str, Any], exc: Refused, name: str) -> ToolMessage:
        if self.on_refused is not None:
            self.on_refused(call, exc)
        return _message(call, _refusal_text(exc), name)


def _with_args(request: Any, args: dict[str, Any], use: dict[str, Any]) -> Any:
    """The request as the framework handed it, or one whose tool call carries the args a
    reviewer edited before approving (the ToolNode validates and injects into those)."""
    if use == args:
        return request
    return request.override(tool_call={**request.tool_call, "args": use})


def _ran(ran: Mapping[str, Any], args: dict[str, Any]) -> Any:
    """The ToolMessage of the call the framework ran, saying so if it ran edited args."""
    message, used = ran["message"], ran["args"]
    if used == args:
        return message
    return message.model_copy(update={"content": _noted(message.content, used)})


def _replayed(call: Mapping[str, Any], outcome: _core.Outcome, name: str) -> ToolMessage:
    return _message(call, _noted(outcome.result, outcome.edited), name)


def _noted(content: Any, edited: Mapping[str, Any] | None) -> Any:
    """``content`` for the model, led by the note that a reviewer's edited args ran."""
    if edited is None:
        return content
    note = _core.edited_note(edited)
    if isinstance(content, list):  # content blocks
        return [{"type": "text", "text": note}, *content]
    if not isinstance(content, str):
        try:
            content = json.dumps(content, ensure_ascii=False)
        except (TypeError, ValueError):
            content = str(content)
    return f"{note}\n{content}"


def _content(outcome: Any, ran: dict[str, Any], used: dict[str, Any]) -> Any:
    """What is committed for a tool call the framework ran (with ``used``): the ToolMessage's
    content."""
    ran.update(message=outcome, args=used)
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

# Held calls a reviewer has refused, for the run that resumes the paused graph: LangGraph
# re-runs the tool, and the model must read the reviewer's reason. The server halts a
# run on a rejection, so asking it again would only say "not running".
_DECIDED: ContextVar[list[dict[str, Any]] | None] = ContextVar("undolog_decided", default=None)


def _decided_refusal(name: str, args: Mapping[str, Any]) -> Refused | None:
    decided = _DECIDED.get()
    for n, held in enumerate(decided or ()):
        if held["tool"] == name and held["args"] == args:
            decided.pop(n)
            effect, state = held["effect"], held["effect"].get("state")
            if state == "rejected":
                reason, reviewer = _decision({}, effect)
                return ApprovalRejected(reason=reason, reviewer=reviewer, body={"effect": effect})
            if state == "expired":
                return ApprovalExpired(f"{name}: the approval request expired before a decision; "
                                       "the call was not executed", body={"effect": effect})
            return None  # approved or run since: the server replays it
    return None


def _undolog_holds(interrupts: Iterable[Any]) -> list[dict[str, Any]]:
    return [dict(i.value) for i in interrupts
            if isinstance(i.value, Mapping) and i.value.get("undolog") == APPROVAL]


class ThreadRun:
    """One run of a graph on one thread, as one undolog session (``thread_session``).

    Pass ``run.config`` to ``invoke``/``stream``: it carries the session id and the run's
    step into the checkpoints. After the block, ``run.interrupted`` says whether the graph
    paused (the session stays running), and ``run.approvals`` lists the calls waiting for a
    reviewer. ``run.rewound`` is the rewind's answer (``to_undo``, ``left_done``,
    ``resumes_at``) when the thread was resumed from an earlier checkpoint, else None;
    ``run.taken_back`` the answers for the later runs of the thread it took back whole.
    """

    def __init__(self, client: UndoLogClient, graph: Any, config: RunnableConfig, *,
                 agent: str | None, metadata: Mapping[str, Any] | None,
                 options: Mapping[str, Any], leave_irreversible: bool = False) -> None:
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
        self.resumed = False
        self.interrupted = False
        self.approvals: list[dict[str, Any]] = []
        self.interrupts: Sequence[Any] = ()
        self.leave_irreversible = leave_irreversible
        self.travel: _timetravel.Travel | None = None
        self.rewound: dict[str, Any] | None = None
        self.taken_back: list[dict[str, Any]] = []  # later runs of the thread, rewound to 0
        self._token: Any = None

    # -- finding the thread's session ---------------------------------------------------

    def _previous(self, snapshot: Any) -> str | None:
        return (snapshot.metadata or {}).get("undolog_session") if snapshot is not None else None

    def _session_for(self, previous: str | None, state: str | None, paused: bool) -> Session:
        # A graph paused on a held call resumes its session whatever the session's state
        # (a rejection halts it: the model must still read why); otherwise only a session
        # still running is carried on (a crash), and a finished one gives way to a new run.
        if previous and (paused or state in _RUNNING):
            self.resumed = True
            return self.client.resume_session(previous, **self.options)
        metadata = {**self.metadata}
        if self.thread_id is not None:
            metadata.setdefault("thread_id", str(self.thread_id))
        return self.client.session(agent=self.agent, metadata=metadata, **self.options)

    def _opened(self, session: Session, decided: list[dict[str, Any]]) -> None:
        self.session = session
        self.config = {**self.base_config,
                       "metadata": {**(self.base_config.get("metadata") or {}),
                                    _timetravel.SESSION: str(session.id)}}
        saver = self._saver()
        if saver is not None:
            stamps = _timetravel.Stamps(*self._step_and_epoch(session))
            session._step_seen = stamps.saw_step
            lent = _timetravel.StampingSaver(saver, stamps)
            self.config["configurable"] = {**(self.base_config.get("configurable") or {}),
                                           _CHECKPOINTER_KEY: lent}
        self._token = _DECIDED.set(decided)

    def _step_and_epoch(self, session: Session) -> tuple[int, int]:
        """The run's step as the graph starts (after a rewind: the step it went back to) and
        its rewinds so far: what the checkpoints written in this block are stamped from."""
        if self.rewound is not None:
            epoch = (self.rewound.get("rewind") or {}).get("epoch") or 0
            return int(self.rewound["resumes_at"]), int(epoch)
        epochs = [int(r.get("epoch") or 0) for r in session.data.get("rewinds") or []]
        return int(session.data.get("step_index") or 0), max(epochs, default=0)

    def _saver(self) -> Any:
        saver = getattr(self.graph, "checkpointer", None)
        return saver if isinstance(saver, BaseCheckpointSaver) else None

    def _thread_config(self) -> RunnableConfig:
        """The thread's latest checkpoint, whatever checkpoint the block started from."""
        configurable = {k: v for k, v in (self.base_config.get("configurable") or {}).items()
                        if k != "checkpoint_id"}
        return {**self.base_config, "configurable": configurable}

    # -- going back: time travel ------------------------------------------------------

    def _back_to(self, info: Mapping[str, Any] | None) -> int | None:
        """The step to rewind the run to before the graph goes on, or None: the thread resumes
        from its newest checkpoint (a pause, a crash), or nothing was done after the step.
        Refused (``RewindRefused``) when the world cannot be brought back to the checkpoint."""
        travel = self.travel
        if travel is None or not travel.back or info is None:
            return None
        where = (f"checkpoint {travel.checkpoint} of thread {self.thread_id} (step {travel.step} "
                 f"of run {travel.session})")
        gone = [r for r in info.get("rewinds") or []
                if int(r.get("epoch") or 0) > travel.epoch and int(r["to_step"]) < travel.step]
        if gone:
            raise RewindRefused(
                f"{where} is on a branch that a rewind to step {gone[0]['to_step']} left: its "
                "calls after that step were undone and cannot be redone. Resume from a checkpoint "
                "of the current branch.", code="branch_undone")
        if travel.step >= int(info.get("step_index") or 0):
            return None
        if info.get("state") in _ROLLED_BACK:
            state = info.get("state")
            raise RewindRefused(f"{where}: the run was rolled back ({state}); its calls up to "
                                "that step were undone too and cannot be redone.",
                                code="run_rolled_back")
        return travel.step

    def _reason(self) -> str:
        assert self.travel is not None
        return (f"LangGraph: thread {self.thread_id} resumed from checkpoint "
                f"{self.travel.checkpoint}, which had reached step {self.travel.step}")

    def _take_back(self, info: Mapping[str, Any]) -> Session | None:
        """A later run of the thread (a later turn of the conversation), to be taken back whole
        before the thread goes back: a session to rewind to step 0 and complete, or None when
        nothing of it is left in the world. A halted run cannot be rewound: refused."""
        state, run = info.get("state"), info.get("id")
        if state in _ROLLED_BACK or not int(info.get("step_index") or 0):
            return None
        if state == "halted":
            raise RewindRefused(
                f"Run {run}, a later run of thread {self.thread_id}, was halted by a reviewer and "
                "cannot be rewound: going back before it would leave its calls done. Resume from a "
                "checkpoint after it.", code="rewind_across_runs")
        return self.client.resume_session(str(run), **self.options)

    def _later(self) -> tuple[str, ...]:
        return self.travel.later if self.travel is not None and self.travel.back else ()

    def _preview(self, run: Any, step: int) -> dict[str, Any]:
        return self.client._http.send(Call("GET", f"/api/v1/sessions/{run}/rewind",
                                           params={"to_step": step}))

    async def _apreview(self, run: Any, step: int) -> dict[str, Any]:
        return await self.client._http.asend(Call("GET", f"/api/v1/sessions/{run}/rewind",
                                                  params={"to_step": step}))

    def _refuse_in_the_way(self, previews: list[tuple[Any, Mapping[str, Any]]]) -> None:
        """Going back across runs rewinds several: refused before any of them is, when an
        irreversible call of any stands in the way (the server's own 409 covers one run)."""
        found = [{**item, "session": str(run)} for run, preview in previews
                 for item in preview.get("irreversible_in_the_way") or []]
        if found:
            names = ", ".join(f"{i['tool']} at step {i['step_index']} of run {i['session']}"
                              for i in found)
            raise RewindRefused(f"Irreversible calls after checkpoint {self.travel.checkpoint} "
                                f"cannot be undone: {names}. Go back with leave_irreversible to "
                                "leave them done.", code="irreversible_in_the_way",
                                status=409, body={"irreversible": found})

    def _later_reason(self) -> str:
        assert self.travel is not None
        return (f"LangGraph: thread {self.thread_id} went back to checkpoint "
                f"{self.travel.checkpoint} of an earlier run ({self.travel.session})")

    def _closed(self, snapshot: Any) -> bool:
        """Whether the graph paused (any interrupt: the run is not over)."""
        _DECIDED.reset(self._token)
        self.interrupts = tuple(snapshot.interrupts) if snapshot is not None else ()
        self.approvals = _undolog_holds(self.interrupts)
        return bool(self.interrupts)

    def _has_checkpointer(self) -> bool:
        return bool(getattr(self.graph, "checkpointer", None))

    # -- sync ------------------------------------------------------------------------

    def __enter__(self) -> ThreadRun:
        """1. Read the checkpoint the graph resumes from, and where it stands (``_timetravel``).
        2. Time travel to a step the run has gone past: resume that run and rewind it there
           (the walk undoes the later calls, newest first) before the graph goes on.
        3. Otherwise as before: resume the run of a paused or crashed thread, or open a new one.
        """
        snapshot = self.graph.get_state(self.base_config) if self._has_checkpointer() else None
        saver = self._saver()
        self.travel = _timetravel.resolve(saver, self.base_config) if saver is not None else None
        info = (self.client.get_session(self.travel.session)
                if self.travel and self.travel.back else None)
        back = self._back_to(info)
        later = [self._take_back(self.client.get_session(run)) for run in self._later()]
        later = [run for run in later if run is not None]
        if later and not self.leave_irreversible:  # nothing is undone if anything is in the way
            self._refuse_in_the_way([(run.id, self._preview(run.id, 0)) for run in later]
                                    + ([(self.travel.session,
                                         self._preview(self.travel.session, back))]
                                       if back is not None else []))
        for run in later:  # rewound to its start, then completed
            run.__enter__()
            try:
                self.taken_back.append(run.rewind(0, reason=self._later_reason(),
                                                  leave_irreversible=self.leave_irreversible))
            except BaseException:
                run._deactivate()
                raise
            run.__exit__(None, None, None)
        previous = self.travel.session if self.travel else self._previous(snapshot)
        holds = _undolog_holds(snapshot.interrupts) if snapshot is not None and back is None else []
        state = ((info or self.client.get_session(previous)).get("state")
                 if previous and not holds and back is None else None)
        decided = [{**h, "effect": self.client.get_effect(str(h["effect_id"]))} for h in holds]
        if back is not None:
            session = self.client.resume_session(previous, **self.options)
            self.resumed = True
            session.__enter__()
            try:
                self.rewound = session.rewind(back, reason=self._reason(),
                                              leave_irreversible=self.leave_irreversible)
            except BaseException:
                session._deactivate()  # the graph did not run: the run stays as it was
                raise
        else:
            session = self._session_for(previous, state, bool(holds))
            session.__enter__()
        self._opened(session, decided)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        assert self.session is not None
        snapshot = (self.graph.get_state(self._thread_config())
                    if exc is None and self._has_checkpointer() else None)
        if self._closed(snapshot):
            self._leave_running()
            return
        self.session.__exit__(exc_type, exc, tb)

    def wait_for_decisions(self, timeout: float | None = None) -> Command:
        """Block until a reviewer decided each held call; the ``Command`` that resumes
        the graph (``graph.invoke(run.wait_for_decisions(), next_run.config)`` in a new
        ``thread_session`` block on the same thread)."""
        return _resume({i.id: _core.wait_for_decision(self.client, str(i.value["effect_id"]),
                                                      timeout)
                        for i in self.interrupts if _is_hold(i)})

    # -- async -----------------------------------------------------------------------

    async def __aenter__(self) -> ThreadRun:
        """Async twin of ``__enter__``."""
        snapshot = (await self.graph.aget_state(self.base_config)
                    if self._has_checkpointer() else None)
        saver = self._saver()
        self.travel = (await _timetravel.aresolve(saver, self.base_config)
                       if saver is not None else None)
        info = (await self.client.aget_session(self.travel.session)
                if self.travel and self.travel.back else None)
        back = self._back_to(info)
        later = [self._take_back(await self.client.aget_session(run)) for run in self._later()]
        later = [run for run in later if run is not None]
        if later and not self.leave_irreversible:
            self._refuse_in_the_way([(run.id, await self._apreview(run.id, 0)) for run in later]
                                    + ([(self.travel.session,
                                         await self._apreview(self.travel.session, back))]
                                       if back is not None else []))
        for run in later:
            await run.__aenter__()
            try:
                self.taken_back.append(await run.arewind(
                    0, reason=self._later_reason(), leave_irreversible=self.leave_irreversible))
            except BaseException:
                run._deactivate()
                raise
            await run.__aexit__(None, None, None)
        previous = self.travel.session if self.travel else self._previous(snapshot)
        holds = _undolog_holds(snapshot.interrupts) if snapshot is not None and back is None else []
        state = ((info or await self.client.aget_session(previous)).get("state")
                 if previous and not holds and back is None else None)
        decided = [{**h, "effect": await self.client.aget_effect(str(h["effect_id"]))}
                   for h in holds]
        if back is not None:
            session = self.client.resume_session(previous, **self.options)
            self.resumed = True
            await session.__aenter__()
            try:
                self.rewound = await session.arewind(back, reason=self._reason(),
                                                     leave_irreversible=self.leave_irreversible)
            except BaseException:
                session._deactivate()
                raise
        else:
            session = self._session_for(previous, state, bool(holds))
            await session.__aenter__()
        self._opened(session, decided)
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        assert self.session is not None
        snapshot = (await self.graph.aget_state(self._thread_config())
                    if exc is None and self._has_checkpointer() else None)
        if self._closed(snapshot):
            self._leave_running()
            return
        await self.session.__aexit__(exc_type, exc, tb)

    async def await_decisions(self, timeout: float | None = None) -> Command:
        """Async twin of ``wait_for_decisions``."""
        return _resume({i.id: await _core.await_decision(self.client, str(i.value["effect_id"]),
                                                         timeout)
                        for i in self.interrupts if _is_hold(i)})

    def _leave_running(self) -> None:
        """The graph paused (an interrupt): the run is not over, so the session is neither
        completed nor failed; the next ``thread_session`` on this thread resumes it."""
        assert self.session is not None
        self.interrupted = True
        self.session._deactivate()


def _is_hold(interrupt_: Any) -> bool:
    return isinstance(interrupt_.value, Mapping) and interrupt_.value.get("undolog") == APPROVAL


def _resume(decisions: Mapping[str, Mapping[str, Any]]) -> Command:
    """Resume values: each held call's effect as the reviewer left it (its ``state``)."""
    if not decisions:
        raise ValueError("the graph is not waiting for an undolog approval")
    return Command(resume={i: {"undolog": "decision", "effect_id": e.get("id"),
                               "state": e.get("state")} for i, e in decisions.items()})


def thread_session(client: UndoLogClient, graph: Any, config: RunnableConfig, *,
                   agent: str | None = None, metadata: Mapping[str, Any] | None = None,
                   leave_irreversible: bool = False, **options: Any) -> ThreadRun:
    """``with thread_session(client, graph, config, agent="cleanup") as run:
    graph.invoke(inputs, run.config)`` (or ``async with`` and ``ainvoke``).

    A new run of the thread opens a session (metadata ``thread_id``); a thread whose last
    checkpoint belongs to a session still running (a crash) or to a graph paused on a held
    call resumes that session, so the calls it committed replay. A thread resumed from an
    earlier checkpoint (``config`` naming a ``checkpoint_id`` of ``get_state_history``, or
    ``update_state``'s answer) rewinds its run to the step that checkpoint had reached
    (reopening it if it had completed) before the graph goes on: ``run.rewound`` says what was
    undone. Irreversible calls after that step refuse it (``RewindRefused`` naming them)
    unless ``leave_irreversible``. ``options`` are ``client.session``'s.
    """
    return ThreadRun(client, graph, config, agent=agent, metadata=metadata, options=options,
                     leave_irreversible=leave_irreversible)
