"""The incident switch: `POST /api/v1/org/incident {"on": true}` holds every agent of the org at
0 irreversible calls from its next call on (new agents too), while SAFE reads and reversible
calls go on; off restores each agent's own limits untouched. Audited as `incident.changed`."""

from __future__ import annotations

from budgets.models import PolicyChange, Refusal
from effects.models import SafeCall
from orgs.models import Agent, AgentKey, Event
from tests.budgets.conftest import Run, set_budget
from tests.conftest import agent_client, intercept, open_session


def switch(persona, on: bool):
    return persona.admin.post("/api/v1/org/incident", {"on": on}, format="json")


def test_the_incident_switch_mid_run_refuses_the_very_next_irreversible_call_while_safe_reads_go_on(
        acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=5)
    run = Run(acme)
    assert run.drop().status_code == 201

    assert switch(acme, True).status_code == 200

    refused = run.drop(safe=["list_inactive_accounts"])
    assert refused.status_code == 429
    body = refused.json()
    assert (body["limit"], body["limit_value"], body["incident"]) == ("max_irreversible_per_run", 0, True)
    assert body["message"] == ("Budget limit max_irreversible_per_run reached (limit 0); tool call 'drop_table' "
                               "was not executed. Stop calling tools and give your final answer.")
    assert SafeCall.objects.filter(session_id=run.id).count() == 1  # the read was taken into account
    assert run.call("delete_account", {"account_id": "acct-1"}).status_code == 429
    assert run.call("send_email", {"to": "a@x.io"}, safe=["list_inactive_accounts"]).status_code == 201
    assert run.session.tool_counts == {"drop_table": 1, "list_inactive_accounts": 2, "send_email": 1}


def test_switching_it_off_restores_each_agents_own_limits(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=5)
    switch(acme, True)
    on = acme.viewer.get("/api/v1/agents/cleanup/budget").json()
    assert (on["limits"]["max_irreversible_per_run"], on["policy"]["max_irreversible_per_run"]) == (0, 5)

    assert switch(acme, False).status_code == 200

    off = acme.viewer.get("/api/v1/agents/cleanup/budget").json()
    assert (off["limits"]["max_irreversible_per_run"], off["incident"]) == (5, False)
    assert Run(acme).drop().status_code == 201


def test_it_covers_agents_created_while_it_is_on(acme, budget_tools):
    switch(acme, True)
    newcomer = Agent.objects.create(org=acme.org, name="newcomer")
    _, key = AgentKey.issue(newcomer)
    newcomer_api = agent_client(key)
    session = newcomer_api.post("/api/v1/sessions", {"agent": "newcomer"}, format="json").json()["id"]

    response = newcomer_api.post(f"/api/v1/sessions/{session}/intercept",
                                 {"tool": "drop_table", "args": {"table": "t"}, "step_index": 1}, format="json")

    assert response.status_code == 429
    assert Refusal.objects.get().agent == newcomer


def test_it_refuses_even_in_observe_mode(acme, budget_tools):
    set_budget(acme, mode="observe")
    switch(acme, True)

    assert Run(acme).drop().status_code == 429
    assert Refusal.objects.get().observed is False


def test_it_is_an_audited_event_and_a_repeat_changes_nothing(acme, budget_tools):
    first = switch(acme, True)
    again = switch(acme, True)

    assert (first.json()["on"], first.json()["changed"], again.json()["changed"]) == (True, True, False)
    event = Event.objects.get(kind="incident.changed")
    assert (event.data["on"], event.data["by"], event.data["agents"]) == (True, "acme-admin", 1)
    assert PolicyChange.objects.get().changes == {"incident": [False, True]}
    state = acme.viewer.get("/api/v1/org/incident").json()
    assert (state["on"], state["changed_by"]) == (True, "acme-admin")
    assert acme.viewer.get("/api/v1/agents").json()["incident"] is True


def test_the_per_agent_switch_is_a_zero_cap(acme, budget_tools):
    session = open_session(acme)
    set_budget(acme, max_irreversible_per_run=0)

    assert intercept(acme, session, "drop_table", {"table": "t"}, 1).status_code == 429
    assert intercept(acme, session, "send_email", {"to": "a@x.io"}, 2).status_code == 201


def test_only_admins_switch_it(acme, budget_tools):
    assert acme.reviewer.post("/api/v1/org/incident", {"on": True}, format="json").status_code == 403
    assert acme.viewer.post("/api/v1/org/incident", {"on": True}, format="json").status_code == 403
    assert acme.api.post("/api/v1/org/incident", {"on": True}, format="json").status_code == 403
    assert acme.api.get("/api/v1/org/incident").status_code == 403
    assert acme.viewer.get("/api/v1/org/incident").json()["on"] is False


def test_it_answers_401_without_credentials(client, acme):
    assert client.post("/api/v1/org/incident", {"on": True}, content_type="application/json").status_code == 401
    assert client.get("/api/v1/org/incident").status_code == 401


def test_it_rejects_bad_bodies_and_writes_nothing(acme, budget_tools):
    for body in ({"on": "yes"}, {"on": 1}, {}, {"on": True, "reason": "x"}, ["on"]):
        response = acme.admin.post("/api/v1/org/incident", body, format="json")
        assert response.status_code == 400, body
        assert response.json()["error"] == "invalid"
    assert not Event.objects.filter(kind="incident.changed").exists()


def test_it_answers_405_for_other_methods(acme):
    assert acme.admin.put("/api/v1/org/incident", {"on": True}, format="json").status_code == 405
    assert acme.admin.delete("/api/v1/org/incident").status_code == 405


def test_it_only_touches_its_own_org(acme, outsider, budget_tools):
    switch(outsider, True)

    assert acme.viewer.get("/api/v1/org/incident").json()["on"] is False
    assert Run(acme).drop().status_code == 201
