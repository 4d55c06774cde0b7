"""The gateway's logs: one access-log line per HTTP request, and the format of every line.

``LOG_FORMAT=json`` (as for the undolog server) writes one JSON object per line (``ts``,
``level``, ``logger``, ``message``, and an access line's fields); else text. ``LOG_LEVEL``
(default ``INFO``) is the level of the ``undolog`` loggers. An access line says who called
(the client's name from the TOML, never its token; ``-`` when it was turned away), the HTTP
method and path, the MCP method, the tool and the run (for a ``tools/call``), the HTTP status,
the time taken in milliseconds, and the remote address::

    access client=ana http=POST path=/mcp method=tools/call tool=create_issue run=5f0c…
           status=200 ms=41.2 outcome=ok remote=10.0.0.7
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from datetime import datetime, timezone
from typing import Any

__all__ = ["ACCESS_SCOPE_KEY", "AccessLog", "JsonFormatter", "configure"]

access = logging.getLogger("undolog.gateway.access")

ACCESS_SCOPE_KEY = "undolog.access"  # what the MCP handlers learn of a request (its run)
PEEK_BYTES = 65_536  # of a request's body, read for its JSON-RPC method and tool name
FIELDS = ("client", "http", "path", "method", "tool", "run", "status", "ms", "outcome", "remote")


class JsonFormatter(logging.Formatter):
    """One JSON object per line, the undolog server's shape (``core/logs.py``) plus a record's
    ``fields`` (an access line's)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(environ: Any = os.environ) -> None:
    """The ``undolog`` loggers to stderr (stdout may be the MCP channel), in ``LOG_FORMAT``."""
    fmt = str(environ.get("LOG_FORMAT", "text")).strip().lower()
    if fmt not in ("text", "json"):
        raise ValueError(f"LOG_FORMAT must be text or json, not {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logger = logging.getLogger("undolog")
    logger.handlers[:] = [handler]
    logger.setLevel(str(environ.get("LOG_LEVEL", "INFO")).strip().upper() or "INFO")
    logger.propagate = False


class AccessLog:
    """ASGI middleware, outermost: one line per HTTP request once its answer is sent, refused
    ones (401) included. It reads what the layers inside leave in the request's scope (the
    client the authenticator found, the run a tool call went to) and peeks at the request's
    body for its JSON-RPC method; headers (the token) are never read here."""

    def __init__(self, app: Any, client_key: str) -> None:
        self.app, self.client_key = app, client_key

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        started, body, status = time.perf_counter(), bytearray(), [0]
        scope[ACCESS_SCOPE_KEY] = {}

        async def receiving() -> Any:
            message = await receive()
            if message.get("type") == "http.request" and len(body) < PEEK_BYTES:
                body.extend(message.get("body", b"")[: PEEK_BYTES - len(body)])
            return message

        async def sending(message: Any) -> None:
            if message.get("type") == "http.response.start":
                status[0] = message.get("status", 0)
            await send(message)

        try:
            await self.app(scope, receiving, sending)
        finally:
            seconds = time.perf_counter() - started
            fields = self.fields(scope, bytes(body), status[0] or 500, seconds)
            shown = " ".join(f"{k}={fields[k]}" for k in FIELDS if fields[k] is not None)
            access.info("access " + shown, extra={"fields": fields})

    def fields(self, scope: Any, body: bytes, status: int, seconds: float) -> dict[str, Any]:
        client = scope.get(self.client_key)
        noted = scope.get(ACCESS_SCOPE_KEY) or {}
        run = noted.get("run")
        method, tool = _rpc(body)
        remote = scope.get("client")
        return {
            "client": getattr(client, "name", None) or noted.get("client") or "-",
            "http": scope.get("method"),
            "path": scope.get("path"),
            "method": method,
            "tool": tool,
            "run": getattr(getattr(run, "session", None), "id", None),
            "status": status,
            "ms": round(seconds * 1000, 1),
            "outcome": noted.get("outcome"),
            "remote": remote[0] if remote else None,
        }


_UNPRINTABLE = re.compile(r"[^\x21-\x7e]")


def _clean(text: str) -> str:
    """A client's string as one token of a log line: no spaces, no control characters (a name
    with a newline must not forge a second line), at most 200 characters."""
    return _UNPRINTABLE.sub("?", text[:200])


def _rpc(body: bytes) -> tuple[str | None, str | None]:
    """The JSON-RPC method of a request body (methods of a batch joined by ``,``), and the tool of
    a ``tools/call``; (None, None) when it is not JSON-RPC or was cut at ``PEEK_BYTES``."""
    try:
        message = json.loads(body) if body else None
    except ValueError:
        return None, None
    messages = message if isinstance(message, list) else [message]
    messages = [m for m in messages if isinstance(m, dict) and isinstance(m.get("method"), str)]
    methods = [_clean(m["method"]) for m in messages]
    tools = [_clean(str(m["params"].get("name"))) for m in messages
             if m["method"] == "tools/call" and isinstance(m.get("params"), dict)]
    return ",".join(methods) or None, ",".join(tools) or None
