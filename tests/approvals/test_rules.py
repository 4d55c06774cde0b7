"""Approval rules decide irreversible calls end to end over HTTP: approve (as a person's decision
would be recorded), deny (a refusal of kind rule and its event), require two approvers, observe
(recorded, nothing applied); budgets come first; a rule adds no query to the intercept."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.models import ApprovalRequest
from budgets.models import Refusal
from effects.models import Effect, EffectTransition, Session
from orgs.models import Event
from tests.approvals.conftest import irreversible, register
from tests.budgets.conftest import set_budget
from tests.conftest import intercept, open_session

pytestmark = pytest.mark.django_db


def add_rule(persona, **rule):
    response = persona.admin.post("/api/v1/rules", {"outcome": "approve", **rule}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


@pytest.fixture
def run(acme, tools):
    register(acme, irreversible("refund"))
    return open_session(acme)


def refund(acme, run, amount, step=1):
    return intercept(acme, run, "refund", {"amount": amount, "order": f"o-{step}"}, step)


def test_an_approve_rule_decides_at_once_like_a_person(acme, run):
    add_rule(acme, name="small-refunds", condition='tool.name == "refund" && args.amount <= 50')

    response = refund(acme, run, 30)

    assert response.status_code == 202
    body = response.json()
    assert body["effect"]["state"] == "approved"
    assert body["approval"]["decided_by"] == "rule:small-refunds"
    approval = ApprovalRequest.objects.get(pk=body["approval"]["id"])
    assert (approval.state, approval.decided_by_label, approval.rule) == ("approved", "rule:small-refunds",
                                                                          "small-refunds")
    assert Session.objects.get(pk=run).state == "running"
    assert list(EffectTransition.objects.filter(effect_id=body["effect"]["id"]).values_list("to_state", "actor")) \
        == [("approved", "rule:small-refunds")]
    decided = Event.objects.get(kind="approval.decided")
    assert decided.data["decided_by"] == "rule:small-refunds"
    assert not Event.objects.filter(kind="approval.requested").exists()  # nobody was asked
    # The agent runs it as after a person's approval.
    assert acme.api.post(f"/api/v1/effects/{body['effect']['id']}/start").status_code == 200
    commit = acme.api.post(f"/api/v1/effects/{body['effect']['id']}/commit", {"result": {"ok": 1}}, format="json")
    assert commit.json()["effect"]["state"] == "committed"
    # In the history, the queue and the stats, as decided by the rule.
    listed = acme.reviewer.get("/api/v1/approvals?state=approved").json()["approvals"]
    assert [a["decided_by"] for a in listed] == ["rule:small-refunds"]
    stats = acme.reviewer.get("/api/v1/approvals/stats").json()
    assert (stats["approved"], stats["decided_by_rule"], stats["median_time_to_decide_s"]) == (1, 1, None)


def test_a_call_the_rule_does_not_match_waits_for_a_person(acme, run):
    add_rule(acme, name="small-refunds", condition='tool.name == "refund" && args.amount <= 50')

    body = refund(acme, run, 3000).json()

    assert body["effect"]["state"] == "pending"
    assert Event.objects.filter(kind="approval.requested").count() == 1


def test_a_deny_rule_refuses_with_its_name_a_refusal_and_an_event(acme, run):
    add_rule(acme, name="no-big-refunds", condition="args.amount > 1000", outcome="deny",
             message="refunds over 1000 go through finance")

    response = refund(acme, run, 30000)

    assert response.status_code == 403
    body = response.json()
    assert (body["decision"], body["kind"], body["rule"]) == ("refused", "rule", "no-big-refunds")
    assert "rule 'no-big-refunds'" in body["message"] and "finance" in body["message"]
    refusal = Refusal.objects.get(pk=body["refusal"])
    assert (refusal.kind, refusal.decided_by, str(refusal.effect_id)) == ("rule", "rule:no-big-refunds",
                                                                          body["effect"]["id"])
    event = Event.objects.get(kind="permission_denied")
    assert (event.data["kind"], event.data["decided_by"]) == ("rule", "rule:no-big-refunds")
    assert Effect.objects.get(pk=body["effect"]["id"]).state == "rejected"
    assert not ApprovalRequest.objects.exists()
    assert Session.objects.get(pk=run).state == "running"  # the run goes on, told why
    # The same call again replays the refusal: one refusal, counted once.
    again = refund(acme, run, 30000)
    assert (again.status_code, again.json()["refusal"]) == (403, body["refusal"])
    assert Refusal.objects.count() == 1
    assert Session.objects.get(pk=run).irreversible_calls == 1


def test_a_require_rule_needs_two_distinct_approvers(acme, run):
    add_rule(acme, name="two-for-big", condition="args.amount > 100", outcome="require", approvals_required=2)
    second = acme.person("second-reviewer", "reviewer")
    approval_id = refund(acme, run, 500).json()["approval"]["id"]

    first = acme.reviewer.post(f"/api/v1/approvals/{approval_id}/approve", {}, format="json")
    assert first.status_code == 200
    assert (first.json()["approval"]["state"], first.json()["approval"]["quorum"]) == ("pending", "1 of 2")
    assert first.json()["approval"]["rule"] == "two-for-big"
    final = second.post(f"/api/v1/approvals/{approval_id}/approve", {}, format="json")

    approval = final.json()["approval"]
    assert approval["state"] == "approved"
    assert [a["by"] for a in approval["approvals"]] == ["acme-reviewer", "second-reviewer"]
    assert approval["decided_by"] == "second-reviewer"


def test_an_observe_rule_records_what_it_would_do_and_applies_nothing(acme, run):
    add_rule(acme, name="would-deny", condition="true", outcome="deny", mode="observe")
    add_rule(acme, name="would-approve", condition="args.amount < 50", mode="observe")

    response = refund(acme, run, 30)

    assert response.status_code == 202
    assert response.json()["effect"]["state"] == "pending"
    approval = ApprovalRequest.objects.get()
    assert approval.state == "pending" and approval.rule == ""
    assert [o["rule"] for o in approval.rule_observations] == ["would-deny", "would-approve"]
    observed = Event.objects.filter(kind="rule.observed").order_by("created")
    assert [(e.data["rule"], e.data["outcome"], e.data["applied"]) for e in observed] == [
        ("would-deny", "deny", False), ("would-approve", "approve", False)]
    assert not Refusal.objects.exists()


def test_rules_are_walked_in_order_and_the_first_enforcing_match_wins(acme, run):
    add_rule(acme, name="deny-all", condition="true", outcome="deny", position=20)
    add_rule(acme, name="approve-small", condition="args.amount < 50", position=10)

    assert refund(acme, run, 10, step=1).json()["effect"]["state"] == "approved"
    assert refund(acme, run, 99, step=2).json()["rule"] == "deny-all"


def test_rules_scoped_to_an_agent_or_a_tool_leave_others_alone(acme, run):
    register(acme, irreversible("wire_money"))
    add_rule(acme, name="refunds-only", condition="true", tool="refund")

    assert refund(acme, run, 10).json()["effect"]["state"] == "approved"
    other = intercept(acme, run, "wire_money", {"amount": 1}, 2).json()
    assert other["effect"]["state"] == "pending"


def test_conditions_read_the_tool_the_run_and_the_time_in_the_orgs_zone(acme, run):
    acme.org.time_zone = "Pacific/Kiritimati"  # UTC+14: its hour is not the server's
    acme.org.save()
    from approvals.rules import now_in

    hour = now_in(acme.org)["hour"]
    add_rule(acme, name="context", condition=(
        f'now.hour == {hour} && "data-loss" in tool.risk_tags && tool.tier == "irreversible" && '
        'run.irreversible_calls == 1 && agent.name == "cleanup" && tool.cost_weight == 1.0'))

    assert refund(acme, run, 10).json()["effect"]["state"] == "approved"


def test_an_error_in_a_condition_leaves_the_call_to_people(acme, run):
    add_rule(acme, name="reads-missing", condition="args.currency == 'EUR'")  # refund has no currency

    assert refund(acme, run, 10).json()["effect"]["state"] == "pending"


def test_budgets_beat_rules_no_rule_approves_past_a_cap(acme, run):
    add_rule(acme, name="approve-everything", condition="true")
    set_budget(acme, max_irreversible_per_run=1)

    assert refund(acme, run, 10, step=1).json()["effect"]["state"] == "approved"
    over = refund(acme, run, 10, step=2)

    assert over.status_code == 429
    assert (over.json()["kind"], over.json()["limit"]) == ("budget", "max_irreversible_per_run")
    assert ApprovalRequest.objects.count() == 1


def test_a_rule_change_is_seen_by_the_next_call(acme, run):
    rule = add_rule(acme, name="small", condition="args.amount < 50")
    assert refund(acme, run, 10, step=1).json()["effect"]["state"] == "approved"

    acme.admin.patch(f"/api/v1/rules/{rule['id']}", {"condition": "args.amount < 5"}, format="json")

    assert refund(acme, run, 10, step=2).json()["effect"]["state"] == "pending"


def test_finding_and_evaluating_fifty_rules_adds_no_query_to_the_intercept(acme, tools):
    register(acme, irreversible("refund"))
    _intercept_queries(acme)  # loads the (empty) rule set once and stamps the key's last use
    baseline = _intercept_queries(acme)
    for n in range(50):
        add_rule(acme, name=f"rule-{n}", condition=f'tool.name == "refund" && args.amount == {1000 + n}')
    _intercept_queries(acme)  # the first call after the edits loads the rules once

    assert _intercept_queries(acme) == baseline


def _intercept_queries(acme) -> int:
    session = open_session(acme)
    with CaptureQueriesContext(connection) as queries:
        response = intercept(acme, session, "refund", {"amount": 7}, 1)
    assert response.json()["effect"]["state"] == "pending"
    return len(queries.captured_queries)


def test_a_run_a_rule_approved_replays_as_approved(acme, run):
    add_rule(acme, name="small", condition="args.amount < 50")
    first = refund(acme, run, 10).json()

    again = refund(acme, run, 10).json()

    assert again["decision"] == "replay"
    assert again["effect"]["id"] == first["effect"]["id"]
    assert again["approval"]["decided_by"] == "rule:small"


def test_a_condition_may_use_macros_over_the_args(acme, run):
    add_rule(acme, name="no-gift-cards", outcome="deny", message="gift cards are not refunded",
             condition='has(args.items) && args.items.exists(i, i.sku == "gift-card")')

    denied = intercept(acme, run, "refund", {"amount": 5, "items": [{"sku": "mug"}, {"sku": "gift-card"}]}, 1)
    left = intercept(acme, run, "refund", {"amount": 5, "items": [{"sku": "mug"}]}, 2)

    assert denied.json()["rule"] == "no-gift-cards"
    assert left.json()["effect"]["state"] == "pending"


def test_a_condition_reads_the_days_usage(acme, tools):
    register(acme, irreversible("refund"))
    add_rule(acme, name="after-two-today", condition="day.irreversible_calls >= 2")

    first = refund(acme, open_session(acme), 10)
    second = refund(acme, open_session(acme), 10)

    # The day's usage includes the call being decided (it is in the log by then).
    assert first.json()["effect"]["state"] == "pending"
    assert second.json()["effect"]["state"] == "approved"
