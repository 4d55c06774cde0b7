"""The gateway as an MCP server: stdio (one client, one run) or streamable HTTP (every request
authenticated; runs per legacy MCP session, or per run handle under the stateless protocol:
see ``core``)."""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import logging
from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any

import anyio

from .config import ClientConfig
from .core import STDIO, Caller, Gateway
from .logs import ACCESS_SCOPE_KEY, AccessLog

__all__ = ["Authenticator", "build_server", "serve_http", "serve_stdio"]

log = logging.getLogger("undolog.gateway")

LOCAL = "local"  # the one client of a loopback gateway that has no client tokens
CLIENT_SCOPE_KEY = "undolog.client"


def caller_of(ctx: Any) -> Caller:
    """Who sent this request and in which conversation: the client the authenticator found, the
    legacy MCP session id if any, the ``Undolog-Run`` header if any; stdio has no request."""
    request = getattr(ctx, "request", None)
    headers = getattr(request, "headers", None)
    if headers is None:
        return STDIO
    client: ClientConfig | None = request.scope.get(CLIENT_SCOPE_KEY)
    session_id = headers.get("mcp-session-id")
    return Caller(
        client=client.name if client else LOCAL,
        conversation=f"http:{session_id}" if session_id else None,
        started_by=client.started_by if client else None,
        run_header=headers.get("undolog-run"),
        access=request.scope.get(ACCESS_SCOPE_KEY),
    )


def build_server(gateway: Gateway) -> Any:
    from mcp import types
    from mcp.server.lowlevel import Server

    def remember_client(ctx: Any, caller: Caller) -> None:
        # Only a conversation has a channel to tell about changed tools (stateless HTTP has none).
        if caller.conversation is not None:
            gateway.clients[caller.conversation] = ctx.session

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        remember_client(ctx, caller_of(ctx))
        return types.ListToolsResult(tools=gateway.mcp_tools())

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        caller = caller_of(ctx)
        remember_client(ctx, caller)

        async def progress(done: float, total: float | None, message: str) -> None:
            await ctx.session.report_progress(done, total, message)

        result = await gateway.call(caller, params.name, dict(params.arguments or {}), progress)
        if caller.access is not None:
            caller.access["outcome"] = "error" if getattr(result, "is_error", False) else "ok"
        return result

    return Server(
        "undolog-gateway",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        # A stateless tools/call checks its Mcp-Param-* headers against the tool's schema: from
        # here, not by running tools/list for every call (the mcp package's fallback).
        get_tool_input_schema=gateway.input_schema,
        instructions="Tools behind undolog: reads run at once, changes can be undone, "
        "irreversible calls wait for a person. Start with undolog_start_run and pass its run "
        "handle as undolog_run to every call; call undolog_finish_run when done, "
        "undolog_fail_run(reason) to roll the run back.",
    )


def _options(server: Any) -> Any:
    from mcp.server.lowlevel import NotificationOptions

    return server.create_initialization_options(
        notification_options=NotificationOptions(tools_changed=True)
    )


async def serve_stdio(gateway: Gateway) -> None:
    """Serve one client over stdin/stdout; its clean disconnect completes its run."""
    from mcp.server.stdio import stdio_server

    server = build_server(gateway)
    async with AsyncExitStack() as stack:
        await gateway.start(stack)
        async with anyio.create_task_group() as group:
            gateway.background = group
            group.start_soon(gateway.serve_compensations)
            async with stdio_server() as (read, write):
                await server.run(read, write, _options(server))
            await gateway.disconnected("stdio")
            group.cancel_scope.cancel()


