"""A request whose database connection fails answers 503 `database_unavailable`, and says
"nothing was changed" only when that is certain: it never had a connection, or it only reads. A
write whose connection broke under it may have been committed (the commit, or the fast path's one
statement, was on the way): it says the outcome is unknown, and that the same request sent again
is answered as before if it was recorded. The nemesis found a 503 "nothing was changed" whose call
had been recorded (a web node's link went down mid-intercept; issue 36)."""

from __future__ import annotations

import json

import pytest
from django.db import OperationalError, connection
from django.test import RequestFactory

from undolog_site.middleware import DatabaseUnavailableMiddleware

BROKE = OperationalError("consuming input failed: server closed the connection unexpectedly")


def answer(request) -> tuple[int, dict]:
    response = DatabaseUnavailableMiddleware(lambda r: None).process_exception(request, BROKE)
    assert response["Retry-After"]
    return response.status_code, json.loads(response.content)


@pytest.mark.django_db(transaction=True)
def test_a_write_whose_connection_broke_under_it_says_the_outcome_is_unknown():
    connection.ensure_connection()
    status, body = answer(RequestFactory().post("/api/v1/sessions/x/intercept"))
    assert status == 503 and body["error"] == "database_unavailable" and body["outcome"] == "unknown"
    assert "may have been recorded" in body["message"] and "nothing was changed" not in body["message"]


@pytest.mark.django_db(transaction=True)
def test_a_read_or_a_request_that_never_had_a_connection_changed_nothing():
    connection.ensure_connection()
    status, body = answer(RequestFactory().get("/api/v1/effects/x"))
    assert status == 503 and "outcome" not in body and "nothing was changed" in body["message"]
    connection.close()
    status, body = answer(RequestFactory().post("/api/v1/sessions"))
    assert status == 503 and "outcome" not in body and "nothing was changed" in body["message"]
