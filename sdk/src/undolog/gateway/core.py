"""The gateway's rules, transport-free: which upstream tool each exposed name reaches, its
tier, and what happens to one ``tools/call`` (the same flows as the SDK's decorated tools).

A *run* is one undolog session. Which run a call belongs to (``Gateway.run_of``):

- the ``undolog_run`` argument (or the ``Undolog-Run`` HTTP header), a handle minted by the
  ``undolog_start_run`` meta-tool: the explicit state handle of MCP 2026-07-28, which has no
  session (SEP-2567). The handle is the undolog session id; the server records which client
  started the run (``metadata.client``), and a client naming another's run is refused;
- else the transport's own conversation: the one stdio client, or a legacy (2025-11-25) MCP
  session id. Such a run is opened by the first call that reaches the server and completed
  when the client disconnects cleanly;
- else (stateless HTTP, no handle) nothing: the call is refused with a message saying how to
  start a run, never merged into another client's run.

A handle's run lives in the undolog server, not in this process: any gateway replica serves
it (its step indexes are milliseconds since the run started, so replicas number calls in one
order without asking the server, and its SAFE calls are reported right after they ran).
SAFE calls never wait on undolog: they are forwarded at once. Every outcome the model must read
is a tool result with ``isError`` and the message as text.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import anyio

from .._http import Call, Http
from ..client import _compensation_call
from ..compensations import aclaim, arun_one
from ..decorator import DeclaredTool
from ..errors import (
    ApprovalWaitTimeout,
    EffectInFlight,
    Refused,
    SessionAwaitingApproval,
    UndoLogConnectionError,
    UndoLogError,
    refusal_as_tool_result,
)
from ..mcp import spec_for
from ..session import _NO_OUTPUT, Session
from ..tiers import ApprovalSpec, ToolSpec, ToolTier
from .config import GatewayConfig, ServerConfig
from .preimages import attach_pre_image, pre_image_runtimes, restorer
from .upstream import Upstream, UpstreamToolError, reported_value, result_value

__all__ = ["FAIL_RUN", "FINISH_RUN", "RUN_ARG", "START_RUN", "Caller", "Gateway", "Route"]

log = logging.getLogger("undolog.gateway")

FINISH_RUN = "undolog_finish_run"
FAIL_RUN = "undolog_fail_run"
START_RUN = "undolog_start_run"
SAVEPOINT = "undolog_savepoint"  # rewind (issue 41): name a step, go back to one
REWIND = "undolog_rewind"
META_TOOLS = (START_RUN, FINISH_RUN, FAIL_RUN, SAVEPOINT, REWIND)
RUN_ARG = "undolog_run"  # the run handle every exposed tool takes (stripped before the upstream)
# What the model reads about each of them: (name, description, input schema).
_META_TOOL_DECLARATIONS = (
    (
        START_RUN,
        "Start a run (one task of this conversation) and get its handle. Pass the "
        f"handle as {RUN_ARG} to every other tool call of this conversation: over "
        "stateless HTTP a call without it is refused. Call it once per conversation.",
        {"type": "object", "properties": {}},
    ),
    (
        FINISH_RUN,
        "Finish this run: everything done so far stands. Call it when the task is done.",
        {"type": "object", "properties": {}},
    ),
    (
        FAIL_RUN,
        "Fail this run and roll it back: every change it made that has an undo is "
        "undone, newest first. Give the reason.",
        {"type": "object", "properties": {"reason": {"type": "string"}}, "required": ["reason"]},
    ),
    (
        SAVEPOINT,
        f"Name this point of the run, to come back to it with {REWIND} if what follows goes wrong.",
        {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    ),
    (
        REWIND,
        "Go back to a savepoint (or a step number): every change made after it that has an undo "
        "is undone, newest first, and the run goes on from there. Forget what you did after it. "
        "Irreversible changes after it refuse the rewind, unless leave_irreversible is true.",
        {
            "type": "object",
            "properties": {
                "to": {"type": ["string", "integer"]},
                "reason": {"type": "string"},
                "leave_irreversible": {"type": "boolean"},
            },
            "required": ["to"],
        },
    ),
)
MAX_HANDLE_CHARS = 64
MAX_CACHED_RUNS = 10_000  # handle runs a replica remembers; a forgotten one is read again
# Upstream answers a gateway keeps to replay a repeated call exactly as it was first answered (a
# replay this process no longer holds is rebuilt from the stored result: `replayed_result`).
MAX_KEPT_ANSWERS = 256
# A handle run's SAFE calls are reported this long after the first of a burst: one request for
# the burst, and a replica killed meanwhile loses at most that long's SAFE counts.
SAFE_REPORT_AFTER_S = 0.1


@dataclass(frozen=True)
class Caller:
    """Who sent a request, and the conversation the transport knows it by.

    ``client``: the authenticated client's name (``local`` without client tokens, ``stdio``).
    ``conversation``: ``stdio``, ``http:<mcp-session-id>`` (legacy), or None (stateless HTTP).
    ``run_header``: the ``Undolog-Run`` header, when the client application carries the handle.
    """

    client: str
    conversation: str | None
    started_by: str | None = None
    run_header: str | None = None
    # What this request's access-log line says of it (the run it went to), filled in here.
    access: dict[str, Any] | None = dataclasses.field(default=None, compare=False, repr=False)


STDIO = Caller("stdio", "stdio")


class UpstreamConflict(ValueError):
    """undolog refused this gateway's registration: another gateway of the org gives one of these
    names to another upstream (the message says which, and how to tell them apart)."""


class Unattributed(Exception):
    """The call names no run this client may use; the message says what to do (nothing ran)."""
Progress = Callable[[float, float | None, str], Awaitable[None]]


@dataclass(frozen=True)
class Route:
    """An exposed tool: where it goes upstream and how undolog treats it."""

    exposed: str
    server: str
    upstream_name: str
    tool: Any  # the upstream's mcp Tool, as listed
    declared: DeclaredTool
    why: str

    @property
    def tier(self) -> ToolTier:
        return self.declared.spec.tier


def _upstream_placeholder(
    **arguments: Any,
) -> Any:  # the flows never call it: the gateway runs the upstream
    raise RuntimeError("not called")


class _Clock:
    """Step indexes of a run that several gateway replicas serve: milliseconds since the run
    started, strictly increasing here. Replicas agree on the order without asking the server (the
    undo stack is walked by step), so calls of one run spaced a millisecond or more apart never
    share a step; two at the very same millisecond on two replicas may (a SAFE one then counts
    once)."""

    def __init__(self, created: str | None, after: int) -> None:
        try:
            self._zero = datetime.fromisoformat(str(created)).timestamp()
        except ValueError:
            self._zero = time.time()
        self._last = after

    def __iter__(self) -> _Clock:
        return self

    def __next__(self) -> int:
        now = int((time.time() - self._zero) * 1000)
        self._last = min(max(self._last + 1, now), 2**31 - 1)
        return self._last


class Run:
    """The undolog session of one conversation, opened lazily by its first non-SAFE call (SAFE
    calls before it are kept and reported with that first request), or at once by
    ``undolog_start_run`` (a handle run)."""

    def __init__(self, gateway: Gateway, key: str | None, caller: Caller) -> None:
        self.gateway, self.key = gateway, key
        self.client = caller.client
        config = gateway.config
        self.session = Session(
            gateway.http,
            agent=gateway.agent,
            metadata={"via": "mcp-gateway", "client": caller.client},
            started_by=caller.started_by,
            approval_timeout=config.approval_wait_s,
            poll_wait=max(1.0, min(30.0, config.approval_wait_s)),
        )
        self.session._steps = itertools.count(1)  # step 0 is the run before any call (rewind)
        self.opened = False
        self.handle = False  # named by its handle: any replica may serve it
        self.shared = False  # a conversation's run whose handle was given out: another may use it
        self.over: str | None = None  # set when a reviewer or the server ended the run
        self._lock = anyio.Lock()
        self._flushing = False

    async def ensure_open(self) -> None:
        async with self._lock:
            if self.opened:
                return
            steps, safe = self.session._steps, self.session._safe
            self.session._open(await self.gateway.http.asend(self._open_call()))
            # A new session starts at step 0 on the server; keep the steps SAFE calls already took.
            self.session._steps, self.session._safe = steps, safe
            self.opened = True
            self.gateway.remember(self)

    def _open_call(self) -> Call:
        call = self.session._open_call()
        if call.method != "POST":
            return call
        return Call(call.method, call.path, {**call.body, "on_idle": self.gateway.config.on_idle})

    def adopt(self, data: dict[str, Any]) -> None:
        """Serve a handle run from the server's copy (``data``: its session), wherever it
        started."""
        self.session._apply(data)
        self.session._steps = _Clock(data.get("created"), int(data.get("step_index") or 0))
        self.opened = self.session.state in ("running", "awaiting_approval")
        self.handle = True
        if not self.opened:
            self.over = (
                f"This run is over ({self.session.state}); the tool call was not executed. "
                "Call undolog_start_run for a new run."
            )

    async def resume(self, session_id: str) -> bool:
        self.session = Session(
            self.gateway.http,
            session_id=session_id,
            approval_timeout=self.session.approval_timeout,
            poll_wait=self.session.poll_wait,
        )
        try:
            self.session._open(await self.gateway.http.asend(self.session._open_call()))
        except UndoLogError:
            return False
        self.opened = self.session.state in ("running", "awaiting_approval")
        return self.opened

    def record_safe(self, tool: str, args: dict[str, Any], output: Any = _NO_OUTPUT) -> None:
        """``output``: what a tool labelled ``untrusted`` answered (its fingerprints feed
        ``tainted()`` on the server, which keeps no text)."""
        self.session._record_safe(tool, args, output)
        shared = self.handle or self.shared
        if shared and self.gateway.background is not None and not self._flushing:
            # The run's next request may reach another replica, or none: report it now.
            self._flushing = True
            self.gateway.background.start_soon(self.flush_safe)

    async def flush_safe(self, after_s: float = SAFE_REPORT_AFTER_S) -> None:
        """Report the SAFE calls no request has carried yet (a handle run's, shortly after they
        ran: the SAFE calls of a burst share one request)."""
        await anyio.sleep(after_s)
        self._flushing = False
        safe = self.session._drain_safe()
        if not safe:
            return
        try:
            await self.gateway.http.asend(
                Call("POST", f"/api/v1/sessions/{self.session.id}/safe-calls", {"safe_calls": safe})
            )
        except UndoLogConnectionError:
            self.session._safe.extendleft(reversed(safe))  # the next request carries them
        except Exception as exc:  # a background task: an error here must not stop the server
            log.warning("SAFE calls of run %s not reported: %s", self.session.id, exc)

    async def end(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """``complete`` or ``fail`` the session (reporting the last SAFE calls)."""
        if not self.opened and not self.session._safe and verb == "complete" and not self.handle:
            return {}
        await self.ensure_open()
        answer = await self.session._adrive(self.session._finish(verb, body))
        self.session._apply(answer)
        self.gateway.forget(self)
        return answer


class Gateway:
    """Fronts the configured upstream servers; see the module docstring."""

    def __init__(self, config: GatewayConfig, http: Http | None = None) -> None:
        self.config = config
        self.http = http or Http(config.url, config.api_key)
        self.agent = config.agent or _env("UNDOLOG_AGENT")
        if not self.agent:
            raise ValueError(
                "the gateway needs an agent name: [undolog] agent = ... or $UNDOLOG_AGENT"
            )
        self.upstreams: dict[str, Upstream] = {}
        self.listed: dict[str, list[Any]] = {}
        self.routes: dict[str, Route] = {}
        self.runs: dict[str, Run] = {}  # conversation key or run handle -> its run
        self.clients: dict[
            str, Any
        ] = {}  # key -> the client's ServerSession, to say tools/list_changed
        self.background: Any = None  # a task group for work after an answer (set by the server)
        self._answers: OrderedDict[tuple[str, str, str], Any] = OrderedDict()
        self._listed_tools: tuple[dict[str, Route], list[Any]] | None = None
        self.compensators: dict[str, tuple[str, str]] = {
            comp.function_name(server.name): (comp.server or server.name, comp.tool)
            for server in config.servers
            for comp in _compensations(server)
            if comp.tool
        }
        # Tools undone by a pre-image (gateway/preimages.py): their runtimes, by restore function.
        self.pre_images = pre_image_runtimes(self)

    # -- start and tool table ----------------------------------------------------------

    async def start(self, stack: AsyncExitStack) -> None:
        """1. Connect every upstream. 2. List, tier and register their tools. 3. Resume the run a
        killed gateway left open (so a client's retry replays instead of running twice)."""
        for server in self.config.servers:
            upstream = Upstream(server, self._tools_changed)
            await upstream.connect(stack)
            self.upstreams[server.name] = upstream
        for name, upstream in self.upstreams.items():
            self.listed[name] = await upstream.list_tools()
        await self._register_compensations()
        await self._rebuild()
        await self._resume()

    async def _register_compensations(self) -> None:
        """Register each upstream-tool undo, and each pre-image's restore, as an agent function
        scoped to the upstream that runs it: only a gateway serving that upstream claims its
        entries. Another gateway of the org that gave another upstream the same name is refused
        here (409), and this one with it."""
        for fn_name, (server_name, _tool, _runtime) in self.pre_images.items():
            try:
                await self.http.asend(_compensation_call(
                    fn_name, "1.0.0", "agent", "", 5000, None, self._scope_of(server_name)))
            except UndoLogError as exc:
                if exc.code not in ("compensation_scope_conflict", "tool_scope_conflict"):
                    raise
                raise UpstreamConflict(f"[servers.{server_name}]: {exc}") from exc
        for server in self.config.servers:
            for comp in _compensations(server):
                if comp.tool:
                    name = comp.function_name(server.name)
                    try:
                        await self.http.asend(
                            _compensation_call(
                                name,
                                comp.fn_version,
                                "agent",
                                "",
                                5000,
                                comp.claim_timeout_s,
                                self._scope_of(comp.server or server.name),
                            )
                        )
                    except UndoLogError as exc:
                        if exc.code not in ("compensation_scope_conflict", "tool_scope_conflict"):
                            raise
                        raise UpstreamConflict(f"[servers.{server.name}]: {exc}") from exc

    def _scope_of(self, server: str) -> str:
        return next(s.scope for s in self.config.servers if s.name == server)

    def scopes(self) -> list[str]:
        """The upstreams whose undos this gateway runs (what its claims name)."""
        servers = [server for server, _ in self.compensators.values()]
        servers += [server for server, _tool, _runtime in self.pre_images.values()]
        return sorted({self._scope_of(server) for server in servers if server in self.upstreams})

    async def _rebuild(self) -> None:
        """Route every listed tool (prefixed by its server where two servers clash) and register
        them all with undolog in one request."""
        counts: dict[str, int] = {}
        for tools in self.listed.values():
            for tool in tools:
                counts[tool.name] = counts.get(tool.name, 0) + 1
        routes: dict[str, Route] = {}
        for server in self.config.servers:
            for tool in self.listed.get(server.name, []):
                exposed = (
                    tool.name
                    if counts[tool.name] == 1 and tool.name not in META_TOOLS
                    else f"{server.name}_{tool.name}"
                )
                spec, why = tier_tool(server, tool, exposed)
                declared = DeclaredTool(spec, _upstream_placeholder, None)
                spec, why = attach_pre_image(self, server, tool.name, declared, why)
                routes[exposed] = Route(exposed, server.name, tool.name, tool, declared, why)
        if routes:
            try:
                await self.http.asend(
                    Call(
                        "POST",
                        "/api/v1/tools",
                        {"tools": [r.declared.spec.to_dict() for r in routes.values()]},
                    )
                )
            except UndoLogError as exc:
                if exc.code != "tool_scope_conflict":
                    raise
                raise UpstreamConflict(str(exc)) from exc
        self.routes = routes

    async def _tools_changed(self, server: str) -> None:
        """An upstream said ``tools/list_changed``: list it again, register, tell our clients."""
        self.listed[server] = await self.upstreams[server].list_tools()
        await self._rebuild()
        for session in list(self.clients.values()):
            try:
                await session.send_tool_list_changed()
            except Exception as exc:  # a client that went away
                log.debug("could not tell a client about changed tools: %r", exc)

    def input_schema(self, name: str) -> Any:
        """The listed input schema of one exposed tool (None: no such tool)."""
        for tool in self.mcp_tools():
            if tool.name == name:
                return tool.input_schema
        return None

    def mcp_tools(self) -> list[Any]:
        """The tools as listed (rebuilt only when the routes change: every stateless call asks)."""
        if self._listed_tools is None or self._listed_tools[0] is not self.routes:
            self._listed_tools = (self.routes, self._build_tools())
        return self._listed_tools[1]

    def _build_tools(self) -> list[Any]:
        from mcp import types

        tools = [with_run_argument(dataclass_copy(route)) for route in self.routes.values()]
        for name, description, input_schema in _META_TOOL_DECLARATIONS:
            tool = types.Tool(name=name, description=description, input_schema=input_schema)
            # The start is the one call a stateless client makes before it has a handle.
            tools.append(tool if name == START_RUN else with_run_argument(tool))
        return tools

    # -- runs ----------------------------------------------------------------------------

    def run_for(self, key: str, caller: Caller = STDIO) -> Run:
        run = self.runs.get(key)
        if run is None:
            run = self.runs[key] = Run(self, key, caller)
        return run

    async def start_run(self, caller: Caller) -> Run:
        """``undolog_start_run``: a new run named by its handle (the undolog session id)."""
        run = Run(self, None, caller)
        await run.ensure_open()
        run.key, run.handle = run.session.id, True
        run.session._steps = _Clock(run.session.data.get("created"), 0)
        self._cache(run)
        return run

    async def bind_run(self, caller: Caller) -> tuple[Run, bool]:
        """The conversation's own run, opened now if it was not (True: it was not) and named by its
        handle too (one Run: a call naming the handle and one naming nothing number their steps in
        one order). A run a reviewer or the server ended gives way to a new one."""
        assert caller.conversation is not None
        run = self.run_for(caller.conversation, caller)
        if run.client != caller.client:
            raise Unattributed("This MCP session belongs to another client; the call was not run.")
        if run.over is not None:
            self.forget(run)
            run = self.run_for(caller.conversation, caller)
        fresh = not run.opened
        await run.ensure_open()
        if self.runs.get(run.session.id) is not run:
            # Steps as a handle run's (milliseconds since it started), so any replica the handle
            # reaches numbers calls in the same order as this one.
            last = next(run.session._steps)
            run.session._steps = _Clock(run.session.data.get("created"), last)
            run.shared = True  # its SAFE calls reported right after they ran, as a handle run's
            self.runs[run.session.id] = run
        return run, fresh

    async def run_of(self, caller: Caller, handle: Any) -> Run:
        """The run a call belongs to (see the module docstring); raises Unattributed."""
        if caller.run_header is not None:
            if handle is not None and handle != caller.run_header:
                raise Unattributed(
                    f"The Undolog-Run header and the {RUN_ARG} argument name different runs; "
                    "the call was not run."
                )
            handle = caller.run_header
        if handle is not None:
            return await self._run_by_handle(caller, handle)
        if caller.conversation is not None:
            run = self.run_for(caller.conversation, caller)
            if run.client != caller.client:
                raise Unattributed(
                    "This MCP session belongs to another client; the call was not run."
                )
            return run
        raise Unattributed(
            "This gateway serves many clients over stateless MCP and cannot tell which run this "
            f"call belongs to, so it was not run. Call {START_RUN} once, then pass the run handle "
            f"it returns as the {RUN_ARG} argument of every call of this conversation."
        )

    async def _run_by_handle(self, caller: Caller, handle: Any) -> Run:
        """1. The handle must be a run handle (the 36-character id ``undolog_start_run`` gave).
        2. A run this replica serves already: it must be this client's.
        3. Else read it from the server (any replica may have started it): a run of this gateway's
           agent, started through a gateway by this client (``metadata.client``)."""
        key = _parse_handle(handle)
        run = self.runs.get(key)
        if run is None:
            try:
                data = await self.http.asend(Call("GET", f"/api/v1/sessions/{key}"))
            except UndoLogError as exc:
                if exc.code not in ("session_not_found", "not_found") and exc.status != 404:
                    raise
                data = {}
            metadata = data.get("metadata") or {}
            if metadata.get("via") != "mcp-gateway" or metadata.get("client") != caller.client:
                raise Unattributed(_not_yours(key, caller))
            run = Run(self, key, caller)
            run.adopt(data)
            self._cache(run)
        if run.client != caller.client:
            raise Unattributed(_not_yours(key, caller))
        return run

    def _cache(self, run: Run) -> None:
        assert run.key is not None
        self.runs[run.key] = run
        while len(self.runs) > MAX_CACHED_RUNS:  # oldest first; the server still has them
            self.runs.pop(next(iter(self.runs)))

    def remember(self, run: Run) -> None:
        if self.config.state_file and run.key == "stdio" and not run.handle:
            self.config.state_file.write_text(json.dumps({"session": run.session.id}))

    def forget(self, run: Run, *, keep: bool = False) -> None:
        """The run ended. `keep`: it stays in place, refusing calls (a reviewer or the server ended
        it); otherwise the client's next call starts a new run."""
        if not keep:
            for key in {run.key, run.session.id}:  # a conversation's run may have its handle too
                if key is not None and self.runs.get(key) is run:
                    del self.runs[key]
        if self.config.state_file and run.key == "stdio" and not run.handle:
            self.config.state_file.unlink(missing_ok=True)

    async def _resume(self) -> None:
        state = self.config.state_file
        if not state or not state.exists():
            return
        session_id = json.loads(state.read_text() or "{}").get("session")
        run = Run(self, "stdio", STDIO)
        if session_id and await run.resume(session_id):
            self.runs["stdio"] = run
            log.info("resumed run %s (the previous gateway did not finish it)", session_id)
        else:
            state.unlink(missing_ok=True)

    async def disconnected(self, key: str) -> None:
        """The client went away cleanly: its run is complete."""
        self.clients.pop(key, None)
        run = self.runs.get(key)
        if run is not None and run.over is None and not run.handle:
            try:
                await run.end("complete", {})
            except UndoLogError as exc:
                log.warning("could not complete run %s: %s", run.session.id, exc)
                self.forget(run)

    # -- one call ------------------------------------------------------------------------

    async def call(
        self,
        caller: Caller | str,
        name: str,
        args: dict[str, Any],
        progress: Progress | None = None,
    ) -> Any:
        """One ``tools/call``:

        1. ``undolog_start_run`` mints a run and its handle.
        2. Which run: the handle (argument or header), else the conversation; neither, or a run
           this client does not own, refuses the call (nothing runs).
        3. A meta-tool ends the run (finish, or fail and roll back).
        4. A run a reviewer or the server ended refuses every call.
        5. SAFE: forwarded at once, reported with the next request (a handle run's: right after);
           a tool labelled ``untrusted`` reports what it answered too (``output``).
        6. Otherwise the SDK's flow: intercept; compensable runs upstream and commits its result
           (or fails with its error); irreversible waits for the reviewer, sending progress, up
           to ``approval_wait_s``; a replay returns the committed result without running.
        """
        if isinstance(caller, str):
            caller = Caller("stdio", caller)
        args = dict(args)
        handle = args.pop(RUN_ARG, None)
        if name == START_RUN:
            return await self._start(caller)
        route = self.routes.get(name)
        if route is None and name not in META_TOOLS:
            return error_result(f"No tool named {name!r} behind this gateway.")
        try:
            run = await self.run_of(caller, handle)
        except Unattributed as exc:
            return error_result(str(exc))
        except UndoLogError as exc:
            return error_result(refusal_as_tool_result(exc))
        if caller.access is not None:
            caller.access["run"] = run  # its id once opened (the access line is written after)
        if name in (FINISH_RUN, FAIL_RUN):
            return await self._meta(run, name, args)
        if name in (SAVEPOINT, REWIND):
            return await self._rewind(run, name, args)
        assert route is not None
        if run.over is not None:
            return error_result(run.over)
        upstream = self.upstreams[route.server]
        if route.declared.safe:
            result = await upstream.call(route.upstream_name, args)
            if route.declared.spec.reports_output:
                # What the model reads, errors included: an error's text may carry others' words.
                run.record_safe(route.exposed, args, reported_value(result))
            else:
                run.record_safe(route.exposed, args)
            return result
        ran: dict[str, Any] = {}

        async def execute(edited: dict[str, Any] | None = None) -> Any:
            # A reviewer's edit before approving is what runs upstream (the SDK logs the change).
            if edited is not None:
                log.info("%s: running upstream %s with the reviewer's edited args", route.exposed,
                         route.upstream_name)
            sent = args if edited is None else edited
            ran["result"] = result = await upstream.call(route.upstream_name, sent)
            if getattr(result, "is_error", False):
                raise UpstreamToolError(result)
            return result_value(result)

        try:
            await run.ensure_open()
            value = await self._drive(run, route, args, execute, progress)
        except Exception as exc:
            return await self._outcome(run, route, exc)
        return self._answer(run, route, args, ran.get("result"), value)

    def _answer(self, run: Run, route: Route, args: dict[str, Any], ran: Any, value: Any) -> Any:
        """What the upstream answered (kept, keyed as the server keys a call: run, tool, args), or
        for a replay the answer kept when it ran, else one rebuilt from the stored result."""
        key = (str(run.session.id), route.exposed, json.dumps(args, sort_keys=True, default=str))
        if ran is not None:
            self._answers[key] = ran
            while len(self._answers) > MAX_KEPT_ANSWERS:
                self._answers.popitem(last=False)
            return ran
        kept = self._answers.get(key)
        return kept if kept is not None else replayed_result(value, route.tool)

    async def _start(self, caller: Caller) -> Any:
        """``undolog_start_run``: a new handle run; in a conversation that has a run of its own
        (stdio, a legacy MCP session), that run, so the conversation's work never splits."""
        try:
            if caller.conversation is None:
                run, fresh = await self.start_run(caller), True
            else:
                run, fresh = await self.bind_run(caller)
        except Unattributed as exc:
            return error_result(str(exc))
        except UndoLogError as exc:
            return error_result(refusal_as_tool_result(exc))
        if caller.access is not None:
            caller.access["run"] = run
        handle = run.session.id
        if fresh:
            text = (
                f"Run started. Pass {RUN_ARG}={handle!r} to every tool call of this conversation."
            )
        else:
            text = (
                f"This conversation already has a run: {handle!r}. Its calls go to it, with "
                f"{RUN_ARG}={handle!r} or without; no second run was started."
            )
        return text_result(text, structured={"run": handle})

    async def _drive(
        self,
        run: Run,
        route: Route,
        args: dict[str, Any],
        execute: Callable[..., Awaitable[Any]],
        progress: Progress | None,
    ) -> Any:
        flow = run.session._effect_flow(route.declared, args)
        if route.tier is not ToolTier.IRREVERSIBLE or progress is None:
            return await run.session._adrive(flow, execute)
        outcome: dict[str, Any] = {}
        async with anyio.create_task_group() as group:

            async def drive() -> None:
                try:
                    outcome["value"] = await run.session._adrive(flow, execute)
                except Exception as exc:
                    outcome["error"] = exc
                finally:
                    group.cancel_scope.cancel()

            group.start_soon(drive)
            group.start_soon(self._progress, progress, route)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    async def _progress(self, progress: Progress, route: Route) -> None:
        """While an irreversible call waits, say so every few seconds (clients reset timeouts)."""
        started, wait = time.monotonic(), self.config.approval_wait_s
        while True:
            waited = time.monotonic() - started
            await progress(
                waited,
                wait,
                f"{route.exposed} waits for a reviewer's approval "
                f"({self.dashboard()}); {waited:.0f} s so far",
            )
            await anyio.sleep(self.config.progress_every_s)

    async def _outcome(self, run: Run, route: Route, exc: Exception) -> Any:
        """The tool result the model reads when the call did not simply succeed."""
        if isinstance(exc, UpstreamToolError):
            return exc.result  # the upstream's own error result, as it sent it
        if isinstance(exc, ApprovalWaitTimeout):
            return error_result(await self._awaiting_text(route, exc))
        if isinstance(exc, EffectInFlight):
            return error_result(
                f"{route.exposed}: this exact call was started before (the gateway may have "
                "restarted mid-call) and its outcome is unknown; it is never run a second time. "
                "Check the current "
                "state with a read tool before doing anything else."
            )
        if isinstance(exc, SessionAwaitingApproval):
            return error_result(
                "Another call of this run waits for a reviewer's decision; call that one "
                "again to pick the decision up before calling anything else."
            )
        if isinstance(exc, Refused):
            text = refusal_as_tool_result(exc)
            if run.session.state in (
                "halted",
                "failed",
                "compensating",
                "compensated",
                "compensation_failed",
            ) or exc.code in ("session_not_running",):
                run.over = (
                    f"This run is over ({run.session.state}); the tool call was not executed. "
                    "Stop calling tools and give your final answer."
                )
                self.forget(run, keep=True)
            return error_result(text)
        if isinstance(exc, UndoLogError):
            return error_result(refusal_as_tool_result(exc))
        log.warning("%s failed upstream: %r", route.exposed, exc)
        return error_result(f"{route.exposed} failed: {type(exc).__name__}: {exc}")

    async def _awaiting_text(self, route: Route, exc: ApprovalWaitTimeout) -> str:
        link = self.dashboard()
        try:
            effect = (await self.http.asend(Call("GET", f"/api/v1/effects/{exc.effect_id}"))).get(
                "effect", {}
            )
            approval = effect.get("approval") or {}
            if approval.get("id"):
                link = f"{self.dashboard()}/approvals/{approval['id']}/"
        except UndoLogError:
            pass
        return (
            f"{route.exposed} awaits a reviewer's approval ({link}); it has not run. Call it again "
            "with the same arguments to pick up the decision: it never runs twice."
        )

    def dashboard(self) -> str:
        return (self.config.dashboard_url or self.http.base_url).rstrip("/")

    async def _meta(self, run: Run, name: str, args: dict[str, Any]) -> Any:
        next_run = (
            f"call {START_RUN} for a new run" if run.handle else "the next call starts a new run"
        )
        try:
            if name == FINISH_RUN:
                answer = await run.end("complete", {})
                return text_result(
                    f"Run finished ({(answer.get('session') or {}).get('state', 'completed')}); "
                    f"{next_run}."
                )
            reason = str(args.get("reason") or "failed by the agent")
            answer = await run.end("fail", {"error": reason})
        except UndoLogError as exc:
            self.forget(run)
            return error_result(refusal_as_tool_result(exc))
        state = (answer.get("session") or {}).get("state", "failed")
        return text_result(
            f"Run failed ({reason}); its changes are being rolled back newest first "
            f"(session {state}); {next_run}."
        )

    async def _rewind(self, run: Run, name: str, args: dict[str, Any]) -> Any:
        """``undolog_savepoint`` and ``undolog_rewind``: the SDK's ``savepoint`` and ``rewind``
        (the rewind's agent-side undos are this gateway's, claimed meanwhile)."""
        if run.over is not None:
            return error_result(run.over)
        try:
            await run.ensure_open()
            if name == SAVEPOINT:
                point = await run.session.asavepoint(str(args.get("name") or ""))
                return text_result(
                    f"Savepoint {point['name']!r} marks step {point['step_index']}; call {REWIND} "
                    f"with to={point['name']!r} to come back to it."
                )
            steps = run.session._steps
            answer = await run.session.arewind(
                args.get("to"),
                reason=str(args.get("reason") or ""),
                leave_irreversible=bool(args.get("leave_irreversible")),
            )
            if isinstance(steps, _Clock):
                run.session._steps = steps  # replicas' steps keep their order (after the step)
        except UndoLogError as exc:
            return error_result(refusal_as_tool_result(exc))
        undone = ", ".join(f"{i['tool']} (step {i['step_index']})" for i in answer["to_undo"])
        left = ", ".join(f"{i['tool']} (step {i['step_index']})" for i in answer["left_done"])
        return text_result(
            f"Rewound to step {answer['resumes_at']}: undone, newest first: {undone or 'nothing'}"
            + (f"; not undone (irreversible): {left}" if left else "")
            + ". The run goes on from there: what you did after it did not happen."
        )

    # -- compensations that run here -----------------------------------------------------

    async def serve_compensations(self) -> None:
        """Claim the undo entries of this agent's rolled-back runs whose undo is a tool of one of
        this gateway's upstreams (its scopes), and run them: the gateway holds the upstreams'
        credentials, the worker does not. A gateway with no such undo claims nothing."""
        scopes = self.scopes()
        if not scopes:
            return
        while True:
            try:
                entries = await aclaim(self.http, 10, self.config.claim_lease_s, scopes)
            except UndoLogError as exc:
                log.debug("claim failed: %s", exc)
                entries = []
            for entry in entries:
                # A client leaving cancels this loop, but not mid-entry: an undo the upstream has
                # done must still be reported, or undolog would wait out the lease and have the
                # next gateway run it again. The lease bounds how long shutdown waits for it.
                deadline = anyio.current_time() + self.config.claim_lease_s
                with anyio.CancelScope(shield=True, deadline=deadline):
                    handler = restorer(self, entry) or self._compensator(entry["fn_name"])
                    await arun_one(self.http, entry, handler)
            if not entries:
                await anyio.sleep(self.config.claim_poll_s)

    def _compensator(self, fn_name: str) -> Callable[[dict[str, Any]], Awaitable[Any]] | None:
        target = self.compensators.get(fn_name)
        if target is None or target[0] not in self.upstreams:
            return None
        upstream, tool = self.upstreams[target[0]], target[1]
        return lambda args: upstream.call_or_raise(tool, args)


def tier_tool(server: ServerConfig, tool: Any, exposed: str) -> tuple[ToolSpec, str]:
    """The spec registered for an upstream tool: `classify` unless the config overrides it."""
    override = server.tools.get(tool.name)
    compensation = (
        override.compensation.descriptor(server.name)
        if override and override.compensation
        else None
    )
    spec, found = spec_for(
        tool,
        trusted=server.trusted,
        also=server.also,
        compensation=compensation,
        cost_weight=server.cost_weight,
        safe_cost_weight=server.safe_cost_weight,
    )
    why = found.why
    if override is not None:
        tier = override.tier or spec.tier
        approval = None
        if tier is ToolTier.IRREVERSIBLE:
            approval = (
                override.approval
                or spec.approval
                or ApprovalSpec(reason=(tool.description or f"MCP tool {tool.name}").split("\n")[0])
            )
        spec = dataclasses.replace(
            spec,
            tier=tier,
            approval=approval,
            compensation=compensation if tier is ToolTier.COMPENSABLE else None,
            cost_weight=override.cost_weight
            if override.cost_weight is not None
            else spec.cost_weight,
            description=override.description or spec.description,
            labels=override.labels if override.labels is not None else spec.labels,
            untrusted_fields=override.untrusted_fields or spec.untrusted_fields,
            asked=override.asked or spec.asked,
        )
        if override.tier:
            why = f"tier set in the gateway's config ({tier.value})"
    return dataclasses.replace(spec, name=exposed), why


def dataclass_copy(route: Route) -> Any:
    return route.tool.model_copy(update={"name": route.exposed})


def error_result(text: str) -> Any:
    from mcp import types

    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def text_result(text: str, structured: dict[str, Any] | None = None) -> Any:
    from mcp import types

    return types.CallToolResult(
        content=[types.TextContent(text=text)], structured_content=structured
    )


def with_run_argument(tool: Any) -> Any:
    """The tool as listed, taking the run handle too (optional in the schema: stdio and legacy
    session clients have a run without it)."""
    schema = dict(tool.input_schema or {"type": "object"})
    properties = dict(schema.get("properties") or {})
    properties.setdefault(
        RUN_ARG,
        {
            "type": "string",
            "maxLength": MAX_HANDLE_CHARS,
            "description": f"The run handle {START_RUN} returned (needed over stateless HTTP).",
        },
    )
    schema["properties"] = properties
    return tool.model_copy(update={"input_schema": schema})


def _parse_handle(handle: Any) -> str:
    if not isinstance(handle, str) or not 0 < len(handle) <= MAX_HANDLE_CHARS:
        shown = handle[:40] + "…" if isinstance(handle, str) and len(handle) > 40 else handle
        raise Unattributed(
            f"{RUN_ARG}={shown!r} is not a run handle (the 36-character id {START_RUN} returned); "
            "the call was not run."
        )
    try:
        return str(uuid.UUID(handle))
    except ValueError:
        raise Unattributed(
            f"{RUN_ARG}={handle!r} is not a run handle (the 36-character id {START_RUN} "
            "returned); the call was not run."
        ) from None


def _not_yours(handle: str, caller: Caller) -> str:
    return (
        f"No run {handle} of this client ({caller.client}) behind this gateway; the call was not "
        f"run. Call {START_RUN} for a run of your own."
    )


def replayed_result(value: Any, tool: Any = None) -> Any:
    """A committed call's stored result (``result_value`` of the upstream's answer), shaped as that
    answer was when this gateway no longer holds it: a text answer (stored as ``{"text": ...}``)
    as that text alone; JSON as its text, with ``structuredContent`` when it is an object (what
    an upstream that structures its answers sent; one that answered JSON text only gets it too).
    """
    from mcp import types

    if isinstance(value, dict) and set(value) == {"text"} and isinstance(value["text"], str):
        schema = getattr(tool, "output_schema", None) or {}
        if "text" not in (schema.get("properties") or {}):  # not an upstream's own {"text": ...}
            return types.CallToolResult(content=[types.TextContent(text=value["text"])])
    structured = value if isinstance(value, dict) else None
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(value))], structured_content=structured
    )


def _compensations(server: ServerConfig) -> list[Any]:
    return [o.compensation for o in server.tools.values() if o.compensation is not None]


def _env(name: str) -> str | None:
    import os

    return os.environ.get(name)
