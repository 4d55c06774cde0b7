"""Edit before approving (`POST /approvals/{id}/approve {"args": {...}}`): the decision binds to
the edited args' digest, the effect keeps the proposal in `args` and the edit in `approved_args`,
and a bad edit is a 400 that changes nothing."""

from __future__ import annotations

import pytest

from approvals.models import MAX_EDIT_DEPTH, ApprovalRequest
from deliveries.models import Delivery
from effects.models import Effect, canonical_json, sha256
from orgs.models import Event
from tests.approvals.conftest import hold, irreversible, register


def nested(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels - 1):
        value = {"x": value}
    return value


def approve(persona, body: dict, **data):
    return persona.reviewer.post(f"/api/v1/approvals/{body['approval']['id']}/approve", data, format="json")


def test_an_edit_is_what_the_effect_carries_to_run_and_the_decision_is_bound_to_it(acme):
    body = hold(acme, args={"account_id": "acct-101"})

    response = approve(acme, body, args={"account_id": "acct-103"}, reason="the ticket says 103")

    assert response.status_code == 200, response.content
    approval = response.json()["approval"]
    edited_digest = sha256(canonical_json({"account_id": "acct-103"}))
    assert approval["decided_args_digest"] == edited_digest != approval["args_digest"]
    assert approval["proposed_args"] == {"account_id": "acct-101"}
    assert approval["approved_args"] == {"account_id": "acct-103"}
    effect = Effect.objects.get(pk=body["effect"]["id"])
    assert (effect.args, effect.approved_args, effect.state) == ({"account_id": "acct-101"},
                                                                 {"account_id": "acct-103"}, "approved")
    assert effect.args_digest == approval["args_digest"]
    # What the waiting agent reads.
    polled = acme.api.get(f"/api/v1/effects/{effect.id}?wait=0").json()
    assert polled["effect"]["approved_args"] == {"account_id": "acct-103"}
    assert polled["effect"]["approval"]["decided_args_digest"] == edited_digest
    assert Event.objects.get(kind="approval.decided").data["decision"] == "approved"


def test_an_edit_equal_to_the_proposal_is_no_edit(acme):
    body = hold(acme, args={"account_id": "acct-101"})

    assert approve(acme, body, args={"account_id": "acct-101"}).status_code == 200

    assert Effect.objects.get(pk=body["effect"]["id"]).approved_args is None
    approval = ApprovalRequest.objects.get(pk=body["approval"]["id"])
    assert approval.decided_args_digest == approval.args_digest


@pytest.mark.parametrize(("args", "says"), [
    ([1, 2], "JSON object"),
    (nested(MAX_EDIT_DEPTH), None),
    ("acct-103", "JSON object"),
    (nested(MAX_EDIT_DEPTH + 1), "levels deep"),
    ({"blob": "x" * (256 * 1024 + 1)}, "KiB"),
])
def test_a_bad_edit_is_a_400_that_decides_nothing(acme, args, says):
    body = hold(acme)

    response = approve(acme, body, args=args)

    if says is None:  # the limit itself is fine
        assert response.status_code == 200, response.content
        return
    assert response.status_code == 400, response.content
    assert response.json()["error"] == "invalid" and says in response.json()["fields"]["args"]
    assert ApprovalRequest.objects.get(pk=body["approval"]["id"]).state == "pending"
    assert Effect.objects.get(pk=body["effect"]["id"]).state == "pending"


def test_an_edit_with_a_stale_digest_is_a_409(acme):
    body = hold(acme)

    response = approve(acme, body, args={"account_id": "acct-9"}, args_digest="0" * 64)

    assert response.status_code == 409 and response.json()["error"] == "args_digest_mismatch"
    assert Effect.objects.get(pk=body["effect"]["id"]).approved_args is None


def test_an_executor_gets_the_edited_args(acme):
    register(acme, {**irreversible("wire_money"), "executor": {"url": "https://pay.example.com/run"}})
    body = hold(acme, tool="wire_money", args={"amount": 30000})

    assert approve(acme, body, args={"amount": 300}).status_code == 200

    delivery = Delivery.objects.get(purpose="executor")
    assert delivery.body["args"] == {"amount": 300}
    assert delivery.body["proposed_args"] == {"amount": 30000}
    assert delivery.body["args_digest"] == sha256(canonical_json({"amount": 300}))


def test_viewers_cannot_edit_and_approve(acme):
    body = hold(acme)
    response = acme.viewer.post(f"/api/v1/approvals/{body['approval']['id']}/approve",
                                {"args": {"account_id": "x"}}, format="json")
    assert response.status_code == 403
    assert Effect.objects.get(pk=body["effect"]["id"]).approved_args is None
