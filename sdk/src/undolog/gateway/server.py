"""The gateway as an MCP server: stdio (one client, one run) or streamable HTTP (one run per
MCP session id)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any

import anyio

from .core import Gateway

__all__ = ["build_server", "serve_http", "serve_stdio"]

log = logging.getLogger("undolog.gateway")


def client_key(ctx: Any) -> str:
    """Which MCP client session a request belongs to: the streamable-HTTP session id, or the
    one stdio client."""
    headers = getattr(getattr(ctx, "request", None), "headers", None)
    session_id = headers.get("mcp-session-id") if headers is not None else None
    return f"http:{session_id}" if session_id else "stdio"


def build_server(gateway: Gateway) -> Any:
    from mcp import types
    from mcp.server.lowlevel import Server

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        gateway.clients[client_key(ctx)] = ctx.session
        return types.ListToolsResult(tools=gateway.mcp_tools())

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        key = client_key(ctx)
        gateway.clients[key] = ctx.session

        async def progress(done: float, total: float | None, message: str) -> None:
            await ctx.session.report_progress(done, total, message)

        return await gateway.call(key, params.name, dict(params.arguments or {}), progress)

    return Server(
        "undolog-gateway",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        instructions="Tools behind undolog: reads run at once, changes can be undone, "
        "irreversible calls wait for a person. Call undolog_finish_run when done, "
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
            group.start_soon(gateway.serve_compensations)
            async with stdio_server() as (read, write):
                await server.run(read, write, _options(server))
            await gateway.disconnected("stdio")
            group.cancel_scope.cancel()


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


async def serve_http(gateway: Gateway, host: str, port: int) -> None:
    """Serve streamable HTTP at http://HOST:PORT/mcp. A client's run is completed when it ends
    its MCP session; runs still open at shutdown (SIGTERM, SIGINT) are completed before exit."""
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn would re-raise the signal once serving stops, killing the process before
            # the open runs are completed; the gateway handles the signals itself (below).
            yield

    server = build_server(gateway)
    async with AsyncExitStack() as stack:
        await gateway.start(stack)
        app = ends_runs_on_delete(server.streamable_http_app(host=host), gateway)
        web = Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    web.should_exit = True
                    return

        async with anyio.create_task_group() as group:
            group.start_soon(gateway.serve_compensations)
            group.start_soon(stop_on_signal)
            await web.serve()
            for key in list(gateway.runs):
                await gateway.disconnected(key)
            group.cancel_scope.cancel()
