"""A 4xx is an answer the caller acts on, not a fault: django.request no longer logs a WARNING
for a replayed call's 409 or a budget's 429 (`make demo` alone printed four). A 5xx still logs."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from django.http import HttpResponse
from django.test import RequestFactory
from django.utils.log import log_response

from tests.budgets.conftest import Run, register_budget_tools, set_budget
from tests.conftest import intercept, open_session

pytestmark = pytest.mark.django_db


class Collected(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def request_log() -> Iterator[list[logging.LogRecord]]:
    """What django.request lets through its own filters (the project's console sees the same)."""
    logger, handler = logging.getLogger("django.request"), Collected()
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)


def warnings_of(records: list[logging.LogRecord]) -> list[str]:
    return [record.getMessage() for record in records if record.levelno >= logging.WARNING]


def test_a_replay_conflict_and_a_budget_refusal_log_no_warning(acme, request_log):
    register_budget_tools(acme)
    session = open_session(acme)
    intercept(acme, session, "delete_account", {"account_id": "acct-101"}, 1)
    conflict = intercept(acme, session, "send_email", {"to": "a@x.io"}, 2)  # the session waits for a reviewer
    set_budget(acme, max_irreversible_per_run=1)
    run = Run(acme)
    run.drop()
    refused = run.drop()

    assert (conflict.status_code, refused.status_code) == (409, 429)
    assert warnings_of(request_log) == []
    assert all(record.levelno == logging.DEBUG for record in request_log)  # shown only under LOG_LEVEL=DEBUG


def test_a_server_error_still_logs_as_an_error(request_log):
    request = RequestFactory().get("/api/v1/boom")

    log_response("Internal Server Error: %s", request.path, response=HttpResponse(status=500), request=request)

    assert warnings_of(request_log) == ["Internal Server Error: /api/v1/boom"]
    assert request_log[0].levelno == logging.ERROR
