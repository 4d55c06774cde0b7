"""Agent keys: a prefix and a SHA-256 digest, never the key; revocable; one lookup."""

from __future__ import annotations

import hashlib

from django.db import connection
from django.test.utils import CaptureQueriesContext

from orgs.models import AgentKey
from tests.conftest import agent_client


def test_it_stores_a_digest_not_the_key(acme):
    key = AgentKey.objects.get(agent=acme.agent)

    secret = acme.key.split("_", 2)[2]
    assert key.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert acme.key not in str(AgentKey.objects.values().get(pk=key.pk))
    assert len(secret) >= 40


def test_it_authenticates_with_one_query_and_records_last_use(acme):
    with CaptureQueriesContext(connection) as queries:
        assert AgentKey.authenticate(acme.key).agent == acme.agent
    assert len(queries) == 2  # the lookup, and the first last-used stamp
    with CaptureQueriesContext(connection) as queries:
        AgentKey.authenticate(acme.key)
    assert len(queries) == 1
    assert AgentKey.objects.get(agent=acme.agent).last_used_at is not None


def test_a_revoked_key_is_refused(acme, tools):
    AgentKey.objects.get(agent=acme.agent).revoke()

    response = acme.api.get("/api/v1/tools")

    assert response.status_code == 401
    assert response.json()["error"] == "authentication_failed"


def test_a_wrong_secret_with_a_real_prefix_is_refused(acme, tools):
    prefix = acme.key.split("_")[1]

    assert agent_client(f"ul_{prefix}_{'A' * 43}").get("/api/v1/tools").status_code == 401
    assert agent_client("garbage").get("/api/v1/tools").status_code == 401


def test_no_credentials_is_a_401(client, db):
    response = client.get("/api/v1/tools")

    assert response.status_code == 401
    assert response.json()["error"] == "not_authenticated"


def test_an_agent_cannot_reach_another_orgs_objects(acme, outsider, session_id):
    effect = acme.api.post(f"/api/v1/sessions/{session_id}/intercept",
                           {"tool": "send_email", "args": {"to": "a@x.io"}, "step_index": 1},
                           format="json").json()["effect"]

    assert outsider.api.get(f"/api/v1/sessions/{session_id}").status_code == 404
    assert outsider.api.get(f"/api/v1/effects/{effect['id']}").status_code == 404
    assert outsider.api.post(f"/api/v1/effects/{effect['id']}/commit", {"result": 1},
                             format="json").status_code == 404
    assert outsider.reviewer.get(f"/api/v1/sessions/{session_id}").status_code == 404
    assert outsider.api.post(f"/api/v1/sessions/{session_id}/complete").status_code == 404


def test_a_member_of_the_org_can_read_a_session(acme, session_id):
    response = acme.viewer.get(f"/api/v1/sessions/{session_id}")

    assert response.status_code == 200
    assert set(response.json()) >= {"id", "agent", "state", "step_index", "effects", "undo_stack", "budget"}


def test_a_person_cannot_intercept(acme, session_id):
    response = acme.admin.post(f"/api/v1/sessions/{session_id}/intercept",
                               {"tool": "send_email", "args": {}, "step_index": 1}, format="json")

    assert response.status_code == 403


def test_a_sessions_budget_shows_limits_usage_and_what_remains(acme, session_id):
    acme.admin.patch("/api/v1/agents/cleanup/budget", {"max_irreversible_per_run": 2}, format="json")
    acme.api.post(f"/api/v1/sessions/{session_id}/intercept",
                  {"tool": "delete_account", "args": {"account_id": "a1"}, "step_index": 1}, format="json")

    budget = acme.api.get(f"/api/v1/sessions/{session_id}").json()["budget"]

    assert budget["irreversible_calls"] == 1
    assert budget["limits"]["max_irreversible_per_run"] == 2
    assert budget["remaining"]["irreversible_run"] == 1
