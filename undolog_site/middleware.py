"""Two site-wide answers: 503 while the database is away, and the dashboard's Content-Security-Policy."""

from __future__ import annotations

import logging

import psycopg
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import JsonResponse

log = logging.getLogger(__name__)


class DatabaseUnavailableMiddleware:
    """A request whose database connection fails (PostgreSQL restarting, the pool out of
    connections, a failover) answers 503 `database_unavailable` with `Retry-After`, not 500.

    Nothing was half written: every write of a request is one transaction (or one statement on
    the fast path), which the server rolls back when the connection drops. The connection is
    closed at the request's end as always, and the psycopg pool discards a broken one, so the
    next request gets a fresh connection: nothing to restart."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not isinstance(exception, (OperationalError, InterfaceError, psycopg.OperationalError,
                                      psycopg.InterfaceError)):
            return None
        log.warning("database unavailable during %s %s: %s", request.method, request.path, exception)
        response = JsonResponse({"error": "database_unavailable",
                                 "message": "The database is not reachable right now; nothing was changed. "
                                            "Retry shortly."}, status=503)
        response["Retry-After"] = str(settings.UNDOLOG_DATABASE_RETRY_AFTER_S)
        return response


class ContentSecurityPolicyMiddleware:
    """The dashboard, the login and the admin allow scripts from our own static files only: no
    inline script, no handler attribute, no eval. So a value that slips past escaping into a page
    (a tool's args, a reason) cannot run. Styles may be inline (the budget bars' widths).
    The API's own docs page (`/api/docs/`, Swagger UI) starts itself with an inline script and
    answers no HTML of ours, so `/api/` is left out."""

    POLICY = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
              "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; "
              "frame-ancestors 'none'")

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (not request.path.startswith("/api/") and "Content-Security-Policy" not in response
                and response.get("Content-Type", "").startswith("text/html")):
            response["Content-Security-Policy"] = self.POLICY
        return response
