"""The one JSON parser of the API: DRF's, with a nesting limit.

A body nested thousands of levels deep would otherwise overflow Python's recursion in the
parser or anywhere later that walks it (canonical JSON, digests, the database adapter): a
500. No legitimate tool call nests anywhere near the limit."""

from __future__ import annotations

import io
from typing import Any

from rest_framework.parsers import JSONParser

from core.errors import DomainError

MAX_JSON_DEPTH = 64


def too_deep() -> DomainError:
    return DomainError(f"The JSON body nests deeper than {MAX_JSON_DEPTH} levels, the limit.",
                       code="too_deep", status_code=400, limit=MAX_JSON_DEPTH)


def depth_exceeds(data: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether arrays/objects in `data` nest deeper than `limit`. Iterative: no recursion."""
    stack = [(data, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if level > limit:
            return True
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return False


def has_nul(data: Any) -> bool:
    """Whether a key or a string anywhere in `data` contains NUL. Iterative."""
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return True
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


class DepthLimitedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read()
        try:
            data = super().parse(io.BytesIO(raw), media_type, parser_context)
        except RecursionError:
            raise too_deep() from None
        # Nesting needs an opening bracket per level: a body with fewer cannot be too deep, and
        # counting bytes costs far less than walking the parsed value (the intercept's hot path).
        if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and depth_exceeds(data):
            raise too_deep()
        if b"\\u0000" in raw and has_nul(data):
            # PostgreSQL stores no NUL in text or jsonb: refuse it here, not as a DataError later.
            raise DomainError("Text in the body may not contain the NUL character (\\u0000).", code="invalid",
                              status_code=400, fields={"non_field_errors": "NUL (\\u0000) in a string."})
        return data
