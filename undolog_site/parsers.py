"""The one JSON parser of the API: DRF's, with a nesting limit.

A body nested thousands of levels deep would otherwise overflow Python's recursion in the
parser or anywhere later that walks it (canonical JSON, digests, the database adapter): a
500. No legitimate tool call nests anywhere near the limit."""

from __future__ import annotations

import io
from typing import Any

from rest_framework.parsers import JSONParser

from undolog_site.errors import DomainError

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
        return data
