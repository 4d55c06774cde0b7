"""Approval rules as the SDK sees them: a call a rule approves runs at once with nobody asked,
a call a rule denies raises `Refused` whose model-facing text names the rule, and a run the
SDK opens `started_by` a person cannot be approved by that person."""

from __future__ import annotations

import pytest
from undolog import Refused, refusal_as_tool_result

from approvals.models import ApprovalRequest, Rule
from effects.models import Effect, Session
from tests.sdk.agent_tools import RAN, delete_account

pytestmark = pytest.mark.django_db(transaction=True)


def rule(acme, name: str, condition: str, outcome: str, message: str = "") -> None:
    Rule.add(acme.org, {"name": name, "condition": condition, "outcome": outcome, "message": message}, actor="test")


def test_a_call_a_rule_approves_runs_at_once(acme, server, client):
    rule(acme, "test-accounts", 'args.account_id.startsWith("test-")', "approve")

    with client.session(agent="cleanup") as s:
        assert delete_account("test-7") == "deleted test-7"

    assert RAN == ["delete_account test-7"]
    assert Effect.objects.get(session_id=s.id).state == "committed"
    assert ApprovalRequest.objects.get().decided_by_label == "rule:test-accounts"


def test_a_call_a_rule_denies_raises_refused_naming_the_rule(acme, server, client):
    rule(acme, "keep-vips", 'args.account_id == "acct-vip"', "deny", "VIP accounts are closed by account managers")

    with client.session(agent="cleanup") as s, pytest.raises(Refused) as refused:
        delete_account("acct-vip")

    text = refusal_as_tool_result(refused.value)
    assert text.startswith("DENIED by rule 'keep-vips': VIP accounts are closed by account managers")
    assert RAN == []
    assert s.state == "completed"  # the run went on and ended normally


def test_a_session_started_by_a_person_says_so(acme, server, client):
    with client.session(agent="cleanup", started_by="acme-reviewer") as s:
        pass

    assert Session.objects.get(pk=s.id).started_by == "acme-reviewer"