class Authenticator:
    """ASGI middleware in front of the MCP app: every HTTP request carries ``Authorization: Bearer
    <client token>`` (MCP's authorization spec: else 401 with ``WWW-Authenticate: Bearer``, before
    any tool is listed). Tokens are compared in constant time, each one, so the time taken says
    nothing of which token came close; they are never logged.

    A legacy MCP session belongs to the client that opened it: its id, seen on the response to
    that client's ``initialize``, is refused (404, as for an unknown session) to any other client.
    Without client tokens (a loopback gateway) every request is the one client ``local``."""

    def __init__(self, app: Any, clients: tuple[ClientConfig, ...]) -> None:
        self.app, self.clients = app, clients
        self._tokens = [(c.token.encode(), c) for c in clients]
        self._sessions: dict[bytes, str] = {}  # legacy MCP session id -> the client that opened it

    def client_for(self, authorization: bytes | None) -> ClientConfig | None:
        scheme, _, presented = (authorization or b"").partition(b" ")
        if scheme.lower() != b"bearer" or not presented:
            return None
        found = None
        for token, client in self._tokens:
            if hmac.compare_digest(token, presented.strip()):
                found = client
        return found

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        client: ClientConfig | None = None
        if self.clients:
            client = self.client_for(headers.get(b"authorization"))
            if client is None:
                await _refuse(send, 401, "unauthorized",
                              "Send Authorization: Bearer <client token> (one of the "
                              "gateway's [clients]).",
                              [(b"www-authenticate", b'Bearer realm="undolog-gateway"')])
                return
        name = client.name if client else LOCAL
        session_id = headers.get(b"mcp-session-id")
        if session_id and self._sessions.get(session_id, name) != name:
            await _refuse(send, 404, "session_not_found", "No such MCP session.")
            return
        scope[CLIENT_SCOPE_KEY] = client

        async def sending(message: Any) -> None:
            if message.get("type") == "http.response.start":
                opened = dict(message.get("headers") or []).get(b"mcp-session-id")
                if opened:
                    self._sessions.setdefault(opened, name)
            await send(message)

        await self.app(scope, receive, sending)
        if scope.get("method") == "DELETE" and session_id:
            self._sessions.pop(session_id, None)


async def _refuse(send: Any, status: int, code: str, message: str,
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"error": code, "message": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


def ends_runs_on_delete(app: Any, gateway: Gateway) -> Any:
    """A client that ends its MCP session (``DELETE`` with its ``mcp-session-id``) disconnected
    cleanly: its run is completed, as a stdio client's is when it closes the pipe."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        await app(scope, receive, send)
        if scope.get("type") == "http" and scope.get("method") == "DELETE":
            session_id = dict(scope.get("headers") or []).get(b"mcp-session-id")
            if session_id:
                await gateway.disconnected(f"http:{session_id.decode()}")

    return wrapped


class InsecureBind(ValueError):
    """``--http`` on an address others can reach, with no client token to keep them out."""


def check_bind(host: str, clients: tuple[ClientConfig, ...]) -> None:
    if clients or _loopback(host):
        return
    raise InsecureBind(
        f"refusing to serve --http on {host}: it is reachable from other machines, and the "
        "gateway runs upstream tools with its own credentials for whoever calls it. Add a "
        "[clients.<name>] table with token = \"${SOME_ENV_VAR}\" to the TOML (each client then "
        "sends Authorization: Bearer <token>), or bind to 127.0.0.1."
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


async def serve_http(gateway: Gateway, host: str, port: int) -> None:
    """Serve streamable HTTP at http://HOST:PORT/mcp. A legacy client's run is completed when it
    ends its MCP session; such runs still open at shutdown (SIGTERM, SIGINT) are completed before
    exit. Handle runs stay open: another replica may serve them, and the server's idle sweep ends
    a quiet one (``on_idle``)."""
    import signal

    import uvicorn

    check_bind(host, gateway.config.clients)

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn would re-raise the signal once serving stops, killing the process before
            # the open runs are completed; the gateway handles the signals itself (below).
            yield

    server = build_server(gateway)
    async with AsyncExitStack() as stack:
        await gateway.start(stack)
        inner = server.streamable_http_app(host=host)
        app = AccessLog(Authenticator(ends_runs_on_delete(inner, gateway), gateway.config.clients),
                        CLIENT_SCOPE_KEY)
        web = Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    web.should_exit = True
                    return

        async with anyio.create_task_group() as group:
            gateway.background = group
            group.start_soon(gateway.serve_compensations)
            group.start_soon(stop_on_signal)
            await web.serve()
            for key, run in list(gateway.runs.items()):
                if run.handle:
                    await run.flush_safe(0)  # its SAFE calls not yet reported: now, not lost
                else:
                    await gateway.disconnected(key)
            group.cancel_scope.cancel()
