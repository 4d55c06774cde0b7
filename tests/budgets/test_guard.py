"""Point 2: the budget is checked in the intercept transaction, before approval. A call over a
limit is refused with 429 and the guide's message, not counted, not executed, and recorded."""

from __future__ import annotations

from approvals.models import ApprovalRequest
from budgets.models import DayCounter, Refusal
from effects.models import Effect, SafeCall, Session
from orgs.models import Event
from tests.budgets.conftest import Run, reject, set_budget, set_org_budget
from tests.conftest import intercept

GUIDE_MESSAGE = ("Budget limit max_irreversible_per_run reached (limit 2); tool call 'drop_table' was not executed. "
                 "Stop calling tools and give your final answer.")


def test_it_refuses_the_call_over_max_irreversible_per_run_with_the_guides_answer(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=2)
    run = Run(acme)
    assert [run.drop().status_code for _ in range(2)] == [201, 201]

    response = run.drop()

    assert response.status_code == 429
    body = response.json()
    assert {k: body[k] for k in ("decision", "kind", "limit", "message")} == {
        "decision": "refused", "kind": "budget", "limit": "max_irreversible_per_run", "message": GUIDE_MESSAGE}
    assert Effect.objects.filter(session_id=run.id).count() == 2  # no effect row, nothing to execute
    refusal = Refusal.objects.get()
    assert (refusal.kind, refusal.tool_name, refusal.decided_by, refusal.limit, refusal.step_index) == (
        "budget", "drop_table", "budget", "max_irreversible_per_run", 3)
    assert refusal.reason == "budget limit max_irreversible_per_run reached (3 > 2)"
    assert refusal.message == GUIDE_MESSAGE
    event = Event.objects.get(kind="permission_denied")
    assert event.data | {"refusal": None} == {
        "kind": "budget", "tool_name": "drop_table", "decided_by": "budget", "limit": "max_irreversible_per_run",
        "reason": "budget limit max_irreversible_per_run reached (3 > 2)", "observed": False, "refusal": None}
    assert (event.agent, str(event.session_id)) == (acme.agent, run.id)


def test_it_does_not_count_a_refused_call(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=1)
    run = Run(acme)
    run.drop()
    assert run.drop().status_code == 429
    assert run.drop().status_code == 429

    session = run.session
    assert (session.tool_calls, session.irreversible_calls, session.tool_counts) == (1, 1, {"drop_table": 1})
    assert run.budget()["usage"]["irreversible_run"] == 1
    assert Refusal.objects.count() == 2


def test_it_keeps_the_run_going_after_a_refusal(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=0)
    run = Run(acme)
    assert run.drop().status_code == 429

    response = run.call("send_email", {"to": "a@x.io"})

    assert response.status_code == 201
    assert run.session.state == "running"


def test_it_checks_the_budget_before_approval(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=0)
    run = Run(acme)

    response = run.call("delete_account", {"account_id": "acct-101"})

    assert response.status_code == 429
    assert response.json()["limit"] == "max_irreversible_per_run"
    assert not ApprovalRequest.objects.exists()  # the reviewer is never bothered
    assert not Event.objects.filter(kind="approval.requested").exists()
    assert run.session.state == "running"


def test_it_counts_an_admitted_call_even_when_the_reviewer_then_rejects_it(acme, budget_tools):
    set_budget(acme, max_irreversible_per_day=1)
    run = Run(acme)
    pending = run.call("delete_account", {"account_id": "acct-102"})
    assert pending.status_code == 202

    reject(pending.json()["effect"]["id"], "acct-102 has an open invoice")

    assert run.session.irreversible_calls == 1
    assert DayCounter.objects.get(agent=acme.agent).irreversible_calls == 1
    acme.reviewer.post("/api/v1/agents/cleanup/resume")  # no violation, so nothing to resume: 409 is fine
    refused = Run(acme).call("delete_account", {"account_id": "acct-103"})
    assert refused.status_code == 429
    assert refused.json()["limit"] == "max_irreversible_per_day"
    assert refused.json()["message"].startswith("Budget limit max_irreversible_per_day reached (limit 1);")


def test_it_charges_the_reported_safe_calls_first_even_when_it_refuses_the_call(acme, budget_tools):
    set_budget(acme, max_cost_per_run=1)
    run = Run(acme)

    response = run.call("send_email", {"to": "a@x.io"}, safe=["list_inactive_accounts", "list_inactive_accounts"])

    assert response.status_code == 429
    assert response.json()["limit"] == "max_cost_per_run"
    assert Refusal.objects.get().reason == "budget limit max_cost_per_run reached (1.02 > 1)"
    assert SafeCall.objects.filter(session_id=run.id).count() == 2
    session = run.session
    assert (session.tool_calls, float(session.cost)) == (2, 0.02)


def test_an_unregistered_safe_call_costs_one(acme, budget_tools):
    set_budget(acme, max_cost_per_run=1.5)
    run = Run(acme)

    response = run.call("send_email", {"to": "a@x.io"}, safe=["lookup_typo"])

    assert response.status_code == 429
    assert Refusal.objects.get().reason == "budget limit max_cost_per_run reached (2 > 1.5)"


def test_it_refuses_over_max_tool_calls_per_run(acme, budget_tools):
    set_budget(acme, max_tool_calls_per_run=3)
    run = Run(acme)
    assert run.call("send_email", {"to": "a@x.io"}, safe=["list_inactive_accounts"]).status_code == 201

    response = run.call("send_email", {"to": "b@x.io"}, safe=["list_inactive_accounts"])

    assert response.status_code == 429
    assert response.json()["limit"] == "max_tool_calls_per_run"
    assert Refusal.objects.get().reason == "budget limit max_tool_calls_per_run reached (4 > 3)"


