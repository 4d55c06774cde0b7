"""Budget test helpers: a compensable tool flagged irreversible (it counts toward the caps
without waiting for a reviewer), policies set through the API, and run helpers."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model

from approvals.models import ApprovalRequest
from effects.models import CompensationFunction, Effect, Session
from orgs.models import Membership
from tests.conftest import Persona, intercept, open_session, register_standard_tools

DROP_TABLE = {"name": "drop_table", "tier": "compensable", "irreversible": True, "cost_weight": 1,
              "compensation": {"fn_name": "restore_table", "fn_version": "1.0.0", "args": {"table": "{table}"}}}


def register_budget_tools(persona: Persona, *extra: dict) -> None:
    register_standard_tools(persona)
    CompensationFunction.objects.get_or_create(
        org=persona.org, fn_name="restore_table", fn_version="1.0.0",
        defaults={"handler": "webhook", "target": "https://hooks.example.com/restore", "timeout_ms": 5000})
    response = persona.api.post("/api/v1/tools", {"tools": [DROP_TABLE, *extra]}, format="json")
    assert response.status_code == 200, response.content


@pytest.fixture
def budget_tools(acme) -> None:
    register_budget_tools(acme)


def set_budget(persona: Persona, agent: str | None = None, **settings: Any) -> dict:
    url = f"/api/v1/agents/{agent or persona.agent.name}/budget"
    response = persona.admin.patch(url, settings, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def set_org_budget(persona: Persona, **settings: Any) -> dict:
    response = persona.admin.patch("/api/v1/org/budget", settings, format="json")
    assert response.status_code == 200, response.content
    return response.json()


class Run:
    """One session of the persona's agent, with a step counter."""

    def __init__(self, persona: Persona) -> None:
        self.persona = persona
        self.id = open_session(persona)
        self.step = 0

    def call(self, tool: str, args: dict | None = None, safe: list[str] = (), **extra: Any):
        safe_calls = []
        for name in safe:
            self.step += 1
            safe_calls.append({"tool": name, "step_index": self.step, "args": {}})
        self.step += 1
        body = {"safe_calls": safe_calls} if safe_calls else {}
        return intercept(self.persona, self.id, tool, args if args is not None else {"n": self.step}, self.step,
                         **body, **extra)

    def drop(self, **extra: Any):
        return self.call("drop_table", {"table": f"t{self.step + 1}"}, **extra)

    def complete(self):
        return self.persona.api.post(f"/api/v1/sessions/{self.id}/complete")

    def fail(self, error: str = "it broke"):
        return self.persona.api.post(f"/api/v1/sessions/{self.id}/fail", {"error": error}, format="json")

    @property
    def session(self) -> Session:
        return Session.objects.get(pk=self.id)

    def budget(self) -> dict:
        response = self.persona.viewer.get(f"/api/v1/sessions/{self.id}/budget")
        assert response.status_code == 200, response.content
        return response.json()


def _reviewer(effect: Effect, username: str):
    user, _ = get_user_model().objects.get_or_create(username=username)
    Membership.objects.get_or_create(user=user, org_id=effect.org_id, defaults={"role": "reviewer"})
    return user


def approve(effect_id: str, reviewer: str = "alice") -> None:
    """A reviewer approves the call, through the approval request's verb."""
    effect = Effect.objects.get(pk=effect_id)
    ApprovalRequest.objects.get(effect=effect).approve(by=_reviewer(effect, reviewer))


def reject(effect_id: str, reason: str, reviewer: str = "alice") -> None:
    """A reviewer rejects the call: effect rejected, session halted, a refusal recorded."""
    effect = Effect.objects.get(pk=effect_id)
    ApprovalRequest.objects.get(effect=effect).reject(_reviewer(effect, reviewer), reason)


def limited(remaining: dict) -> dict:
    """The guide's `left`: only counters that have a limit."""
    return {key: value for key, value in remaining.items() if value is not None}
