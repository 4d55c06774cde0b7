"""Agents and keys through the API (admins): POST /api/v1/agents, GET|POST /agents/{name}/keys,
POST /agents/{name}/keys/{prefix}/rotate and /revoke; what the agent's requests get after."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from orgs.models import Agent, AgentKey
from tests.conftest import agent_client


def issue(persona, agent: str = "cleanup", **body) -> dict:
    response = persona.admin.post(f"/api/v1/agents/{agent}/keys", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_it_creates_an_agent_issues_a_key_once_and_the_agent_uses_it(acme):
    created = acme.admin.post("/api/v1/agents", {"name": "billing"}, format="json")
    issued = issue(acme, "billing", name="laptop")
    listed = acme.admin.get("/api/v1/agents/billing/keys").json()["keys"]

    assert created.status_code == 201
    assert created.json()["agent"] == {"name": "billing", "state": "active", "suspend_reason": None,
                                       "budget_source": "none",
                                       "today": {"tool_calls": 0, "irreversible_calls": 0, "cost": 0}}
    assert issued["key"].startswith(f"ul_{issued['prefix']}_")
    assert (issued["name"], issued["state"], issued["last_used_at"]) == ("laptop", "active", None)
    assert [k["prefix"] for k in listed] == [issued["prefix"]]
    assert "key" not in listed[0] and issued["key"] not in str(listed)  # shown once, never again
    opened = agent_client(issued["key"]).post("/api/v1/sessions", {"agent": "billing"}, format="json")
    assert opened.status_code == 201
    used = acme.admin.get("/api/v1/agents/billing/keys").json()["keys"][0]
    assert used["last_used_at"] is not None


def test_a_rotated_key_works_through_its_grace_period_beside_its_successor(acme):
    old = AgentKey.objects.get(agent=acme.agent)

    rotated = acme.admin.post(f"/api/v1/agents/cleanup/keys/{old.prefix}/rotate")

    body = rotated.json()
    assert rotated.status_code == 201
    assert body["rotated"]["state"] == "rotating" and body["state"] == "active"
    expires = AgentKey.objects.get(pk=old.pk).expires_at
    assert timedelta(hours=23, minutes=59) < expires - timezone.now() <= timedelta(hours=24)
    assert agent_client(acme.key).get("/api/v1/agents/cleanup/budget").status_code == 200
    assert agent_client(body["key"]).get("/api/v1/agents/cleanup/budget").status_code == 200
    again = acme.admin.post(f"/api/v1/agents/cleanup/keys/{old.prefix}/rotate")
    assert (again.status_code, again.json()["error"]) == (409, "key_not_active")
    AgentKey.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    expired = agent_client(acme.key).get("/api/v1/agents/cleanup/budget")
    assert (expired.status_code, expired.json()["error"]) == (401, "authentication_failed")
    assert acme.admin.get("/api/v1/agents/cleanup/keys").json()["keys"][1]["state"] == "expired"


def test_a_revoked_key_is_a_401_at_once_and_cannot_be_revoked_twice(acme):
    prefix = AgentKey.objects.get(agent=acme.agent).prefix

    revoked = acme.admin.post(f"/api/v1/agents/cleanup/keys/{prefix}/revoke")

    assert (revoked.status_code, revoked.json()["state"]) == (200, "revoked")
    refused = acme.api.get("/api/v1/agents/cleanup/budget")
    assert (refused.status_code, refused.json()["error"]) == (401, "authentication_failed")
    twice = acme.admin.post(f"/api/v1/agents/cleanup/keys/{prefix}/revoke")
    assert (twice.status_code, twice.json()["error"]) == (409, "key_revoked")
    rotate = acme.admin.post(f"/api/v1/agents/cleanup/keys/{prefix}/rotate")
    assert (rotate.status_code, rotate.json()["error"]) == (409, "key_not_active")


@pytest.mark.parametrize("body, field", [({}, "name"), ({"name": "no spaces"}, "name"), ({"name": 7}, "name"),
                                         ({"name": "ok", "extra": 1}, "extra")])
def test_a_bad_agent_is_a_400_and_writes_nothing(acme, body, field):
    response = acme.admin.post("/api/v1/agents", body, format="json")

    assert (response.status_code, response.json()["error"]) == (400, "invalid")
    assert field in response.json()["fields"]
    assert list(Agent.objects.filter(org=acme.org).values_list("name", flat=True)) == ["cleanup"]


def test_a_duplicate_agent_is_a_409_and_a_bad_key_name_a_400(acme):
    duplicate = acme.admin.post("/api/v1/agents", {"name": "cleanup"}, format="json")
    bad = acme.admin.post("/api/v1/agents/cleanup/keys", {"name": 12}, format="json")

    assert (duplicate.status_code, duplicate.json()["error"]) == (409, "agent_exists")
    assert (bad.status_code, bad.json()["error"]) == (400, "invalid")
    assert AgentKey.objects.filter(agent=acme.agent).count() == 1


def test_only_admins_manage_agents_and_keys(client, acme):
    prefix = AgentKey.objects.get(agent=acme.agent).prefix
    calls = [("post", "/api/v1/agents", {"name": "x"}), ("get", "/api/v1/agents/cleanup/keys", None),
             ("post", "/api/v1/agents/cleanup/keys", {}),
             ("post", f"/api/v1/agents/cleanup/keys/{prefix}/rotate", None),
             ("post", f"/api/v1/agents/cleanup/keys/{prefix}/revoke", None)]

    for method, path, body in calls:
        for who in (acme.reviewer, acme.viewer, acme.api):
            response = getattr(who, method)(path, body, format="json")
            assert (response.status_code, response.json()["error"]) == (403, "forbidden"), (path, response.content)
        assert getattr(client, method)(path, body, content_type="application/json").status_code == 401

    assert AgentKey.objects.filter(agent=acme.agent, revoked_at__isnull=True, expires_at__isnull=True).count() == 1
    assert not Agent.objects.filter(name="x").exists()


def test_another_orgs_agents_and_keys_are_404(acme, outsider):
    theirs = AgentKey.objects.get(agent=outsider.agent).prefix
    mine = AgentKey.objects.get(agent=acme.agent).prefix
    acme.admin.post("/api/v1/agents", {"name": "billing"}, format="json")

    answers = [acme.admin.get("/api/v1/agents/nobody/keys"),
               acme.admin.post(f"/api/v1/agents/cleanup/keys/{theirs}/revoke"),
               outsider.admin.post(f"/api/v1/agents/cleanup/keys/{mine}/revoke"),
               outsider.admin.get("/api/v1/agents/billing/keys"),
               acme.admin.post(f"/api/v1/agents/billing/keys/{mine}/rotate")]  # my key, but not billing's

    assert [(a.status_code, a.json()["error"]) for a in answers] == [
        (404, "agent_not_found"), (404, "key_not_found"), (404, "key_not_found"), (404, "agent_not_found"),
        (404, "key_not_found")]
    assert outsider.api.get("/api/v1/agents/cleanup/budget").status_code == 200  # untouched
    assert acme.api.get("/api/v1/agents/cleanup/budget").status_code == 200


def test_wrong_methods_are_405(acme):
    prefix = AgentKey.objects.get(agent=acme.agent).prefix

    answers = [acme.admin.delete("/api/v1/agents/cleanup/keys"),
               acme.admin.get(f"/api/v1/agents/cleanup/keys/{prefix}/rotate"),
               acme.admin.put(f"/api/v1/agents/cleanup/keys/{prefix}/revoke", {}, format="json")]

    assert [(a.status_code, a.json()["error"]) for a in answers] == [(405, "method_not_allowed")] * 3


def test_a_key_says_which_agent_so_a_session_needs_no_agent_name(acme):
    implied = acme.api.post("/api/v1/sessions", {"metadata": {"ticket": 7}}, format="json")
    named = acme.api.post("/api/v1/sessions", {"agent": "cleanup"}, format="json")
    wrong = acme.api.post("/api/v1/sessions", {"agent": "billing"}, format="json")

    assert (implied.status_code, implied.json()["agent"], implied.json()["metadata"]) == (201, "cleanup", {"ticket": 7})
    assert named.status_code == 201
    assert (wrong.status_code, wrong.json()["error"]) == (404, "agent_not_found")


def test_the_grace_period_is_a_setting(acme, settings):
    settings.UNDOLOG_KEY_ROTATION_GRACE_S = 600
    old = AgentKey.objects.get(agent=acme.agent)

    acme.admin.post(f"/api/v1/agents/cleanup/keys/{old.prefix}/rotate")

    left = AgentKey.objects.get(pk=old.pk).expires_at - timezone.now()
    assert timedelta(minutes=9) < left <= timedelta(minutes=10)
