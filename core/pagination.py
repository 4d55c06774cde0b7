"""The API's one paginator: DRF's cursor pagination, newest first, in the response shape the
streams have always had: `{<items>: [...], "next_cursor": str | null, "next": url | null}`
(plus `previous`). A bad page size or a cursor this API did not give out is a 400 naming
the parameter."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlparse

from rest_framework.exceptions import NotFound as DRFNotFound
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response

from core.errors import Invalid


def bad(name: str, message: str) -> Invalid:
    return Invalid({name: message}, f"{name}: {message}")


class NewestFirst(CursorPagination):
    """Keyset over (created, id), newest first: stable while new rows keep arriving."""

    ordering = ("-created", "-pk")
    page_size = 50
    max_page_size = 200
    page_size_query_param = "page_size"
    items_key = "results"  # the view's name for its list: "refusals", "events"

    def __init__(self, items_key: str | None = None) -> None:
        if items_key:
            self.items_key = items_key

    def get_page_size(self, request) -> int:
        raw = request.query_params.get(self.page_size_query_param) or str(self.page_size)
        if not raw.isdigit() or not 1 <= int(raw) <= self.max_page_size:
            raise bad("page_size", f"Must be a whole number from 1 to {self.max_page_size}.")
        return int(raw)

    def decode_cursor(self, request):
        if not request.query_params.get(self.cursor_query_param):
            return None  # absent or empty: the first page
        try:
            cursor = super().decode_cursor(request)
        except DRFNotFound:
            cursor = None
        else:
            # DRF's decoder skips characters outside base64 and takes an empty cursor for the
            # first page; every cursor this API gives out names a position or an offset.
            if cursor is None or cursor.position is not None or cursor.offset or cursor.reverse:
                return cursor
        raise bad("cursor", "Not a cursor this API gave out: follow `next` from the previous page.")

    def get_paginated_response(self, data: list[Any]) -> Response:
        next_url = self.get_next_link()
        next_cursor = parse_qs(urlparse(next_url).query)[self.cursor_query_param][0] if next_url else None
        return Response({self.items_key: data, "next_cursor": next_cursor, "next": next_url,
                         "previous": self.get_previous_link()})

    def get_paginated_response_schema(self, schema: dict) -> dict:
        return {"type": "object", "required": [self.items_key, "next_cursor", "next"], "properties": {
            self.items_key: schema,
            "next_cursor": {"type": "string", "nullable": True, "description": "Pass as ?cursor= for the next page."},
            "next": {"type": "string", "nullable": True, "format": "uri"},
            "previous": {"type": "string", "nullable": True, "format": "uri"}}}
