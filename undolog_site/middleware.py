"""Site-wide answers: 503 while the database is away, the dashboard's Content-Security-Policy, and
the agents' two hot calls served before the layers they do not use."""

from __future__ import annotations

import logging
import re

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

from core import logs, observe, prepared
from lifecycle import preimages
from lifecycle.intercept import one_statement

log = logging.getLogger(__name__)


_DB_AWAY = (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)


class DatabaseUnavailableMiddleware:
    """A request whose database connection fails (PostgreSQL restarting, the pool out of
    connections, a failover) answers 503 `database_unavailable` with `Retry-After`, not 500.

    Nothing was half written: every write of a request is one transaction (or one statement on
    the fast path), which the server rolls back when the connection drops. But a connection lost
    while its commit (or the fast path's one statement) was on the way may have committed it:
    the server cannot know. So "nothing was changed" is said only when it is certain: the request
    never had a connection, or it reads only. A write whose connection broke under it answers
    `"outcome": "unknown"`: sent again, it is answered as the first was if it was recorded (a
    replay: the nemesis found a 503 whose call was recorded, issue 36). The connection is closed
    at the request's end as always, and the psycopg pool discards a broken one, so the next
    request gets a fresh connection: nothing to restart."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not isinstance(exception, _DB_AWAY):
            return None
        log.warning("database unavailable during %s %s: %s", request.method, request.path, exception)
        if request.method in ("GET", "HEAD", "OPTIONS") or connections[DEFAULT_DB_ALIAS].connection is None:
            body = {"error": "database_unavailable",
                    "message": "The database is not reachable right now; nothing was changed. Retry shortly."}
        else:
            body = {"error": "database_unavailable", "outcome": "unknown",
                    "message": "The database connection was lost during this request: it may have been recorded. "
                               "Send the same request again shortly: if it was recorded, it is answered as before."}
        response = JsonResponse(body, status=503)
        response["Retry-After"] = str(settings.UNDOLOG_DATABASE_RETRY_AFTER_S)
        return response


class NulRefusedMiddleware:
    """A path or query string holding NUL (`%00`) is refused with 400 `invalid` before any view
    sees it: PostgreSQL stores no NUL in text, so a lookup or filter by such a value would end
    as a DataError (a 500). No real name, id or filter contains one. Bodies are refused the same
    way by the JSON parser (core/parsers.py)."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        query = request.META.get("QUERY_STRING", "")
        if "\x00" in request.path_info or "%00" in query or "\x00" in query:
            message = "The path and the query string may not contain the NUL character (%00)."
            if request.path_info.startswith("/api/"):
                return JsonResponse({"error": "invalid", "message": message, "request_id": logs.current()},
                                    status=400)
            return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")
        return self.get_response(request)


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


_INTERCEPT = re.compile(r"/api/v1/sessions/([^/]+)/intercept")
_COMMIT = re.compile(r"/api/v1/effects/([^/]+)/commit")
_PRE_IMAGE = re.compile(r"/api/v1/effects/([^/]+)/pre-image")  # lifecycle/preimages.py


class FastPathMiddleware:
    """An agent's intercept and commit (`POST /api/v1/sessions/{id}/intercept`,
    `POST /api/v1/effects/{id}/commit`), answered by `lifecycle.intercept.one_statement` where it can, before the
    middleware below this one, URL resolution and DRF: every call of an agent fleet pays them, and
    they were ~0.14 ms of a worker's ~1 ms of CPU per intercept. An agent's Bearer-key call uses
    none of them: no session, cookie, CSRF token, message or static file.

    What they would have done to such an answer is done here or above: the request id, the 503
    while the database is away, the security headers and X-Frame-Options are the middleware
    above (settings.MIDDLEWARE's order); ALLOWED_HOSTS is checked as CommonMiddleware checks it
    (a 400); Content-Length is set by the fast path's answer. A request the fast path does not
    answer (or a database error in it) goes down the whole chain as any other, where the view
    gives the full pipeline's answer; so does every request on SQLite.

    The intercept's span and metrics (core/observe.py) are taken here, around whichever path
    answers, so that each intercept is observed once. A pre-image within its bounds
    (`POST /api/v1/effects/{id}/pre-image`, lifecycle/preimages.py) takes the same road."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method == "POST":
            path = request.path_info
            found = _INTERCEPT.fullmatch(path)
            if found:
                session_id = found[1]
                return observe.intercept(request, session_id,
                                         lambda: self._answer(request, one_statement.intercept, session_id))
            found = _COMMIT.fullmatch(path)
            if found:
                return self._answer(request, one_statement.commit, found[1])
            found = _PRE_IMAGE.fullmatch(path)
            if found:
                return self._answer(request, preimages.fast_keep, found[1])
        return self.get_response(request)

    def _answer(self, request: HttpRequest, fast, pk: str) -> HttpResponse:
        if prepared.available():
            request.get_host()  # DisallowedHost: Django answers 400, nothing is written
            try:
                answer = fast(request, pk)
            except _DB_AWAY:
                answer = None  # down the chain: the view meets the database again, or answers 503
            if answer is not None:
                return answer
        return self.get_response(request)
