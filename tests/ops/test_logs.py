"""Request ids and JSON logs: every line of a real server parses as JSON, and the id in an error
body is the one on the request's log lines and in its X-Request-ID header."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from tests.processes import asgi_server

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_error_body_carries_the_request_id_of_its_header(client):
    response = client.get(f"/api/v1/sessions/{uuid.uuid4()}")

    assert response.status_code == 401
    assert response.json()["request_id"] == response["X-Request-ID"]
    assert len(response["X-Request-ID"]) == 32


def test_it_keeps_a_sane_request_id_from_the_caller_and_replaces_an_unsafe_one(client):
    kept = client.get("/api/v1/nowhere", HTTP_X_REQUEST_ID="lb-7f3a.42")
    replaced = client.get("/api/v1/nowhere", HTTP_X_REQUEST_ID='bad id"\n')

    assert kept.json()["request_id"] == kept["X-Request-ID"] == "lb-7f3a.42"
    assert replaced.json()["request_id"] == replaced["X-Request-ID"] != 'bad id"\n'


def test_json_logs_parse_line_by_line_and_name_the_error_bodys_request_id(acme):
    log_path = Path(settings.VAR_DIR) / f"test-asgi-{os.getpid()}.log"
    start = log_path.stat().st_size if log_path.exists() else 0
    # LOG_LEVEL=DEBUG: a 4xx is a DEBUG line (an answer, not a fault), still with its request id.
    with asgi_server(LOG_FORMAT="json", LOG_LEVEL="DEBUG") as base:
        refused = httpx.post(f"{base}/api/v1/sessions/{uuid.uuid4()}/intercept", json={},
                             headers={"Authorization": "Bearer ul_nope_nope"})
        given = httpx.get(f"{base}/api/v1/sessions/{uuid.uuid4()}", headers={
            "Authorization": f"Bearer {acme.key}", "X-Request-ID": "from-the-proxy-1"})
    with open(log_path, "rb") as log:
        log.seek(start)
        lines = [json.loads(line) for line in log.read().decode().splitlines() if line.strip()]

    assert refused.status_code == 401 and given.status_code == 404
    assert refused.json()["request_id"] == refused.headers["X-Request-ID"]
    assert given.json()["request_id"] == given.headers["X-Request-ID"] == "from-the-proxy-1"
    assert lines, "the server wrote no log lines"
    assert all({"ts", "level", "logger", "message", "request_id"} <= set(line) for line in lines)
    by_id = {line["request_id"]: line for line in lines if line["request_id"]}
    assert by_id[refused.json()["request_id"]]["level"] == "DEBUG"
    assert str(refused.request.url.path) in by_id[refused.json()["request_id"]]["message"]
    assert by_id["from-the-proxy-1"]["status_code"] == 404
