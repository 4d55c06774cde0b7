"""Shared personas: an org with an agent, a reviewer, an admin, a viewer and a teammate;
and an outsider org whose people and agent must see nothing of the first."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from effects.models import CompensationFunction, Tool
from orgs.models import Agent, AgentKey, Membership, Organization


@dataclass
class Persona:
    org: Organization
    agent: Agent
    key: str
    api: APIClient  # as the agent
    reviewer: APIClient
    admin: APIClient
    viewer: APIClient

    def person(self, username: str, role: str) -> APIClient:
        return person_client(self.org, username, role)


def agent_client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def person_client(org: Organization, username: str, role: str) -> APIClient:
    user = get_user_model().objects.create_user(username, password="pw-" + username)
    Membership.objects.create(user=user, org=org, role=role)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    client.user = user
    return client


def make_persona(slug: str, agent_name: str = "cleanup") -> Persona:
    org = Organization.objects.create(slug=slug, name=slug.title())
    agent = Agent.objects.create(org=org, name=agent_name)
    _, key = AgentKey.issue(agent)
    return Persona(org=org, agent=agent, key=key, api=agent_client(key),
                   reviewer=person_client(org, f"{slug}-reviewer", "reviewer"),
                   admin=person_client(org, f"{slug}-admin", "admin"),
                   viewer=person_client(org, f"{slug}-viewer", "viewer"))


@pytest.fixture
def acme(db) -> Persona:
    return make_persona("acme")


@pytest.fixture
def outsider(db) -> Persona:
    return make_persona("globex")


@pytest.fixture
def staff(db):
    """A Django test client logged in as a superuser: the operator in the admin."""
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@x.io", "pw-root"))
    return client


STANDARD_TOOLS = [
    {"name": "list_inactive_accounts", "tier": "safe", "cost_weight": 0.01},
    {"name": "send_email", "tier": "compensable",
     "compensation": {"fn_name": "undo_send_email", "fn_version": "1.0.0", "args": {"to": "{to}"},
                      "max_retries": 3, "retry_backoff_ms": 1000}},
    {"name": "delete_account", "tier": "irreversible", "cost_weight": 5.0,
     "approval": {"reason": "Deletes an account for good", "risk_tags": ["data-loss"],
                  "estimated_impact": "account {account_id} and its data", "timeout_s": 900,
                  "auto_approve_on_timeout": False},
     "annotations": {"destructiveHint": True}},
]


def register_standard_tools(persona: Persona, target: str = "https://hooks.example.com/undo") -> None:
    CompensationFunction.objects.get_or_create(
        org=persona.org, fn_name="undo_send_email", fn_version="1.0.0",
        defaults={"handler": "webhook", "target": target, "timeout_ms": 5000})
    response = persona.api.post("/api/v1/tools", {"tools": STANDARD_TOOLS}, format="json")
    assert response.status_code == 200, response.content


@pytest.fixture
def tools(acme) -> dict[str, Tool]:
    register_standard_tools(acme)
    return {tool.name: tool for tool in Tool.objects.filter(org=acme.org)}


def open_session(persona: Persona) -> str:
    response = persona.api.post("/api/v1/sessions", {"agent": persona.agent.name}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


@pytest.fixture
def session_id(acme, tools) -> str:
    return open_session(acme)


def intercept(persona: Persona, session: str, tool: str, args: dict, step: int, **extra):
    return persona.api.post(f"/api/v1/sessions/{session}/intercept",
                            {"tool": tool, "args": args, "step_index": step, **extra}, format="json")


@pytest.fixture(autouse=True)
def _fast_passwords(settings) -> None:
    # PBKDF2's deliberate slowness would dominate every test that creates a person.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # The fast approval path's fan-out runs in the request, as the pipeline's does: tests read it
    # the moment the answer is back. tests/approvals/test_fast_approval.py runs it off the request
    # thread, as servers do (the ones tests start too).
    settings.UNDOLOG_FANOUT_AFTER_ANSWER = False


def eventually(check: Callable[[], Any], timeout: float = 15, every: float = 0.05) -> Any:
    """Poll until `check()` is truthy and return its value: for what another process does."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            assert value, f"not true after {timeout} s"
            return value
        time.sleep(every)


@pytest.fixture
def eager():
    """Celery tasks run in the test's own process, after the commit that enqueues them (unit tests
    only; end-to-end tests start a real worker)."""
    from undolog_site.celery import app

    saved = app.conf.task_always_eager, app.conf.task_eager_propagates
    app.conf.task_always_eager = app.conf.task_eager_propagates = True
    yield
    app.conf.task_always_eager, app.conf.task_eager_propagates = saved


def in_parallel(work: Callable[[int], Any], count: int) -> list:
    """Run work(n) in `count` threads released together (real concurrent clients, each with its own
    database connection); return what each returned, or fail with what any raised."""
    barrier = threading.Barrier(count)
    results: list = [None] * count
    errors: list = []

    def worker(n: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[n] = work(n)
        except Exception as exc:  # surfaced below: a thread must not fail silently
            errors.append(exc)
        finally:
            connection.close()  # back to the pool; a thread's connection is its own

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return results
