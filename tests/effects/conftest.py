"""Fixtures of the compensation tests: a real webhook receiver, Celery's eager mode for unit
tests, and a session with an undo stack built through the API."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.conf import settings

from effects.models import Effect, Session, UndoEntry
from tests.conftest import Persona, intercept, open_session
from tests.receiver import Receiver

# The fleet walk's rounds exist on PostgreSQL only (SQLite walks each run on its own): its file is
# collected by the PostgreSQL run only (CI runs both).
# So are the rewind's races (real concurrent clients: SQLite has one writer at a time).
collect_ignore = [] if settings.DATABASES["default"]["ENGINE"].endswith("postgresql") else [
    "test_fleet_walk.py", "test_rewind_races.py"]


@pytest.fixture
def receiver(acme) -> Receiver:
    """Verifies signatures with acme's secret and dedupes by Idempotency-Key."""
    with Receiver(secrets=[acme.org.webhook_secret]) as r:
        yield r



@dataclass
class Stack:
    persona: Persona
    session_id: str
    effects: list[str]  # by step, lowest first
    entries: list[str]  # the same order

    @property
    def session(self) -> Session:
        return Session.objects.get(pk=self.session_id)

    def entry(self, n: int) -> UndoEntry:
        return UndoEntry.objects.get(pk=self.entries[n])

    def fail(self, error: str = "the run failed"):
        return self.persona.api.post(f"/api/v1/sessions/{self.session_id}/fail", {"error": error}, format="json")


def register_undo(persona: Persona, target: str, *, handler: str = "webhook", timeout_ms: int = 2000,
                  max_retries: int = 3, retry_backoff_ms: int = 10, tool: str = "send_email",
                  fn_name: str = "undo_send_email", fn_version: str = "1.0.0") -> None:
    response = persona.api.post("/api/v1/compensations", {
        "fn_name": fn_name, "fn_version": fn_version, "handler": handler, "target": target,
        "timeout_ms": timeout_ms}, format="json")
    assert response.status_code in (200, 201), response.content
    response = persona.api.post("/api/v1/tools", {"tools": [
        {"name": tool, "tier": "compensable",
         "compensation": {"fn_name": fn_name, "fn_version": fn_version, "args": {"to": "{to}"},
                          "max_retries": max_retries, "retry_backoff_ms": retry_backoff_ms}}]}, format="json")
    assert response.status_code == 200, response.content


def build_stack(persona: Persona, target: str, n: int = 3, *, commit: bool = True, **undo) -> Stack:
    """A running session with `n` compensable calls at steps 1..n, each committed."""
    register_undo(persona, target, **undo)
    session_id = open_session(persona)
    effects, entries = [], []
    for step in range(1, n + 1):
        response = intercept(persona, session_id, undo.get("tool", "send_email"), {"to": f"user{step}@x.io"}, step)
        assert response.status_code == 201, response.content
        effect_id = response.json()["effect"]["id"]
        if commit:
            assert persona.api.post(f"/api/v1/effects/{effect_id}/commit", {"result": {"step": step}},
                                    format="json").status_code == 200
        effects.append(effect_id)
        entries.append(str(Effect.objects.get(pk=effect_id).undo_entry.pk))
    return Stack(persona, session_id, effects, entries)


@pytest.fixture
def stack_of(acme, receiver):
    def make(n: int = 3, **undo) -> Stack:
        return build_stack(acme, receiver.url, n, **undo)

    return make
