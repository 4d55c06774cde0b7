"""Trying a rule against the last 7 days of real approval requests: exact counts against a
seeded history, examples, disagreements with people, and the window's edge."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest
from tests.approvals.conftest import irreversible, register
from tests.conftest import intercept, make_persona, open_session

pytestmark = pytest.mark.django_db


def seed(persona, amounts: list[int], days_ago: float = 1, tool: str = "refund") -> list[str]:
    """Real requests made through the intercept, then dated `days_ago` back."""
    ids = []
    for amount in amounts:
        session = open_session(persona)
        body = intercept(persona, session, tool, {"amount": amount}, 1).json()
        ids.append(body["approval"]["id"])
    ApprovalRequest.objects.filter(pk__in=ids).update(created=timezone.now() - timedelta(days=days_ago))
    return ids


@pytest.fixture
def history(acme, tools):
    register(acme, irreversible("refund"), irreversible("wire_money"))
    small = seed(acme, [5, 20, 50])
    big = seed(acme, [51, 300, 9000, 12000])
    seed(acme, [1, 2], days_ago=8)  # outside the window
    seed(acme, [3], tool="wire_money")
    # What people decided: one small refund rejected, one big refund approved.
    acme.reviewer.post(f"/api/v1/approvals/{small[0]}/reject", {"reason": "fraud"}, format="json")
    acme.reviewer.post(f"/api/v1/approvals/{big[0]}/approve", {}, format="json")
    return small, big


def try_rule(persona, **body):
    response = persona.reviewer.post("/api/v1/rules/trial", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def test_an_approve_rule_counts_what_it_would_have_approved_over_seven_days(acme, history):
    small, _ = history

    result = try_rule(acme, condition='tool.name == "refund" && args.amount <= 50', outcome="approve")

    assert result["counts"] == {"requests": 8, "matched": 3, "errors": 0, "approved": 3, "denied": 0,
                                "left_to_people": 5, "approved_but_people_rejected": 1,
                                "denied_but_people_approved": 0}
    assert sorted(e["approval"] for e in result["examples"]["approved"]) == sorted(small)
    assert {e["args"]["amount"] for e in result["examples"]["approved"]} == {5, 20, 50}
    assert len(result["examples"]["left_to_people"]) == 5
    assert result["days"] == 7 and result["truncated"] is False


def test_a_deny_rule_counts_denials_and_where_people_disagreed(acme, history):
    result = try_rule(acme, condition="args.amount > 50", outcome="deny")

    counts = result["counts"]
    assert (counts["denied"], counts["left_to_people"], counts["denied_but_people_approved"]) == (4, 4, 1)


def test_a_require_rule_leaves_everything_to_people(acme, history):
    result = try_rule(acme, condition="true", outcome="require")

    assert (result["counts"]["matched"], result["counts"]["left_to_people"]) == (8, 8)


def test_a_longer_window_and_a_tool_scope(acme, history):
    assert try_rule(acme, condition="true", days=9)["counts"]["approved"] == 10
    assert try_rule(acme, condition="true", tool="wire_money")["counts"]["requests"] == 1


def test_a_condition_that_fails_on_some_requests_counts_them_as_errors_left_to_people(acme, history):
    result = try_rule(acme, condition="args.currency == 'EUR'")

    assert (result["counts"]["errors"], result["counts"]["left_to_people"]) == (8, 8)


def test_a_trial_saves_nothing_and_a_bad_condition_is_a_400(acme, history):
    bad = acme.reviewer.post("/api/v1/rules/trial", {"condition": "args.amount >"}, format="json")

    assert (bad.status_code, bad.json()["error"], bad.json()["column"]) == (400, "invalid_condition", 14)
    assert acme.admin.get("/api/v1/rules").json() == {"rules": []}
    assert acme.reviewer.post("/api/v1/rules/trial", {"condition": "true", "days": 0},
                              format="json").status_code == 400


def test_a_trial_sees_only_its_own_orgs_requests(acme, history):
    outsider = make_persona("globex")

    assert try_rule(outsider, condition="true")["counts"]["requests"] == 0
