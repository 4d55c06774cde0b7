"""HTTP to the undolog server: one request description, a sync and an async sender.

Tool-call flows (session.py) describe the requests they need as ``Call`` values, so
one flow serves sync and async tools alike; this module performs them.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import json
import os
from collections.abc import Mapping
from decimal import Decimal
from enum import Enum
from pathlib import PurePath
from typing import Any
from uuid import UUID

import httpx

from ._version import __version__
from .errors import UndoLogConnectionError, UndoLogError, error_from_response

DEFAULT_URL = "http://127.0.0.1:8000"

# The `otel` extra: requests carry the caller's trace (W3C traceparent); the server's spans join it.
try:
    from opentelemetry import propagate as _propagate
except ImportError:  # pragma: no cover - the core SDK needs only httpx
    _propagate = None


def trace_headers() -> dict[str, str]:
    """``traceparent`` (and ``tracestate``) of the current span; empty without OpenTelemetry
    or outside a span."""
    if _propagate is None:
        return {}
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    return carrier


@dataclasses.dataclass(frozen=True)
class Call:
    """One API request. ``timeout`` overrides the client's (long polls need more)."""

    method: str
    path: str
    body: Any = None
    params: Mapping[str, Any] | None = None
    timeout: float | None = None


class Http:
    """Holds the connection pools; the async one is per event loop.

    httpx's AsyncClient is tied to the loop that opened its connections, and test
    suites often run one loop per test, so a client made in another loop is replaced.
    """

    def __init__(self, base_url: str | None, api_key: str | None, *, timeout: float = 10.0,
                 transport: httpx.BaseTransport | None = None,
                 async_transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = (base_url or os.environ.get("UNDOLOG_URL") or DEFAULT_URL).rstrip("/")
        key = api_key or os.environ.get("UNDOLOG_API_KEY")
        if not key:
            raise ValueError("no API key: pass api_key= or set UNDOLOG_API_KEY")
        self._headers = {
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": f"undolog-python/{__version__}",
        }
        self._timeout = timeout
        self._transport = transport
        self._async_transport = async_transport
        self._sync: httpx.Client | None = None
        self._async: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient] | None = None

    # -- sync ---------------------------------------------------------------

    def send(self, call: Call) -> dict[str, Any]:
        if self._sync is None:
            self._sync = httpx.Client(base_url=self.base_url, headers=self._headers,
                                      timeout=self._timeout, transport=self._transport)
        try:
            response = self._sync.request(call.method, call.path, **self._options(call))
        except httpx.HTTPError as exc:
            raise _connection_error(exc) from exc
        return parse(response)

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    # -- async --------------------------------------------------------------

    async def asend(self, call: Call) -> dict[str, Any]:
        client = self._async_client()
        try:
            response = await client.request(call.method, call.path, **self._options(call))
        except httpx.HTTPError as exc:
            raise _connection_error(exc) from exc
        return parse(response)

    async def aclose(self) -> None:
        if self._async is not None:
            loop, client = self._async
            self._async = None
            if loop is asyncio.get_running_loop():
                await client.aclose()

    def _async_client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._async is None or self._async[0] is not loop:
            client = httpx.AsyncClient(base_url=self.base_url, headers=self._headers,
                                       timeout=self._timeout, transport=self._async_transport)
            self._async = (loop, client)
        return self._async[1]

    def _options(self, call: Call) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if call.body is not None:
            options["content"] = dumps(call.body)
        if call.params:
            options["params"] = dict(call.params)
        if call.timeout is not None:
            options["timeout"] = call.timeout
        traced = trace_headers()
        if traced:
            options["headers"] = traced
        return options


def parse(response: httpx.Response) -> dict[str, Any]:
    """A 2xx answer's JSON object, or the mapped exception for anything else."""
    try:
        body = response.json() if response.content else {}
    except ValueError:
        body = None
    if response.is_success and isinstance(body, dict):
        return body
    if response.is_success:
        raise UndoLogError(f"expected a JSON object, got {response.text[:200]!r}",
                           code="bad_response", status=response.status_code)
    raise error_from_response(response.status_code, body, response.text)


def _connection_error(exc: httpx.HTTPError) -> UndoLogConnectionError:
    where = getattr(getattr(exc, "request", None), "url", "")
    return UndoLogConnectionError(f"cannot reach undolog at {where}: {exc!r}")


def dumps(value: Any) -> bytes:
    return json.dumps(value, default=to_jsonable, separators=(",", ":")).encode()


def to_jsonable(value: Any) -> Any:
    """JSON for common non-JSON values (json.dumps calls it for what it cannot encode).

    The fallback is ``str()``: results still commit, but they come back as that string
    on replay, so tools should return JSON data for replay to be faithful.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "model_dump"):  # pydantic v2
        return value.model_dump(mode="json")
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if isinstance(value, (UUID, Decimal, PurePath)):
        return str(value)
    return str(value)


def wrap_result(value: Any) -> dict[str, Any]:
    """The ``result`` object to commit. The contract wants an object, so anything else
    (and a dict that is exactly ``{"value": ...}``, to stay unambiguous) is wrapped."""
    if isinstance(value, dict) and set(value) != {"value"}:
        return value
    return {"value": value}


def unwrap_result(stored: Any) -> Any:
    """Inverse of ``wrap_result`` for a replayed effect's stored result."""
    if isinstance(stored, dict) and set(stored) == {"value"}:
        return stored["value"]
    return stored
