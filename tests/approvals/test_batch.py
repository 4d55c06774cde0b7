"""Batch decisions (`POST /api/v1/approvals/batch`): each request decided on its own, bound to its
own digest; one that was decided meanwhile, changed or belongs to another org is reported in its
row while the others still go."""

from __future__ import annotations

import uuid

from approvals.models import ApprovalRequest
from budgets.models import Refusal
from effects.models import Session
from orgs.models import Event
from tests.approvals.conftest import hold


def held(persona, n: int) -> list[dict]:
    return [hold(persona, args={"account_id": f"acct-{i}"}) for i in range(n)]


def batch(persona, ids, decision, **extra):
    return persona.reviewer.post("/api/v1/approvals/batch", {"ids": ids, "decision": decision, **extra},
                                 format="json")


def test_it_approves_several_each_on_its_own_digest(acme):
    bodies = held(acme, 3)
    ids = [b["approval"]["id"] for b in bodies]

    response = batch(acme, ids, "approve", reason="routine cleanup")

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["decided"], body["failed"]) == (3, 0)
    assert [r["id"] for r in body["results"]] == ids
    for row in ApprovalRequest.objects.filter(pk__in=ids):
        assert (row.state, row.decided_by_label, row.decision_reason) == ("approved", "acme-reviewer",
                                                                           "routine cleanup")
        assert row.decided_args_digest == row.args_digest
    assert {r["decided_args_digest"] for r in body["results"]} == {
        r.args_digest for r in ApprovalRequest.objects.filter(pk__in=ids)}
    assert Event.objects.filter(kind="approval.decided").count() == 3  # one decision each
    assert set(Session.objects.values_list("state", flat=True)) == {"running"}


def test_partial_conflicts_are_reported_per_id(acme, outsider):
    bodies = held(acme, 3)
    ids = [b["approval"]["id"] for b in bodies]
    acme.reviewer.post(f"/api/v1/approvals/{ids[0]}/approve", {}, format="json")
    foreign = hold(outsider)["approval"]["id"]
    missing = str(uuid.uuid4())

    response = batch(acme, [*ids, foreign, missing], "reject", reason="not during the freeze",
                     args_digests={ids[1]: "0" * 64})

    assert response.status_code == 200
    rows = {r["id"]: r for r in response.json()["results"]}
    assert rows[ids[0]]["error"] == "already_decided"
    assert rows[ids[2]]["ok"] and rows[ids[2]]["state"] == "rejected"
    assert rows[ids[1]]["ok"]  # a digest binds approvals only; a rejection runs nothing
    assert rows[foreign]["error"] == rows[missing]["error"] == "approval_not_found"
    assert ApprovalRequest.objects.get(pk=foreign).state == "pending"
    assert Refusal.objects.filter(decided_by="acme-reviewer").count() == 2


def test_an_approval_whose_args_the_reviewer_did_not_see_is_refused_alone(acme):
    bodies = held(acme, 2)
    ids = [b["approval"]["id"] for b in bodies]
    seen = ApprovalRequest.objects.get(pk=ids[1]).args_digest

    response = batch(acme, ids, "approve", args_digests={ids[0]: "f" * 64, ids[1]: seen})

    rows = response.json()["results"]
    assert (rows[0]["ok"], rows[0]["error"]) == (False, "args_digest_mismatch")
    assert rows[1]["ok"]
    assert ApprovalRequest.objects.get(pk=ids[0]).state == "pending"


def test_bad_batches_are_400_and_decide_nothing(acme):
    ids = [b["approval"]["id"] for b in held(acme, 1)]
    for body in [{"ids": ids, "decision": "reject"}, {"ids": [], "decision": "approve"},
                 {"ids": ids, "decision": "maybe"}, {"ids": ["nope"], "decision": "approve"},
                 {"ids": [str(uuid.uuid4())] * 101, "decision": "approve"}]:
        response = acme.reviewer.post("/api/v1/approvals/batch", body, format="json")
        assert response.status_code == 400, (body, response.content)
    assert ApprovalRequest.objects.get().state == "pending"
    assert acme.viewer.post("/api/v1/approvals/batch", {"ids": ids, "decision": "approve"},
                            format="json").status_code == 403
    assert acme.api.post("/api/v1/approvals/batch", {"ids": ids, "decision": "approve"},
                         format="json").status_code == 403
    assert acme.reviewer.get("/api/v1/approvals/batch").status_code == 405
