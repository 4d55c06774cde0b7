"""The gateway's rules, transport-free: which upstream tool each exposed name reaches, its
tier, and what happens to one ``tools/call`` (the same flows as the SDK's decorated tools).

One MCP client session is one undolog session (a *run*), opened by the first call that
reaches the server and completed when the client disconnects cleanly. SAFE calls never wait
on undolog: they are forwarded at once and reported with the next request. Every outcome the
model must read is a tool result with ``isError`` and the message as text.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
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
    UndoLogError,
    refusal_as_tool_result,
)
from ..mcp import spec_for
from ..session import Session
from ..tiers import ApprovalSpec, ToolSpec, ToolTier
from .config import GatewayConfig, ServerConfig
from .upstream import Upstream, UpstreamToolError, result_value

__all__ = ["FAIL_RUN", "FINISH_RUN", "Gateway", "Route"]

log = logging.getLogger("undolog.gateway")

FINISH_RUN = "undolog_finish_run"
FAIL_RUN = "undolog_fail_run"
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


class Run:
    """The undolog session of one MCP client session, opened lazily by its first non-SAFE call
    (SAFE calls before it are kept and reported with that first request)."""

    def __init__(self, gateway: Gateway, key: str) -> None:
        self.gateway, self.key = gateway, key
        config = gateway.config
        self.session = Session(
            gateway.http,
            agent=gateway.agent,
            metadata={"via": "mcp-gateway", "client": key},
            approval_timeout=config.approval_wait_s,
            poll_wait=max(1.0, min(30.0, config.approval_wait_s)),
        )
        self.opened = False
        self.over: str | None = None  # set when a reviewer or the server ended the run
        self._lock = anyio.Lock()

    async def ensure_open(self) -> None:
        async with self._lock:
            if self.opened:
                return
            steps, safe = self.session._steps, self.session._safe
            self.session._open(await self.gateway.http.asend(self.session._open_call()))
            # A new session starts at step 0 on the server; keep the steps SAFE calls already took.
            self.session._steps, self.session._safe = steps, safe
            self.opened = True
            self.gateway.remember(self)

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

    async def end(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """``complete`` or ``fail`` the session (reporting the last SAFE calls)."""
        if not self.opened and not self.session._safe and verb == "complete":
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
        self.runs: dict[str, Run] = {}
        self.clients: dict[
            str, Any
        ] = {}  # key -> the client's ServerSession, to say tools/list_changed
        self.compensators: dict[str, tuple[str, str]] = {
            comp.function_name(server.name): (comp.server or server.name, comp.tool)
            for server in config.servers
            for comp in _compensations(server)
            if comp.tool
        }

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
        for server in self.config.servers:
            for comp in _compensations(server):
                if comp.tool:
                    await self.http.asend(
                        _compensation_call(
                            comp.function_name(server.name),
                            comp.fn_version,
                            "agent",
                            "",
                            5000,
                            comp.claim_timeout_s,
                        )
                    )

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
                    if counts[tool.name] == 1 and tool.name not in (FINISH_RUN, FAIL_RUN)
                    else f"{server.name}_{tool.name}"
                )
                spec, why = tier_tool(server, tool, exposed)
                routes[exposed] = Route(
                    exposed,
                    server.name,
                    tool.name,
                    tool,
                    DeclaredTool(spec, _upstream_placeholder, None),
                    why,
                )
        if routes:
            await self.http.asend(
                Call(
                    "POST",
                    "/api/v1/tools",
                    {"tools": [r.declared.spec.to_dict() for r in routes.values()]},
                )
            )
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

    def mcp_tools(self) -> list[Any]:
        from mcp import types

        tools = [dataclass_copy(route) for route in self.routes.values()]
        tools.append(
            types.Tool(
                name=FINISH_RUN,
                description=(
                    "Finish this run: everything done so far stands. Call it when the task is done."
                ),
                input_schema={"type": "object", "properties": {}},
            )
        )
        tools.append(
            types.Tool(
                name=FAIL_RUN,
                description=(
                    "Fail this run and roll it back: every change it made that has an undo is "
                    "undone, "
                    "newest first. Give the reason."
                ),
                input_schema={
                    "type": "object",
                    "properties": {"reason": {"type": "string"}},
                    "required": ["reason"],
                },
            )
        )
        return tools

    # -- runs ----------------------------------------------------------------------------

    def run_for(self, key: str) -> Run:
        run = self.runs.get(key)
        if run is None:
            run = self.runs[key] = Run(self, key)
        return run

    def remember(self, run: Run) -> None:
        if self.config.state_file and run.key == "stdio":
            self.config.state_file.write_text(json.dumps({"session": run.session.id}))

    def forget(self, run: Run, *, keep: bool = False) -> None:
        """The run ended. `keep`: it stays in place, refusing calls (a reviewer or the server ended
        it); otherwise the client's next call starts a new run."""
        if self.runs.get(run.key) is run and not keep:
            del self.runs[run.key]
        if self.config.state_file and run.key == "stdio":
            self.config.state_file.unlink(missing_ok=True)

    async def _resume(self) -> None:
        state = self.config.state_file
        if not state or not state.exists():
            return
        session_id = json.loads(state.read_text() or "{}").get("session")
        run = Run(self, "stdio")
        if session_id and await run.resume(session_id):
            self.runs["stdio"] = run
            log.info("resumed run %s (the previous gateway did not finish it)", session_id)
        else:
            state.unlink(missing_ok=True)

    async def disconnected(self, key: str) -> None:
        """The client went away cleanly: its run is complete."""
        self.clients.pop(key, None)
        run = self.runs.get(key)
        if run is not None and run.over is None:
            try:
                await run.end("complete", {})
            except UndoLogError as exc:
                log.warning("could not complete run %s: %s", run.session.id, exc)
                self.forget(run)

    # -- one call ------------------------------------------------------------------------

    async def call(
        self, key: str, name: str, args: dict[str, Any], progress: Progress | None = None
    ) -> Any:
        """One ``tools/call``:

        1. A meta-tool ends the run (finish, or fail and roll back).
        2. A run a reviewer or the server ended refuses every call.
        3. SAFE: recorded for the next request, forwarded at once.
        4. Otherwise the SDK's flow: intercept; compensable runs upstream and commits its result
           (or fails with its error); irreversible waits for the reviewer, sending progress, up
           to ``approval_wait_s``; a replay returns the committed result without running.
        """
        if name in (FINISH_RUN, FAIL_RUN):
            return await self._meta(key, name, args)
        route = self.routes.get(name)
        if route is None:
            return error_result(f"No tool named {name!r} behind this gateway.")
        run = self.run_for(key)
        if run.over is not None:
            return error_result(run.over)
        upstream = self.upstreams[route.server]
        if route.declared.safe:
            run.session._record_safe(route.exposed, args)
            return await upstream.call(route.upstream_name, args)
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
        return ran["result"] if "result" in ran else replayed_result(value)

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

    async def _meta(self, key: str, name: str, args: dict[str, Any]) -> Any:
        run = self.run_for(key)
        try:
            if name == FINISH_RUN:
                answer = await run.end("complete", {})
                return text_result(
                    f"Run finished ({(answer.get('session') or {}).get('state', 'completed')}); "
                    "the next call starts a new run."
                )
            reason = str(args.get("reason") or "failed by the agent")
            answer = await run.end("fail", {"error": reason})
        except UndoLogError as exc:
            self.forget(run)
            return error_result(refusal_as_tool_result(exc))
        state = (answer.get("session") or {}).get("state", "failed")
        return text_result(
            f"Run failed ({reason}); its changes are being rolled back newest first "
            f"(session {state}). The next call starts a new run."
        )

    # -- compensations that run here -----------------------------------------------------

    async def serve_compensations(self) -> None:
        """Claim the undo entries of this agent's rolled-back runs whose undo is an upstream tool,
        and run them: the gateway holds the upstreams' credentials, the worker does not."""
        while True:
            try:
                entries = await aclaim(self.http, 10, self.config.claim_lease_s)
            except UndoLogError as exc:
                log.debug("claim failed: %s", exc)
                entries = []
            for entry in entries:
                # A client leaving cancels this loop, but not mid-entry: an undo the upstream has
                # done must still be reported, or undolog would wait out the lease and have the
                # next gateway run it again. The lease bounds how long shutdown waits for it.
                deadline = anyio.current_time() + self.config.claim_lease_s
                with anyio.CancelScope(shield=True, deadline=deadline):
                    await arun_one(self.http, entry, self._compensator(entry["fn_name"]))
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
        )
        if override.tier:
            why = f"tier set in the gateway's config ({tier.value})"
    return dataclasses.replace(spec, name=exposed), why


def dataclass_copy(route: Route) -> Any:
    return route.tool.model_copy(update={"name": route.exposed})


def error_result(text: str) -> Any:
    from mcp import types

    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def text_result(text: str) -> Any:
    from mcp import types

    return types.CallToolResult(content=[types.TextContent(text=text)])


def replayed_result(value: Any) -> Any:
    """A committed call's stored result, as the upstream's answer would have carried it."""
    from mcp import types

    structured = value if isinstance(value, dict) else None
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(value))], structured_content=structured
    )


def _compensations(server: ServerConfig) -> list[Any]:
    return [o.compensation for o in server.tools.values() if o.compensation is not None]


def _env(name: str) -> str | None:
    import os

    return os.environ.get(name)
