"""The HTTP gateway's access log (issue 37): one line per HTTP request, turned-away ones
included, saying which client, which MCP method and tool, which run, the status and the time,
never a token; JSON lines under LOG_FORMAT=json, as the undolog server writes them. A real
`undolog gateway --http` process, real MCP clients, the tracker, the real server."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager

import anyio
import httpx
import pytest

from effects.models import Session
from tests.gateway.conftest import CLIENTS, TOKENS, client_env, mcp_over_http, wait_until_listening
from tests.processes import BASE_DIR, _stop, free_port

pytestmark = [pytest.mark.django_db(transaction=True)]


@contextmanager
def logging_gateway(harness, log_path, **env):
    """`undolog gateway --http` with its stderr (where its logs go) in `log_path`."""
    port = free_port()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "undolog", "gateway", "--config", str(harness.config), "--http",
             f"127.0.0.1:{port}"], env={**harness.env(), **client_env(), **env}, cwd=BASE_DIR,
            stderr=log, start_new_session=True)
        url = f"http://127.0.0.1:{port}/mcp"
        try:
            wait_until_listening(url, process)
            yield url
        finally:
            _stop(process)


async def one_call(url: str, token: str) -> None:
    async with mcp_over_http(url, token, mode="legacy") as client:
        created = await client.call_tool("create_issue", {"title": "logged"})
        assert not created.is_error


def test_every_request_gets_one_json_access_line_with_client_tool_run_and_status_never_a_token(
        harness, acme, tmp_path):
    gateway = harness(extra=CLIENTS)
    log_path = tmp_path / "gateway.log"
    with logging_gateway(gateway, log_path, LOG_FORMAT="json") as url:
        assert httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).status_code == 401
        wrong = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                           headers={"Authorization": "Bearer not-a-client-token-at-all"})
        assert wrong.status_code == 401
        anyio.run(one_call, url, TOKENS["ana"])
    text = log_path.read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    access = [line for line in lines if line["logger"] == "undolog.gateway.access"]

    refused = [line for line in access if line["status"] == 401]
    assert [line["http"] for line in refused] == ["GET", "POST", "POST"]  # the readiness probe, then ours
    assert {line["client"] for line in refused} == {"-"}
    call = [line for line in access if line.get("method") == "tools/call"]
    assert len(call) == 1
    run = Session.objects.get(org=acme.org)
    assert call[0] | {"ms": 0, "ts": 0, "remote": 0} == {
        "ts": 0, "level": "INFO", "logger": "undolog.gateway.access", "message": call[0]["message"],
        "client": "ana", "http": "POST", "path": "/mcp", "method": "tools/call", "tool": "create_issue",
        "run": str(run.pk), "status": 200, "ms": 0, "outcome": "ok", "remote": 0}
    assert call[0]["ms"] > 0 and call[0]["remote"] == "127.0.0.1"
    assert {"initialize", "notifications/initialized"} <= {line.get("method") for line in access}
    assert any(line["http"] == "DELETE" and line["client"] == "ana" for line in access)  # the client left
    for token in (*TOKENS.values(), "not-a-client-token-at-all", acme.key):
        assert token not in text


def test_text_access_lines_are_one_line_each_and_name_the_client(harness, acme, tmp_path):
    gateway = harness(extra=CLIENTS)
    log_path = tmp_path / "gateway.log"
    with logging_gateway(gateway, log_path) as url:
        assert httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                     "params": {"name": "create_issue\nforged line"}}).status_code == 401
        anyio.run(one_call, url, TOKENS["bo"])
    lines = [line for line in log_path.read_text().splitlines() if " undolog.gateway.access " in line]
    assert any("access client=- http=POST path=/mcp status=401" in line for line in lines)
    call = [line for line in lines if "method=tools/call" in line and "status=200" in line]
    assert len(call) == 1 and "client=bo" in call[0] and "tool=create_issue" in call[0]
    assert "forged line" not in log_path.read_text().replace("forged?line", "")
    assert TOKENS["bo"] not in log_path.read_text()
