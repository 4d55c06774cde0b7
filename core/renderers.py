"""The one JSON renderer of the API: DRF's, ending each answer with a newline.

curl prints a body as it is: without the newline, two answers pasted one after the other run
together (`}{`) and a shell prompt lands on the end of the JSON. JSON parsers ignore the
trailing whitespace. The fast path (`lifecycle/intercept/one_statement.py`) ends its answers the same way, so a
client never sees which path answered."""

from __future__ import annotations

from typing import Any

from django.http import JsonResponse
from rest_framework.renderers import JSONRenderer


class NewlineJSONRenderer(JSONRenderer):
    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        body = super().render(data, accepted_media_type, renderer_context)
        return body + b"\n" if body else body


class JsonLineResponse(JsonResponse):
    """A `JsonResponse` ending with a newline, for the few JSON answers DRF does not render (the
    API's 404 and 500, /healthz)."""

    def __init__(self, data: Any, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self.content = self.content + b"\n"
