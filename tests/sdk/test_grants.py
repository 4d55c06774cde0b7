"""A reviewer's grant seen from the SDK: the call is answered `approved` at once, so the agent
claims and runs it without waiting, and a revoked grant brings the wait back."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from effects.models import Effect
from tests.sdk.agent_tools import RAN, delete_account
from tests.sdk.conftest import Person, reviewer, token_of

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_granted_call_runs_at_once_and_a_revoked_grant_waits_again(acme, server, client):
    person = Person(server, token_of(acme.reviewer))
    issued = person.http.post("/api/v1/grants", json={"agent": "cleanup", "tool": "delete_account", "minutes": 10})
    assert issued.status_code == 201, issued.text
    grant_id = issued.json()["grant"]["id"]
    waits: list = []

    with client.session(agent="cleanup", on_wait=waits.append) as s:
        assert delete_account("acct-101") == "deleted acct-101"
    assert waits == []  # never waited for a person
    effect = Effect.objects.get(session_id=s.id)
    assert effect.state == "committed"
    assert ApprovalRequest.objects.get(effect=effect).decided_by_label == f"grant:{grant_id}"

    assert person.http.delete(f"/api/v1/grants/{grant_id}").status_code == 204
    decider = reviewer(acme, server, ("approve", ""))
    with client.session(agent="cleanup", on_wait=waits.append):
        delete_account("acct-102")
    decider.finish()
    assert waits and RAN == ["delete_account acct-101", "delete_account acct-102"]
