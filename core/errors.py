"""Domain errors and the one exception handler that turns every error into
`{"error": "<code>", "message": "<sentence>"}` (plus `fields` for validation)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.http import Http404
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response

from core import logs


class DomainError(Exception):
    """An error a caller can act on. Views raise these; the handler renders them."""

    status_code = status.HTTP_400_BAD_REQUEST
    code = "error"
    message = "The request could not be processed."

    def __init__(self, message: str | None = None, *, code: str | None = None,
                 status_code: int | None = None, **extra: Any) -> None:
        self.message = message or self.message
        self.code = code or self.code
        self.status_code = status_code or self.status_code
        self.extra = extra
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message, **self.extra}


class Invalid(DomainError):
    code = "invalid"
    message = "Some fields are not valid."

    def __init__(self, fields: dict[str, Any], message: str | None = None) -> None:
        super().__init__(message or self.message, fields=fields)


class NotFound(DomainError):
    status_code = status.HTTP_404_NOT_FOUND
    code = "not_found"
    message = "Not found."


class Conflict(DomainError):
    status_code = status.HTTP_409_CONFLICT
    code = "conflict"


class Forbidden(DomainError):
    status_code = status.HTTP_403_FORBIDDEN
    code = "forbidden"
    message = "Your role in this organization does not allow this."


def _flatten(detail: Any) -> Any:
    if isinstance(detail, dict):
        return {key: _flatten(value) for key, value in detail.items()}
    if isinstance(detail, list):
        return [_flatten(item) for item in detail]
    return str(detail)


def _first_message(fields: Any) -> str:
    if isinstance(fields, dict) and fields:
        key, value = next(iter(fields.items()))
        inner = _first_message(value)
        return inner if key == "non_field_errors" else f"{key}: {inner}"
    if isinstance(fields, list) and fields:
        return _first_message(fields[0])
    return str(fields)


_DRF_CODES = {
    exceptions.ParseError: ("malformed_json", "The body is not valid JSON."),
    exceptions.NotAuthenticated: ("not_authenticated", "Authentication credentials were not provided."),
    exceptions.AuthenticationFailed: ("authentication_failed", "The credentials are not valid."),
    exceptions.PermissionDenied: ("forbidden", "You do not have permission to do this."),
    exceptions.NotFound: ("not_found", "Not found."),
    exceptions.MethodNotAllowed: ("method_not_allowed", "This method is not allowed here."),
    exceptions.UnsupportedMediaType: ("unsupported_media_type", "Send JSON (Content-Type: application/json)."),
    exceptions.NotAcceptable: ("not_acceptable", "This endpoint answers JSON only."),
    exceptions.Throttled: ("throttled", "Too many requests."),
}


def exception_handler(exc: Exception, context: dict) -> Response | None:
    response = _error_response(exc)
    if response is not None and isinstance(response.data, dict):
        # The id the logs of this request carry: a person quoting an error can be found in them.
        response.data["request_id"] = logs.current()
    return response


def _error_response(exc: Exception) -> Response | None:
    if isinstance(exc, DomainError):
        return Response(exc.body(), status=exc.status_code, headers=getattr(exc, "headers", None))
    if isinstance(exc, Http404):
        return Response({"error": "not_found", "message": "Not found."}, status=404)
    if isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    if isinstance(exc, RequestDataTooBig):
        return Response({"error": "too_large", "message": "The request body is too large."}, status=413)
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        if not isinstance(fields, dict):
            fields = {"non_field_errors": fields}
        return Response({"error": "invalid", "message": _first_message(fields), "fields": fields}, status=400)
    if isinstance(exc, exceptions.APIException):
        code, message = next(
            (pair for cls, pair in _DRF_CODES.items() if isinstance(exc, cls)),
            (exc.default_code, str(exc.detail)),
        )
        if isinstance(exc, exceptions.ParseError) and "JSON" not in str(exc.detail):
            message = str(exc.detail)
        elif str(exc.detail) != str(exc.default_detail):
            message = str(exc.detail)  # our own sentence (e.g. why a key was refused) beats the generic one
        headers = {}
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
            # DRF answers 403 when no authenticator offers a challenge; clients need 401.
            return Response({"error": code, "message": message}, status=401, headers=headers or
                            {"WWW-Authenticate": 'Bearer realm="api"'})
        return Response({"error": code, "message": message}, status=exc.status_code, headers=headers)
    return None


@csrf_exempt  # a POST to an unknown path is a JSON 404, not the CSRF middleware's HTML 403
def api_not_found(request, *args, **kwargs):
    """Unknown /api/ paths answer JSON like every other API error, in DEBUG too."""
    from core.renderers import JsonLineResponse

    return JsonLineResponse({"error": "not_found", "message": f"No API endpoint at {request.path}.",
                             "request_id": logs.current()}, status=404)


def server_error(request, *args, **kwargs):
    from core.renderers import JsonLineResponse

    return JsonLineResponse({"error": "server_error", "message": "Something went wrong on our side; it was logged.",
                             "request_id": logs.current()}, status=500)
