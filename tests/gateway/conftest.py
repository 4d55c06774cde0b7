"""Gateway end-to-end fixtures: the real undolog server and worker (package-scoped), the test's
issue tracker as the upstream MCP server, and a harness that starts `undolog gateway` as a real
process and talks to it with a real `mcp.ClientSession`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Persona, make_persona
from tests.processes import BASE_DIR, asgi_server, celery_worker, free_port
from tests.sdk.conftest import Person, ReviewerThread, token_of


@pytest.fixture(scope="package")
def server(django_db_setup) -> str:
    with asgi_server() as base:
        yield base


@pytest.fixture(scope="package")
def worker(django_db_setup):
    from undolog_site.celery import app

    app.control.purge()
    with celery_worker(beat=True, concurrency=2) as process:
        yield process


@pytest.fixture
def acme(transactional_db) -> Persona:
    return make_persona("acme")


TRACKER = [sys.executable, "-m", "tests.gateway.tracker"]


class Tracker:
    """The upstream's state file, read as the test's ground truth."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, Any]:
        return json.loads(self.path.read_text()) if self.path.exists() else {"issues": {}, "closed": [], "calls": []}

    def calls(self, tool: str | None = None) -> list[list[Any]]:
        return [c for c in self.read()["calls"] if tool is None or c[0] == tool]


class Harness:
    """Writes the gateway's TOML and starts `undolog gateway` over stdio for a ClientSession."""

    def __init__(self, tmp: Path, persona: Persona, base: str, *, trusted: bool = True, url: str | None = None,
                 approval_wait_s: float = 20, claim_timeout_s: int = 3600, extra: str = "") -> None:
        self.persona, self.base = persona, base
        self.tracker = Tracker(tmp / "tracker.json")
        self.config = tmp / "undolog-gateway.toml"
        where = f'url = "{url}"' if url else f"command = {json.dumps(TRACKER)}\ncwd = {json.dumps(str(BASE_DIR))}"
        self.config.write_text(f"""
[undolog]
approval_wait_s = {approval_wait_s}
progress_every_s = 0.2
claim_poll_s = 0.2
state_file = "gateway-session.json"

[servers.tracker]
{where}
trusted = {str(trusted).lower()}
env = {{ TRACKER_STATE = {json.dumps(str(self.tracker.path))} }}

[servers.tracker.tools.create_issue]
compensation = {{ tool = "close_issue", args = {{ number = "{{result.number}}" }}, retry_backoff_ms = 100 }}

[servers.tracker.tools.enable_labels]
tier = "safe"
{extra}
""")
        self.person = Person(base, token_of(persona.reviewer))
        self.admin = Person(base, token_of(persona.admin))

    def reviewer(self, *decisions: tuple[str, str], delay: float = 0.0) -> ReviewerThread:
        """Decides the next approval requests through the REST API, on a thread of its own."""
        thread = ReviewerThread(Person(self.base, self.person.http.headers["Authorization"].split()[1]),
                                *decisions, delay=delay)
        thread.start()
        return thread

    def env(self) -> dict[str, str]:
        return {**os.environ, "UNDOLOG_URL": self.base, "UNDOLOG_API_KEY": self.persona.key,
                "UNDOLOG_AGENT": self.persona.agent.name, "PYTHONUNBUFFERED": "1"}

    @asynccontextmanager
    async def client(self, **options: Any) -> AsyncIterator[Any]:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(command=sys.executable, args=["-m", "undolog", "gateway", "--config",
                                                                    str(self.config)],
                                       env=self.env(), cwd=str(BASE_DIR))
        async with stdio_client(params) as (read, write), ClientSession(read, write, **options) as session:
            await session.initialize()
            yield session


@pytest.fixture
def harness(tmp_path, acme, server, worker):
    def make(**options: Any) -> Harness:
        return Harness(tmp_path, acme, server, **options)

    return make


@pytest.fixture
def http_tracker(tmp_path):
    """The same tracker served over streamable HTTP; yields (url, state path)."""
    import httpx

    from tests.conftest import eventually

    port, state = free_port(), tmp_path / "tracker.json"
    process = subprocess.Popen([*TRACKER, "--http", str(port)], cwd=BASE_DIR,
                               env={**os.environ, "TRACKER_STATE": str(state)}, start_new_session=True)

    def up() -> bool:
        try:
            httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
            return True
        except httpx.HTTPError:
            return False

    try:
        eventually(up, timeout=20)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=10)


TOKENS = {"ana": "ana-token-0123456789abcdef", "bo": "bo-token-0123456789abcdef"}
CLIENTS = """
[clients.ana]
token = "${ANA_GATEWAY_TOKEN}"
started_by = "ana@example.com"

[clients.bo]
token = "${BO_GATEWAY_TOKEN}"
"""


def client_env() -> dict[str, str]:
    return {"ANA_GATEWAY_TOKEN": TOKENS["ana"], "BO_GATEWAY_TOKEN": TOKENS["bo"]}


def wait_until_listening(url: str, process: subprocess.Popen, timeout: float = 30) -> None:
    import httpx

    from tests.conftest import eventually

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"{process.args} exited with {process.returncode}")
        try:
            httpx.get(url, timeout=1)
            return True
        except httpx.HTTPError:
            return False

    eventually(up, timeout=timeout)


@contextmanager
def http_gateway(harness: Harness, port: int | None = None):
    """`undolog gateway --http` as a real process (its own process group); yields (url, Popen)."""
    from tests.processes import _stop

    port = port or free_port()
    process = subprocess.Popen([sys.executable, "-m", "undolog", "gateway", "--config", str(harness.config),
                                "--http", f"127.0.0.1:{port}"], env={**harness.env(), **client_env()},
                               cwd=BASE_DIR, start_new_session=True)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        wait_until_listening(url, process)
        yield url, process
    finally:
        _stop(process)


@asynccontextmanager
async def mcp_over_http(url: str, token: str | None = None, *, mode: str = "auto",
                        headers: dict[str, str] | None = None) -> AsyncIterator[Any]:
    """A real `mcp.Client` over streamable HTTP: `mode="auto"` is the package's default
    negotiation (2026-07-28 against this gateway), `"legacy"` the initialize handshake."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    sent = {**({"Authorization": f"Bearer {token}"} if token else {}), **(headers or {})}
    http = create_mcp_http_client(headers=sent)
    async with http, Client(streamable_http_client(url, http_client=http), mode=mode) as client:
        yield client
