"""GET/PATCH/DELETE /api/v1/agents/{name}/budget, GET /api/v1/sessions/{id}/budget and
GET/PATCH /api/v1/org/budget: limits, usage, remaining; strict validation; who may do what."""

from __future__ import annotations

import pytest

from budgets.models import BudgetPolicy, PolicyChange
from tests.budgets.conftest import Run, set_budget, set_org_budget

URL = "/api/v1/agents/cleanup/budget"


def test_it_answers_limits_usage_and_remaining(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=2, max_cost_per_day=16, tool_caps_per_run={"send_email": 3})
    run = Run(acme)
    run.drop(safe=["list_inactive_accounts"])

    body = acme.viewer.get(URL).json()

    assert body["limits"] == {"max_tool_calls_per_run": None, "max_irreversible_per_run": 2, "max_cost_per_run": None,
                              "max_tool_calls_per_day": None, "max_irreversible_per_day": None,
                              "max_cost_per_day": 16.0, "tool_caps_per_run": {"send_email": 3}}
    assert body["usage"] == {"tool_calls_run": 2, "irreversible_run": 1, "cost_run": 1.01, "tool_calls_day": 2,
                             "irreversible_day": 1, "cost_day": 1.01}
    assert body["remaining"] == {"tool_calls_run": None, "irreversible_run": 1, "cost_run": None,
                                 "tool_calls_day": None, "irreversible_day": None, "cost_day": 14.99}
    assert body["tool_caps"] == {"send_email": {"limit": 3, "used": 0, "remaining": 3}}
    assert (body["source"], body["mode"], body["on_exceeded"], body["day_tracked"]) == (
        "agent", "enforce", "pause", True)
    assert body["session"]["id"] == run.id


def test_an_agent_without_any_policy_has_no_limits(acme, budget_tools):
    body = acme.viewer.get(URL).json()

    assert body["source"] == "none"
    assert set(body["remaining"].values()) == {None}
    assert body["session"] is None


def test_an_agent_reads_its_own_budget_and_nobody_elses(acme, budget_tools):
    other = acme.org.agents.create(name="other")

    assert acme.api.get(URL).status_code == 200
    assert acme.api.get(f"/api/v1/agents/{other.name}/budget").status_code == 404
    assert acme.api.patch(URL, {"max_irreversible_per_run": 9}, format="json").status_code == 403


def test_a_session_budget_is_that_runs_usage(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=3)
    first = Run(acme)
    first.drop()
    first.drop()
    Run(acme).drop()

    body = first.budget()

    assert (body["usage"]["irreversible_run"], body["remaining"]["irreversible_run"]) == (2, 1)
    assert acme.api.get(f"/api/v1/sessions/{first.id}/budget").status_code == 200


def test_a_session_budget_of_another_org_is_404(acme, outsider, budget_tools):
    run = Run(acme)

    assert outsider.viewer.get(f"/api/v1/sessions/{run.id}/budget").status_code == 404
    assert outsider.api.get(f"/api/v1/sessions/{run.id}/budget").status_code == 404
    assert acme.viewer.get("/api/v1/sessions/00000000-0000-0000-0000-000000000000/budget").status_code == 404


def test_patch_changes_only_what_it_sends_and_null_removes_a_limit(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=2, max_cost_per_day=16)

    body = set_budget(acme, max_cost_per_day=None, on_exceeded="stop")

    assert (body["limits"]["max_irreversible_per_run"], body["limits"]["max_cost_per_day"]) == (2, None)
    assert body["on_exceeded"] == "stop"
    change = PolicyChange.objects.order_by("-created").first()
    assert change.actor == "acme-admin"
    assert change.changes == {"max_cost_per_day": [16.0, None], "on_exceeded": ["pause", "stop"]}


def test_delete_falls_back_to_the_org_default(acme, budget_tools):
    set_org_budget(acme, max_irreversible_per_run=4)
    set_budget(acme, max_irreversible_per_run=1)

    response = acme.admin.delete(URL)

    assert response.status_code == 200
    assert (response.json()["source"], response.json()["limits"]["max_irreversible_per_run"]) == ("org", 4)
    assert not BudgetPolicy.objects.filter(agent=acme.agent).exists()


