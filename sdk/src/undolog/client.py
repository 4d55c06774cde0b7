"""``UndoLogClient``: the agent's connection to an undolog server.

One class for sync and async code: plain methods block, ``a``-prefixed twins
(``aregister``, ``aget_session``...) are coroutines, as in Django's async API.
Sessions work with ``with`` and ``async with`` alike.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpx

from ._http import Call, Http
from .decorator import spec_of
from .session import Session, WaitInfo
from .tiers import ToolSpec

__all__ = ["UndoLogClient"]


class UndoLogClient:
    """Talks to one undolog server with one agent key.

    ``base_url`` defaults to ``$UNDOLOG_URL`` (else http://127.0.0.1:8000) and
    ``api_key`` to ``$UNDOLOG_API_KEY``. ``transport``/``async_transport`` take httpx
    transports (tests use them to fake or forbid the network). ``approval_timeout``
    (None: wait until the server decides or expires the request), ``poll_wait`` and
    ``on_wait`` are the defaults for the sessions this client opens.
    """

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *,
                 timeout: float = 10.0, transport: httpx.BaseTransport | None = None,
                 async_transport: httpx.AsyncBaseTransport | None = None,
                 approval_timeout: float | None = None, poll_wait: float = 30.0,
                 on_wait: Callable[[WaitInfo], None] | None = None) -> None:
        self._http = Http(base_url, api_key, timeout=timeout, transport=transport,
                          async_transport=async_transport)
        self._session_defaults: dict[str, Any] = {
            "approval_timeout": approval_timeout, "poll_wait": poll_wait, "on_wait": on_wait}

    @property
    def base_url(self) -> str:
        return self._http.base_url

    def __repr__(self) -> str:
        return f"<UndoLogClient {self.base_url}>"

    # -- sessions -------------------------------------------------------------

    def session(self, agent: str | None = None, metadata: Mapping[str, Any] | None = None,
                **options: Any) -> Session:
        """A new run of ``agent`` (default ``$UNDOLOG_AGENT``), opened on entering the block.

        ``options`` override the client's approval_timeout, poll_wait and on_wait;
        ``started_by`` names the person who started the run (they cannot approve its calls).
        """
        agent = agent or os.environ.get("UNDOLOG_AGENT")
        return Session(self._http, agent=agent, metadata=metadata,
                       **{**self._session_defaults, **options})

    def resume_session(self, session_id: str, **options: Any) -> Session:
        """Carry on an existing run, e.g. after a crash: calls already committed replay
        their stored results instead of running again."""
        return Session(self._http, session_id=str(session_id),
                       **{**self._session_defaults, **options})

    # -- registration -----------------------------------------------------------

    def register(self, *tools: Any) -> list[dict[str, Any]]:
        """Register (or update) decorated tools or ToolSpecs: ``POST /api/v1/tools`` (tools that
        undo by pre-image register their agent-handler compensation first)."""
        for call in _pre_image_compensations(tools):
            self._http.send(call)
        return self._http.send(_register_call(tools)).get("tools", [])

    async def aregister(self, *tools: Any) -> list[dict[str, Any]]:
        for call in _pre_image_compensations(tools):
            await self._http.asend(call)
        return (await self._http.asend(_register_call(tools))).get("tools", [])

    def register_compensation(self, fn_name: str, fn_version: str, handler: str, target: str = "",
                              timeout_ms: int = 5000, claim_timeout_s: int | None = None,
                              scope: str | None = None) -> dict[str, Any]:
        """Add a compensation function to the registry: ``POST /api/v1/compensations``.

        ``handler`` is ``"webhook"`` (``target`` an https URL), ``"python"`` (a
        dotted path the worker imports) or ``"agent"`` (no target: run by this side with
        ``serve_compensations``; ``claim_timeout_s`` is how long an entry waits for it).
        ``scope`` (agent handler): the system it undoes, e.g. ``"billing-prod"``; its entries are
        then claimed only by ``serve_compensations(..., scopes=[scope])``.
        """
        return self._http.send(_compensation_call(fn_name, fn_version, handler, target, timeout_ms,
                                                  claim_timeout_s, scope))

    def serve_compensations(self, handlers: Mapping[str, Callable[..., Any]],
                            **options: Any) -> int:
        """Run the ``agent``-handler compensations of this agent's rolled-back runs here, where
        the credentials are: claim, call ``handlers[fn_name](args)``, report. Blocks until
        ``stop`` (a ``threading.Event``) is set; see ``undolog.compensations.serve``."""
        from .compensations import serve

        return serve(self._http, handlers, **options)

    async def aregister_compensation(self, fn_name: str, fn_version: str, handler: str,
                                     target: str = "", timeout_ms: int = 5000,
                                     claim_timeout_s: int | None = None,
                                     scope: str | None = None) -> dict[str, Any]:
        return await self._http.asend(
            _compensation_call(fn_name, fn_version, handler, target, timeout_ms, claim_timeout_s,
                               scope))

    # -- reads -----------------------------------------------------------------------

    def get_session(self, session_id: str) -> dict[str, Any]:
        return self._http.send(Call("GET", f"/api/v1/sessions/{session_id}"))

    async def aget_session(self, session_id: str) -> dict[str, Any]:
        return await self._http.asend(Call("GET", f"/api/v1/sessions/{session_id}"))

    def get_effect(self, effect_id: str) -> dict[str, Any]:
        return self._http.send(Call("GET", f"/api/v1/effects/{effect_id}")).get("effect", {})

    async def aget_effect(self, effect_id: str) -> dict[str, Any]:
        answer = await self._http.asend(Call("GET", f"/api/v1/effects/{effect_id}"))
        return answer.get("effect", {})

    def get_budget(self, agent: str) -> dict[str, Any]:
        """``{"limits", "usage", "remaining"}`` of an agent."""
        return self._http.send(Call("GET", f"/api/v1/agents/{agent}/budget"))

    async def aget_budget(self, agent: str) -> dict[str, Any]:
        return await self._http.asend(Call("GET", f"/api/v1/agents/{agent}/budget"))

    # -- lifetime --------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    async def aclose(self) -> None:
        self._http.close()
        await self._http.aclose()

    def __enter__(self) -> UndoLogClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> UndoLogClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def _register_call(tools: Iterable[Any]) -> Call:
    specs = [spec_of(t) for t in _flatten(tools)]
    if not specs:
        raise ValueError("register() needs at least one tool")
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"tools registered twice in one call: {duplicates}")
    return Call("POST", "/api/v1/tools", {"tools": [s.to_dict() for s in specs]})


def _pre_image_compensations(tools: Iterable[Any]) -> list[Call]:
    """The ``agent``-handler functions of tools whose undo is a pre-image's restore: run here,
    by ``serve_compensations(undolog.preimages.handlers(...))``."""
    calls = []
    for spec in (spec_of(t) for t in _flatten(tools)):
        if spec.pre_image is not None and spec.compensation is not None:
            fn = spec.compensation
            calls.append(_compensation_call(fn.fn_name, fn.fn_version, "agent", "", 5000))
    return calls


def _flatten(tools: Iterable[Any]) -> Iterable[Any]:
    """``register(a, b)`` and ``register([a, b])`` both work."""
    for tool in tools:
        if isinstance(tool, (list, tuple)):
            yield from tool
        else:
            yield tool


def _compensation_call(fn_name: str, fn_version: str, handler: str, target: str,
                       timeout_ms: int, claim_timeout_s: int | None = None,
                       scope: str | None = None) -> Call:
    if handler not in ("webhook", "python", "agent"):
        raise ValueError("handler must be 'webhook', 'python' or 'agent'")
    body: dict[str, Any] = {"fn_name": fn_name, "fn_version": fn_version, "handler": handler,
                            "target": target, "timeout_ms": timeout_ms}
    if claim_timeout_s is not None:
        body["claim_timeout_s"] = claim_timeout_s
    if scope:
        body["scope"] = scope
    return Call("POST", "/api/v1/compensations", body)


def tool_specs(*tools: Any) -> list[ToolSpec]:
    """The specs of decorated tools, e.g. to print or diff them before registering."""
    return [spec_of(t) for t in _flatten(tools)]
