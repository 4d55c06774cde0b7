"""SDK end-to-end fixtures: the real ASGI server and (where a walk, a deadline or an executor
must happen) a real Celery worker with beat, both package-scoped; an agent's `UndoLogClient`
on the server; a counting httpx transport; and a reviewer who decides through the REST API
with a user Token, on a thread of its own."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from rest_framework.authtoken.models import Token
from undolog import UndoLogClient

from tests.conftest import Persona, make_persona
from tests.processes import asgi_server, celery_worker
from tests.sdk import agent_tools


@pytest.fixture(scope="package")
def server(django_db_setup) -> str:
    """The real ASGI app under uvicorn; its base URL."""
    with asgi_server() as base:
        yield base


@pytest.fixture(scope="package")
def worker(django_db_setup):
    """A real Celery worker with beat (deadlines, undo sweeps, executor deliveries).

    Package-scoped, never session-scoped: a worker that outlived this package would take
    the tasks of the next package's own workers.
    """
    from undolog_site.celery import app

    app.control.purge()  # messages a previous run left in the test broker
    with celery_worker(beat=True, concurrency=2, UNDOLOG_WEBHOOK_RETRY_BASE_MS="100") as process:
        yield process


@pytest.fixture(autouse=True)
def _clean_tools() -> None:
    agent_tools.RAN.clear()


@pytest.fixture
def acme(transactional_db) -> Persona:
    return make_persona("acme")


def agent_client(persona: Persona, base: str, **options: Any) -> UndoLogClient:
    """The persona's agent, as the SDK sees the server."""
    options.setdefault("poll_wait", 10)
    return UndoLogClient(base, persona.key, **options)


@pytest.fixture
def client(acme: Persona, server: str) -> UndoLogClient:
    """The agent's client with the cleanup tools and `undo_send_email` registered."""
    client = agent_client(acme, server)
    client.register_compensation("undo_send_email", "1.0.0", "webhook", "https://hooks.example.com/undo")
    client.register(*agent_tools.TOOLS)
    yield client
    client.close()


def token_of(person) -> str:
    return Token.objects.get(user=person.user).key


class CountingTransport(httpx.BaseTransport):
    """A real HTTP transport that counts what goes over the wire."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.requests: list[tuple[str, str]] = []
        self.answers: list[tuple[str, str, int]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path))
        response = self.inner.handle_request(request)
        self.answers.append((request.method, request.url.path, response.status_code))
        return response

    def close(self) -> None:
        self.inner.close()


class AsyncCountingTransport(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.requests: list[tuple[str, str]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class Person:
    """Someone of the org on the REST API with a user Token (no Django test client: the
    real server decides, as a person's browser or script would make it)."""

    def __init__(self, base: str, token: str) -> None:
        self.http = httpx.Client(base_url=base, headers={"Authorization": f"Token {token}"}, timeout=10)

    def pending(self) -> list[dict]:
        response = self.http.get("/api/v1/approvals", params={"state": "pending"})
        response.raise_for_status()
        return response.json()["approvals"]

    def decide(self, approval_id: str, verb: str, reason: str = "") -> httpx.Response:
        return self.http.post(f"/api/v1/approvals/{approval_id}/{verb}", json={"reason": reason})

    def approve_edited(self, request: dict, args: dict, reason: str = "") -> None:
        """Approve the request with the args edited first (edit before approving)."""
        answer = self.http.post(f"/api/v1/approvals/{request['id']}/approve",
                                json={"args": args, "args_digest": request["args_digest"], "reason": reason})
        assert answer.status_code == 200, answer.text

    def patch_budget(self, agent: str, **limits: Any) -> dict:
        response = self.http.patch(f"/api/v1/agents/{agent}/budget", json=limits)
        assert response.status_code == 200, response.text
        return response.json()

    def next_pending(self, seen: set[str], timeout: float = 15) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fresh = [a for a in self.pending() if a["id"] not in seen]
            if fresh:
                seen.add(fresh[0]["id"])
                return fresh[0]
            time.sleep(0.05)
        raise AssertionError(f"no new approval request within {timeout} s")


class ReviewerThread(threading.Thread):
    """Decides the next approval requests, in order: `decisions` are ("approve" | "reject", reason).

    `delay` keeps each request pending that long first, so the agent is really waiting.
    """

    def __init__(self, person: Person, *decisions: tuple[str, str], delay: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.person, self.decisions, self.delay = person, list(decisions), delay
        self.asked: list[dict] = []
        self.answers: list[httpx.Response] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        seen: set[str] = set()
        try:
            for verb, reason in self.decisions:
                request = self.person.next_pending(seen)
                self.asked.append(request)
                time.sleep(self.delay)
                self.answers.append(self.person.decide(request["id"], verb, reason))
        except BaseException as exc:  # reported by finish(), in the test's thread
            self.error = exc

    def finish(self, timeout: float = 20) -> ReviewerThread:
        self.join(timeout)
        assert not self.is_alive(), "the reviewer is still waiting for requests"
        if self.error is not None:
            raise self.error
        assert [r.status_code for r in self.answers] == [200] * len(self.decisions), \
            [r.text for r in self.answers]
        return self


def reviewer(persona: Persona, base: str, *decisions: tuple[str, str], delay: float = 0.0) -> ReviewerThread:
    thread = ReviewerThread(Person(base, token_of(persona.reviewer)), *decisions, delay=delay)
    thread.start()
    return thread