@pytest.mark.parametrize("body, field", [
    ({"max_irreversible_per_run": -1}, "max_irreversible_per_run"),
    ({"max_irreversible_per_run": "2"}, "max_irreversible_per_run"),
    ({"max_irreversible_per_run": True}, "max_irreversible_per_run"),
    ({"max_irreversible_per_run": 2.5}, "max_irreversible_per_run"),
    ({"max_tool_calls_per_day": 2**31}, "max_tool_calls_per_day"),
    ({"max_cost_per_day": "16"}, "max_cost_per_day"),
    ({"max_cost_per_day": 0.00001}, "max_cost_per_day"),
    ({"max_cost_per_run": -0.5}, "max_cost_per_run"),
    ({"max_irreversible_per_rum": 2}, "max_irreversible_per_rum"),
    ({"tool_caps_per_run": {"delete_acount": 3}}, "tool_caps_per_run"),
    ({"tool_caps_per_run": {"list_inactive_accounts": 3}}, "tool_caps_per_run"),
    ({"tool_caps_per_run": {"send_email": -1}}, "tool_caps_per_run"),
    ({"tool_caps_per_run": ["send_email"]}, "tool_caps_per_run"),
    ({"mode": "dry-run"}, "mode"),
    ({"on_exceeded": "explode"}, "on_exceeded"),
    ({"on_exceeded": "escalate"}, "escalation_url"),
    ({"escalation_url": "file:///etc/passwd"}, "escalation_url"),
    ({}, "non_field_errors"),
])
def test_patch_rejects_bad_input_and_writes_nothing(acme, budget_tools, body, field):
    response = acme.admin.patch(URL, body, format="json")

    assert response.status_code == 400
    assert response.json()["error"] == "invalid"
    assert field in response.json()["fields"]
    assert not BudgetPolicy.objects.exists()
    assert not PolicyChange.objects.exists()


def test_patch_rejects_a_body_that_is_not_an_object(acme, budget_tools):
    assert acme.admin.patch(URL, [1], format="json").status_code == 400
    response = acme.admin.patch(URL, "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == "malformed_json"


def test_only_admins_change_a_budget(acme, budget_tools):
    for client in (acme.viewer, acme.reviewer):
        assert client.patch(URL, {"max_irreversible_per_run": 1}, format="json").status_code == 403
        assert client.delete(URL).status_code == 403
        assert client.patch("/api/v1/org/budget", {"max_irreversible_per_run": 1}, format="json").status_code == 403
    assert not BudgetPolicy.objects.exists()


def test_it_answers_401_without_credentials(client, acme):
    assert client.get(URL).status_code == 401
    assert client.patch(URL, {}, content_type="application/json").status_code == 401
    assert client.get("/api/v1/org/budget").status_code == 401


def test_another_orgs_agent_is_404(acme, outsider, budget_tools):
    assert outsider.viewer.get(URL.replace("cleanup", "nobody")).status_code == 404
    acme.org.agents.create(name="acme-only")
    response = outsider.admin.patch("/api/v1/agents/acme-only/budget", {"max_irreversible_per_run": 0},
                                    format="json")
    assert response.status_code == 404
    assert response.json()["error"] == "agent_not_found"


def test_it_answers_405_for_other_methods(acme):
    assert acme.admin.put(URL, {}, format="json").status_code == 405
    assert acme.admin.post(URL, {}, format="json").status_code == 405
    assert acme.admin.delete("/api/v1/org/budget").status_code == 405


def test_the_org_default_is_read_by_viewers_and_changed_by_admins(acme, budget_tools):
    assert acme.viewer.get("/api/v1/org/budget").json()["limits"]["max_cost_per_day"] is None

    body = set_org_budget(acme, max_cost_per_day=100, mode="observe")

    assert (body["limits"]["max_cost_per_day"], body["mode"], body["incident"]["on"]) == (100.0, "observe", False)
    agent = acme.viewer.get(URL).json()
    assert (agent["source"], agent["mode"], agent["remaining"]["cost_day"]) == ("org", "observe", 100.0)
    assert acme.api.get("/api/v1/org/budget").status_code == 403


def test_the_org_default_rejects_bad_input(acme, budget_tools):
    response = acme.admin.patch("/api/v1/org/budget", {"max_cost_per_day": -1}, format="json")

    assert response.status_code == 400
    assert not BudgetPolicy.objects.exists()


def test_a_session_budget_needs_credentials_and_is_read_only(client, acme, budget_tools):
    run = Run(acme)
    url = f"/api/v1/sessions/{run.id}/budget"

    assert client.get(url).status_code == 401
    assert acme.admin.post(url, {}, format="json").status_code == 405
    assert acme.admin.patch(url, {}, format="json").status_code == 405