def test_it_refuses_over_a_per_tool_cap_and_lets_other_tools_through(acme, budget_tools):
    set_budget(acme, tool_caps_per_run={"send_email": 1})
    run = Run(acme)
    assert run.call("send_email", {"to": "a@x.io"}).status_code == 201

    response = run.call("send_email", {"to": "b@x.io"})

    assert response.status_code == 429
    body = response.json()
    assert (body["limit"], body["tool"]) == ("tool_caps_per_run", "send_email")
    assert body["message"] == ("Budget limit tool_caps_per_run[send_email] reached (limit 1); tool call 'send_email' "
                               "was not executed. Stop calling tools and give your final answer.")
    assert Refusal.objects.get().reason == "budget limit tool_caps_per_run[send_email] reached (2 > 1)"
    assert run.drop().status_code == 201
    assert run.budget()["tool_caps"] == {"send_email": {"limit": 1, "used": 1, "remaining": 0}}


def test_it_refuses_over_max_tool_calls_per_day_across_runs(acme, budget_tools):
    set_budget(acme, max_tool_calls_per_day=3)
    first = Run(acme)
    assert first.call("send_email", {"to": "a@x.io"}, safe=["list_inactive_accounts"]).status_code == 201
    second = Run(acme)
    assert second.call("send_email", {"to": "b@x.io"}).status_code == 201

    response = second.call("send_email", {"to": "c@x.io"})

    assert response.status_code == 429
    assert response.json()["limit"] == "max_tool_calls_per_day"
    assert Refusal.objects.get().reason == "budget limit max_tool_calls_per_day reached (4 > 3)"
    assert DayCounter.objects.get(agent=acme.agent).tool_calls == 3


def test_it_refuses_over_max_irreversible_per_day_across_runs(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=5, max_irreversible_per_day=2)
    Run(acme).drop()
    run = Run(acme)
    assert run.drop().status_code == 201

    response = run.drop()

    assert response.status_code == 429
    assert response.json()["limit"] == "max_irreversible_per_day"
    assert run.session.irreversible_calls == 1


def test_it_refuses_over_max_cost_per_day_and_still_charges_the_safe_calls(acme, budget_tools):
    set_budget(acme, max_cost_per_day=2)
    run = Run(acme)
    assert run.call("send_email", {"to": "a@x.io"}).status_code == 201

    response = run.call("send_email", {"to": "b@x.io"}, safe=["list_inactive_accounts"])

    assert response.status_code == 429
    assert response.json()["limit"] == "max_cost_per_day"
    assert Refusal.objects.get().reason == "budget limit max_cost_per_day reached (2.01 > 2)"
    day = DayCounter.objects.get(agent=acme.agent)
    assert (day.tool_calls, float(day.cost)) == (2, 1.01)


def test_a_limit_set_to_zero_refuses_from_the_next_call_on(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=5)
    run = Run(acme)
    assert run.drop().status_code == 201

    set_budget(acme, max_irreversible_per_run=0)

    assert run.drop().status_code == 429
    assert run.call("send_email", {"to": "a@x.io"}).status_code == 201  # reversible work goes on
    assert Refusal.objects.get().reason == "budget limit max_irreversible_per_run reached (2 > 0)"


def test_the_org_default_applies_until_the_agent_has_its_own_policy(acme, budget_tools):
    set_org_budget(acme, max_irreversible_per_run=1, max_cost_per_day=50)
    run = Run(acme)
    run.drop()
    assert run.drop().status_code == 429

    budget = set_budget(acme, max_irreversible_per_run=3)

    assert budget["source"] == "agent"
    assert budget["limits"]["max_cost_per_day"] == 50  # its first change started from the org default
    assert run.drop().status_code == 201


def test_a_replayed_request_charges_its_new_safe_calls_to_the_day(acme, budget_tools):
    set_budget(acme, max_cost_per_day=10)
    run = Run(acme)
    first = intercept(acme, run.id, "send_email", {"to": "a@x.io"}, 2)
    assert first.status_code == 201

    again = intercept(acme, run.id, "send_email", {"to": "a@x.io"}, 2,
                      safe_calls=[{"tool": "list_inactive_accounts", "step_index": 1}])

    assert again.json()["decision"] == "replay"
    day = DayCounter.objects.get(agent=acme.agent)
    assert (day.tool_calls, float(day.cost)) == (2, 1.01)
    assert Session.objects.get(pk=run.id).tool_calls == 2


def test_the_run_keeps_its_first_violation(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=0, tool_caps_per_run={"send_email": 0})
    run = Run(acme)
    run.drop()
    run.call("send_email", {"to": "a@x.io"})

    violation = run.session.violation
    assert (violation["limit"], violation["tool"], violation["limit_value"], violation["current"]) == (
        "max_irreversible_per_run", "drop_table", 0, 1)
    assert Refusal.objects.count() == 2


def test_another_orgs_policy_changes_nothing_here(acme, outsider, budget_tools):
    set_org_budget(outsider, max_irreversible_per_run=0)
    response = outsider.admin.post("/api/v1/org/incident", {"on": True}, format="json")
    assert response.status_code == 200

    assert Run(acme).drop().status_code == 201


def test_safe_calls_reported_with_a_refused_call_still_count_for_the_day(acme, budget_tools):
    set_budget(acme, max_irreversible_per_run=0, max_cost_per_day=100)
    run = Run(acme)

    assert run.drop(safe=["list_inactive_accounts"]).status_code == 429
    acme.admin.post("/api/v1/org/incident", {"on": True}, format="json")
    assert run.drop(safe=["list_inactive_accounts"]).status_code == 429

    day = DayCounter.objects.get(agent=acme.agent)
    assert (day.tool_calls, day.irreversible_calls, float(day.cost)) == (2, 0, 0.02)
