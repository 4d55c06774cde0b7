"""One connection to one upstream MCP server (a stdio command or a streamable-HTTP URL)."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from typing import Any

from .config import ServerConfig

__all__ = ["BASE_ENV", "Upstream", "UpstreamToolError", "result_value", "upstream_environment"]

# What a stdio upstream inherits of the gateway's environment without listing it: what a program
# needs to find itself, its files and its locale. Never the rest (client tokens, undolog's key,
# other servers' credentials, a proxy URL with a password): an upstream may be anyone's code.
BASE_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LANGUAGE", "TZ", "TMPDIR",
    "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR",
    # Where the machine's CA certificates are (paths, not secrets: npx and pip behind a TLS proxy).
    "SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    # Windows: what a process cannot start or find its profile without.
    "SYSTEMROOT", "SYSTEMDRIVE", "COMSPEC", "PATHEXT", "WINDIR", "TEMP", "TMP", "USERPROFILE",
    "APPDATA", "LOCALAPPDATA", "PROGRAMDATA", "PROGRAMFILES",
)


def upstream_environment(listed: Mapping[str, str] | None) -> dict[str, str]:
    """A stdio upstream's environment: the base (``BASE_ENV`` and the ``LC_*`` locale) of ours,
    and what its TOML entry lists (``env``), which wins."""
    base = {k: v for k, v in os.environ.items() if k in BASE_ENV or k.startswith("LC_")}
    return {**base, **(listed or {})}


class UpstreamToolError(Exception):
    """The upstream answered the call with ``isError``: the tool failed (the effect fails, the
    model sees the upstream's own error result)."""

    def __init__(self, result: Any) -> None:
        self.result = result
        super().__init__(text_of(result) or "the upstream tool failed")


def text_of(result: Any) -> str:
    return "\n".join(
        getattr(block, "text", "") for block in getattr(result, "content", None) or []
    ).strip()


def result_value(result: Any) -> Any:
    """What the gateway commits for an upstream result, and what `{result.a.b}` reads:
    the structured content, else the text parsed as JSON, else ``{"text": ...}``."""
    value, parsed = _value(result)
    return value if parsed else {"text": value}


def reported_value(result: Any) -> Any:
    """What a SAFE read labelled ``untrusted`` reports as its output: as ``result_value``, but a
    text that is not JSON goes as the text, not ``{"text": ...}`` (the server then treats it as
    untrusted whole; wrapped, its ``text`` key was no field the tool names, so it vouched)."""
    return _value(result)[0]


def _value(result: Any) -> tuple[Any, bool]:
    """(the structured content, else the text parsed as JSON, else the text; whether it was
    one of the first two)."""
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        return structured, True
    text = text_of(result)
    try:
        return json.loads(text), True
    except ValueError:
        return text, False


class Upstream:
    """A live client session to one upstream server; calls may run concurrently on it."""

    def __init__(
        self, config: ServerConfig, on_tools_changed: Callable[[str], Awaitable[None]]
    ) -> None:
        self.config = config
        self.name = config.name
        self._on_tools_changed = on_tools_changed
        self._session: Any = None

    async def connect(self, stack: AsyncExitStack) -> None:
        from mcp import ClientSession

        read, write = await stack.enter_async_context(self._transport())
        self._session = await stack.enter_async_context(
            ClientSession(read, write, message_handler=self._on_message)
        )
        await self._session.initialize()

    def _transport(self) -> Any:
        if self.config.url:
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            client = create_mcp_http_client(headers=dict(self.config.headers))
            return _owned(client, streamable_http_client(self.config.url, http_client=client))
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        command = self.config.command
        return stdio_client(
            StdioServerParameters(
                command=command[0],
                args=list(command[1:]),
                env=upstream_environment(self.config.env),
                cwd=self.config.cwd,
            )
        )

    async def _on_message(self, message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            await self._on_tools_changed(self.name)

    async def list_tools(self) -> list[Any]:
        from mcp.types import PaginatedRequestParams

        tools: list[Any] = []
        cursor: str | None = None
        while True:
            page = await self._session.list_tools(
                params=PaginatedRequestParams(cursor=cursor) if cursor else None
            )
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def call(self, tool: str, args: dict[str, Any]) -> Any:
        return await self._session.call_tool(tool, args)

    async def call_or_raise(self, tool: str, args: dict[str, Any]) -> Any:
        result = await self.call(tool, args)
        if getattr(result, "is_error", False):
            raise UpstreamToolError(result)
        return result


class _owned:
    """Enter the http client with the transport, so the connection pool closes with it."""

    def __init__(self, client: Any, transport: Any) -> None:
        self.client, self.transport = client, transport

    async def __aenter__(self) -> Any:
        await self.client.__aenter__()
        return await self.transport.__aenter__()

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.transport.__aexit__(*exc)
        finally:
            await self.client.__aexit__(*exc)
