"""GET /api/v1/agents, POST /api/v1/agents/{name}/resume and /suspend."""

from __future__ import annotations

from orgs.models import Event
from tests.budgets.conftest import Run, set_budget


def test_it_lists_the_orgs_agents_with_state_and_todays_counters(acme, outsider, budget_tools):
    set_budget(acme, max_cost_per_day=100)
    Run(acme).drop(safe=["list_inactive_accounts"])
    acme.org.agents.create(name="idle", state="suspended", suspend_reason="manual")

    body = acme.viewer.get("/api/v1/agents").json()

    assert [a["name"] for a in body["agents"]] == ["cleanup", "idle"]
    cleanup, idle = body["agents"]
    assert cleanup["today"] == {"tool_calls": 2, "irreversible_calls": 1, "cost": 1.01}
    assert (cleanup["state"], cleanup["budget_source"]) == ("active", "agent")
    assert (idle["state"], idle["suspend_reason"], idle["budget_source"]) == ("suspended", "manual", "none")
    assert [a["name"] for a in outsider.viewer.get("/api/v1/agents").json()["agents"]] == ["cleanup"]


def test_the_agents_list_is_for_people(client, acme):
    assert acme.api.get("/api/v1/agents").status_code == 403
    assert client.get("/api/v1/agents").status_code == 401
    assert acme.admin.delete("/api/v1/agents").status_code == 405


def test_suspend_by_hand_then_resume(acme, budget_tools):
    response = acme.reviewer.post("/api/v1/agents/cleanup/suspend", {"note": "looks odd"}, format="json")

    assert response.status_code == 200
    assert (response.json()["agent"]["state"], response.json()["agent"]["suspend_reason"]) == ("suspended", "manual")
    assert Event.objects.get(kind="agent.suspended").data == {"reason": "manual", "by": "acme-reviewer",
                                                              "note": "looks odd"}
    assert acme.api.post("/api/v1/sessions", {"agent": "cleanup"}, format="json").status_code == 423
    again = acme.reviewer.post("/api/v1/agents/cleanup/suspend")
    assert (again.status_code, again.json()["error"]) == (409, "agent_not_active")

    assert acme.reviewer.post("/api/v1/agents/cleanup/resume").status_code == 200
    assert Event.objects.get(kind="agent.resumed").data["previous_reason"] == "manual"
    assert acme.api.post("/api/v1/sessions", {"agent": "cleanup"}, format="json").status_code == 201


def test_resuming_an_active_agent_is_409(acme):
    response = acme.reviewer.post("/api/v1/agents/cleanup/resume")

    assert (response.status_code, response.json()["error"]) == (409, "agent_not_suspended")
    assert not Event.objects.exists()


def test_resume_and_suspend_need_a_reviewer(client, acme):
    for action in ("resume", "suspend"):
        url = f"/api/v1/agents/cleanup/{action}"
        assert acme.viewer.post(url).status_code == 403
        assert acme.api.post(url).status_code == 403
        assert client.post(url).status_code == 401
        assert acme.reviewer.get(url).status_code == 405
    acme.agent.refresh_from_db()
    assert acme.agent.state == "active"


def test_resume_and_suspend_reject_bad_bodies(acme):
    response = acme.reviewer.post("/api/v1/agents/cleanup/suspend", {"reason": "x"}, format="json")

    assert response.status_code == 400
    acme.agent.refresh_from_db()
    assert acme.agent.state == "active"


def test_another_orgs_agent_cannot_be_resumed_or_suspended(acme, outsider):
    acme.org.agents.create(name="acme-only", state="suspended", suspend_reason="budget")

    assert outsider.admin.post("/api/v1/agents/acme-only/resume").status_code == 404
    assert outsider.admin.post("/api/v1/agents/acme-only/suspend").status_code == 404
