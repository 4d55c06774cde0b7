"""Request ids and the two log formats.

Every HTTP request gets an id: the caller's `X-Request-ID` when it is a sane token (a proxy or
load balancer usually sets one), else a new one. It goes back in the response's `X-Request-ID`,
into every error body as `request_id` (core/errors.py), and onto every log line written
while the request runs. `LOG_FORMAT=json` writes one JSON object per line (`ts`, `level`,
`logger`, `message`, `request_id`, and `exc` with the traceback when there is one).
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from contextvars import ContextVar
from datetime import UTC, datetime

HEADER = "X-Request-ID"
_META = "HTTP_X_REQUEST_ID"
# What we accept from outside: it ends up in logs and bodies, so no spaces, quotes or control characters.
_SANE = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
request_id: ContextVar[str | None] = ContextVar("request_id", default=None)


def current() -> str | None:
    return request_id.get()


class RequestIdMiddleware:
    """First in the chain, so every later middleware, view and log line sees the id."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        given = request.META.get(_META, "")
        rid = given if _SANE.fullmatch(given) else uuid.uuid4().hex
        request.request_id = rid
        token = request_id.set(rid)
        try:
            response = self.get_response(request)
        finally:
            request_id.reset(token)
        response[HEADER] = rid
        return response


class RequestIdFilter(logging.Filter):
    """Puts the current request id on every record (`%(request_id)s`, or the JSON field)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            # django.request logs a 4xx/5xx after the middleware chain returned: its record carries the request.
            request = getattr(record, "request", None)
            record.request_id = getattr(request, "request_id", None) or request_id.get() or "-"
        return True


class ClientErrorsAtDebug(logging.Filter):
    """django.request writes a WARNING for every 4xx. A 4xx is an answer, not a fault: a replayed
    call's 409, a budget's 429, a key's 401 each reach the caller with its error code and a
    message. So they are DEBUG lines (shown with LOG_LEVEL=DEBUG); 5xx stay ERRORs. On the
    django.request logger, where Django writes them."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if not isinstance(status, int) or not 400 <= status < 500 or record.levelno != logging.WARNING:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: what log shippers (Loki, CloudWatch, Datadog) parse without rules."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": None if getattr(record, "request_id", "-") == "-" else record.request_id,
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        status = getattr(record, "status_code", None)
        if isinstance(status, int):
            line["status_code"] = status
        return json.dumps(line, default=str)
