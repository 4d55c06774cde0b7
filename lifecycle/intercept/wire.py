"""The fast paths' wire: a request's key and JSON body read before DRF, and answers written as
the API writes them, for the calls the one-statement and two-statement paths (and the pre-images'
keep, lifecycle/preimages.py) answer themselves."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse

from core.parsers import MAX_JSON_DEPTH, depth_exceeds, has_nul
from orgs.models import AgentKey, RememberedKey


def remembered_key(request) -> RememberedKey | None:
    scheme, _, raw = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return AgentKey.remembered(raw.strip()) if scheme == "Bearer" else None


def json_body(request, *, few_values: bool = False) -> Any:
    """The body, parsed by orjson (~10x DRF's parser), under the API parser's nesting and NUL
    rules; None when the slow path must answer. orjson refuses a little more than DRF's parser
    (lone surrogates), and reads an integer past 64 bits as a float, losing digits: those too go
    to the slow path, which decides as always, so the fast path never answers differently, it
    only answers less. `few_values`: a body of a few large strings (a pre-image: a file's text),
    where walking the parsed values for such a float is cheaper than scanning the text for 19
    digits in a row (0.3 ms of a 10 KiB body full of digits)."""
    if request.content_type != "application/json":
        return None
    try:
        raw = request.body
        data = orjson.loads(raw)
    except (orjson.JSONDecodeError, RequestDataTooBig):
        return None
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and depth_exceeds(data):
        return None
    if b"\\u0000" in raw and has_nul(data):
        return None
    if (few_values or _NINETEEN_DIGITS.search(raw)) and has_inexact_number(data):
        return None
    return data


# Every integer of up to 18 digits fits 64 bits; orjson reads a longer one past 64 bits as a float.
_NINETEEN_DIGITS = re.compile(rb"\d{19}")


def has_inexact_number(data: Any) -> bool:
    """Whether `data` holds a float of 2**63 or more: orjson's reading of an integer it could not
    keep (or a float that large, which the slow path reads just as well). Iterative."""
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, float):
            if abs(value) >= 2.0**63:
                return True
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def dumps(value: Any) -> bytes:
    """JSON by orjson (~5x the standard library), written as DRF's renderer writes it (compact
    UTF-8). orjson refuses integers past 64 bits, which the API's own parser accepts: a tool's
    compensation args or a call's args stored by the full pipeline may hold one, so those values
    are written by the standard library instead of failing."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def respond(status: int, body: dict[str, Any]) -> HttpResponse:
    # Every value is already a str, number, bool, None or JSON that was stored.
    content = dumps(body) + b"\n"  # as the API's renderer ends its answers (core/renderers.py)
    response = HttpResponse(content, status=status, content_type="application/json")
    response["Content-Length"] = str(len(content))  # CommonMiddleware's, which this answer passes by
    response["X-Undolog-Path"] = "fast"  # which path answered: for operators and tests, never for clients
    return response
