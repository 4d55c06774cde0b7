"""The OpenAPI schema as the contract: typed response shapes, documented errors, examples.

Response bodies are TypedDicts (one per resource, e.g. `effects.shapes.EffectDict`): the
functions that build a body are annotated with them, and `shape()` turns one into the
serializer drf-spectacular reads, so the schema documents what the code returns (a
schemathesis run checks every answer against it: tests/test_schema.py). Errors are one
`Error` body; `errors(404, 409, ...)` documents which statuses an operation answers, and the
codes it may carry (`CODES`)."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, NotRequired, Required, Union, get_args, get_origin, get_type_hints

from drf_spectacular.utils import OpenApiExample, OpenApiResponse
from rest_framework import serializers

from core.validation import StrictSerializer

_SHAPES: dict[type, type[serializers.Serializer]] = {}


def shape(typed: type) -> type[serializers.Serializer]:
    """The (response-only) serializer for a TypedDict; its component is named after it,
    without a `Dict` suffix (`EffectDict` → `Effect`)."""
    if typed not in _SHAPES:
        hints = get_type_hints(typed, include_extras=True)
        fields = {name: _field(hint, name in typed.__required_keys__) for name, hint in hints.items()}
        name = typed.__name__.removesuffix("Dict")
        _SHAPES[typed] = type(name, (serializers.Serializer,),
                              {**fields, "__doc__": typed.__doc__, "__module__": typed.__module__})
    return _SHAPES[typed]


def _field(hint: Any, required: bool, **options: Any) -> serializers.Field:
    origin, args = get_origin(hint), get_args(hint)
    if origin in (NotRequired, Required):
        return _field(args[0], origin is Required, **options)
    if origin in (Union, types.UnionType):
        rest = [arg for arg in args if arg is not type(None)]
        if len(rest) == 1:
            return _field(rest[0], required, allow_null=type(None) in args, **options)
        return serializers.JSONField(required=required, allow_null=type(None) in args, **options)
    options["required"] = required
    if origin is Literal:
        return serializers.ChoiceField(choices=list(args), **options)
    if typing.is_typeddict(hint):
        return shape(hint)(**options)
    if origin is list or hint is list:
        return serializers.ListField(child=_field(args[0], True) if args else serializers.JSONField(), **options)
    if origin is dict or hint is dict:
        child = _field(args[1], True) if args and args[1] is not Any else serializers.JSONField()
        return serializers.DictField(child=child, **options)
    simple = {str: serializers.CharField, int: serializers.IntegerField, float: serializers.FloatField,
              bool: serializers.BooleanField}
    if hint in simple:
        return simple[hint](**options)
    return serializers.JSONField(**options)  # Any: any JSON value


class ErrorDict(typing.TypedDict):
    """Every error: a code to match on and a sentence to show; `fields` for validation; some
    codes add their own keys (`state`, `approval`, `limit`, ...)."""

    error: str
    message: str
    fields: NotRequired[dict[str, Any]]
    request_id: NotRequired[str]  # the request's X-Request-ID: the same id is on its log lines


# What each status means, and the codes it may carry (DESIGN.md's API contract).
CODES: dict[int, tuple[str, list[str]]] = {
    400: ("Bad input; nothing was written.", ["invalid", "malformed_json", "too_deep"]),
    401: ("No credentials, or credentials that are not valid.", ["not_authenticated", "authentication_failed"]),
    403: ("The caller may not do this (an agent key on a people's endpoint, or a role too low).",
          ["forbidden"]),
    404: ("Not in the caller's organization (or not at all).", ["not_found"]),
    409: ("The row is not in a state that allows this.", ["conflict"]),
    413: ("The body is too large.", ["too_large"]),
    423: ("The agent is suspended or stopped.", ["agent_suspended"]),
    429: ("Past the key's or the org's rate limit (`limit`, `retry_after_s` and `Retry-After` say which and "
          "when); nothing was done.", ["rate_limited"]),
    503: ("The database is not reachable right now (`Retry-After`); nothing was changed, unless the body says "
          "`\"outcome\": \"unknown\"` (the connection broke under a write, which may have been recorded: send the "
          "same request again, and a recorded one is answered as before).", ["database_unavailable"]),
}


def errors(*statuses: int, codes: dict[int, list[str]] | None = None) -> dict[int, OpenApiResponse]:
    """`responses` entries for the error statuses an operation answers, with its own codes."""
    body = shape(ErrorDict)
    out = {}
    for status in statuses:
        meaning, common = CODES.get(status, ("", []))
        listed = (codes or {}).get(status) or common
        out[status] = OpenApiResponse(body, description=f"{meaning} Codes: {', '.join(listed)}.",
                                      examples=[OpenApiExample(code, value={"error": code, "message": "…"},
                                                               response_only=True, status_codes=[str(status)])
                                                for code in listed])
    return out


def ok(typed: type | None, status: int = 200, description: str = "",
       examples: list[OpenApiExample] | None = None) -> dict[int, OpenApiResponse]:
    return {status: OpenApiResponse(shape(typed) if typed else None, description=description,
                                    examples=examples or [])}


# Constraints drf-spectacular cannot read off a serializer (a `many=True` list's
# allow_empty=False): component → property → extra schema keys. See `constrain()`.
_CONSTRAINTS: dict[str, dict[str, dict[str, Any]]] = {}


def constrain(component: str, prop: str, **schema: Any) -> None:
    """Add schema keys to one property of a request component (e.g. minItems of a list)."""
    _CONSTRAINTS.setdefault(component, {})[prop] = schema


def add_common_errors(result: dict, generator, request, public) -> dict:
    """Postprocessing hook: every operation under /api/v1/ documents 400 (malformed JSON, too
    deep), 401, 403, 429 (rate limited) and 503 (database unavailable), and every operation with a
    path id its 404, unless it says more.
    Request bodies are strict (an unknown field is a 400, `StrictSerializer`): they say so."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") and component.get("type") == "object":
            component["additionalProperties"] = False
        if component.get("description") == StrictSerializer.__doc__:
            del component["description"]  # inherited, not the component's own
        for prop, extra in _CONSTRAINTS.get(name, {}).items():
            component["properties"][prop].update(extra)
    error_ref = {"$ref": "#/components/schemas/Error"}
    for path, operations in result.get("paths", {}).items():
        if not path.startswith("/api/v1/"):
            continue
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            wanted = [400, 401, 403] + ([404] if "{" in path else []) + [429, 503]
            for status in wanted:
                meaning, codes = CODES[status]
                if status == 429 and "429" in responses:  # the intercept: the budget's refusal too
                    responses["429"]["description"] += " Or `rate_limited` (an error body): " + meaning
                    continue
                responses.setdefault(str(status), {
                    "description": f"{meaning} Codes: {', '.join(codes)}.",
                    "content": {"application/json": {"schema": error_ref}}})
    return result
