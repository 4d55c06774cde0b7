"""What one intercept reports: its span (GenAI semantic conventions for a tool call, plus
undolog's tier and decision) and its two metrics. The one call the intercept view makes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.http.request import RawPostDataException

from core import metrics, tracing

# The compensable fast path answers only these two (lifecycle/intercept/one_statement.py); the fast approval path
# (lifecycle/intercept/two_statements.py) names its tier and decision on the response (`undolog_outcome`).
_FAST = {201: "execute", 200: "replay"}


def intercept(request: HttpRequest, session_id: str, answer: Callable[[], HttpResponse]) -> HttpResponse:
    started = time.perf_counter()
    if tracing.on():
        response, (tier, decision, path) = _traced(request, session_id, answer)
    else:
        response = answer()
        tier, decision, path = _outcome(response, None)
    metrics.intercepted(tier, decision, path, time.perf_counter() - started)
    return response


def _traced(request: HttpRequest, session_id: str,
            answer: Callable[[], HttpResponse]) -> tuple[HttpResponse, tuple[str, str, str]]:
    with tracing.span("execute_tool", **{"gen_ai.operation.name": "execute_tool",
                                          "undolog.session.id": session_id}) as span:
        response = answer()
        # The span names the tool and the effect: read the body, the fast path's JSON included.
        body = _body(response, parse=True)
        outcome = _outcome(response, body)
        _annotate(span, request, body, *outcome[:2])
    return response, outcome


def _body(response: HttpResponse, parse: bool) -> dict[str, Any]:
    """The pipeline's answer as DRF left it; the fast path's rendered JSON only when `parse`."""
    data = getattr(response, "data", None)
    if isinstance(data, dict):
        return data
    try:
        return json.loads(response.content) if parse else {}
    except ValueError:
        return {}


def _outcome(response: HttpResponse, body: dict[str, Any] | None) -> tuple[str, str, str]:
    """(tier, decision, path): a fast answer by its status or its `undolog_outcome`; else the body says."""
    if response.get("X-Undolog-Path") == "fast":
        tier, decision = getattr(response, "undolog_outcome", None) or (
            "compensable", _FAST.get(response.status_code, "error"))
        return tier, decision, "fast"
    body = _body(response, parse=False) if body is None else body
    effect = body.get("effect") if isinstance(body.get("effect"), dict) else {}
    decision = body.get("decision") or body.get("error") or str(response.status_code)
    return effect.get("tier") or "none", decision, "slow"


def _annotate(span: Any, request: HttpRequest, body: dict[str, Any], tier: str, decision: str) -> None:
    effect = body.get("effect") if isinstance(body.get("effect"), dict) else {}
    tool = effect.get("tool") or _requested_tool(request)
    span.update_name(f"execute_tool {tool}" if tool else "execute_tool")
    attributes = {"gen_ai.tool.name": tool, "gen_ai.tool.type": "function", "gen_ai.tool.call.id": effect.get("id"),
                  "undolog.tier": tier, "undolog.decision": decision, "error.type": body.get("error")}
    span.set_attributes({key: value for key, value in attributes.items() if value is not None})


def _requested_tool(request: HttpRequest) -> str | None:
    try:
        tool = json.loads(request.body).get("tool")
    except (ValueError, AttributeError, RawPostDataException):  # DRF may have read the stream already
        return None
    return tool if isinstance(tool, str) else None
