"""JSON answers end with a newline, so curl outputs pasted one after the other do not run
together (`}{`); the fast path's answers end exactly as the pipeline's do."""

from __future__ import annotations

import json

import pytest

from core.renderers import NewlineJSONRenderer
from lifecycle.intercept import wire
from tests.conftest import intercept, open_session

pytestmark = pytest.mark.django_db(transaction=True)


def ends_with_one_newline(content: bytes) -> bool:
    return content.endswith(b"}\n") and not content.endswith(b"\n\n") and json.loads(content) is not None


def test_api_answers_and_errors_end_with_a_newline(acme, tools, client):
    session_id = open_session(acme)
    answers = [
        acme.api.post("/api/v1/sessions", {"agent": acme.agent.name}, format="json"),
        intercept(acme, session_id, "send_email", {"to": "a@x.io", "subject": "hi"}, 1),  # fast or full path
        acme.api.get(f"/api/v1/sessions/{session_id}"),
        acme.api.post("/api/v1/sessions", {"agent": ""}, format="json"),  # 400
        acme.api.get("/api/v1/no-such-thing"),  # the API's own 404
        client.get("/healthz"),
    ]

    assert [a.status_code for a in answers] == [201, 201, 200, 400, 404, 200]
    for answer in answers:
        assert ends_with_one_newline(answer.content), answer.content[-40:]


def test_the_fast_path_writes_the_same_bytes_as_the_api_renderer():
    body = {"decision": "execute", "effect": {"id": "e-1", "args": {"to": "ä@x.io", "n": [1, 2.5, None, True]}}}

    fast = wire.respond(201, body)

    assert fast.content == NewlineJSONRenderer().render(body)
    assert fast["Content-Length"] == str(len(fast.content))
