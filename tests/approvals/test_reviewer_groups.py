"""Reviewer groups: a require rule hands its calls to a named group, and only the group's members
may approve them (any reviewer may still reject). Managed in the API (admins), audited, and a
group that rules or pending requests use is not deleted from under them."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from approvals.models import ApprovalRequest, ReviewerGroup
from orgs.models import Event
from tests.approvals.conftest import irreversible, register
from tests.conftest import intercept, open_session, person_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def finance(acme):
    """Two reviewers in a finance group (dana by username, lee by email); acme-reviewer is not in it."""
    acme.dana = person_client(acme.org, "dana", "reviewer")
    acme.lee = person_client(acme.org, "lee", "reviewer")
    get_user_model().objects.filter(username="lee").update(email="lee@acme.example")
    response = acme.admin.post("/api/v1/reviewer-groups", {"name": "finance", "description": "Big refunds",
                                                           "members": ["dana", "lee@acme.example"]}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def group_rule(persona, approvals_required: int = 1, group: str = "finance"):
    register(persona, irreversible("refund"))
    response = persona.admin.post("/api/v1/rules", {
        "name": "big-refunds", "condition": "args.amount > 1000", "outcome": "require",
        "approvals_required": approvals_required, "reviewer_group": group}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def held_refund(persona, amount: int = 5000, session: str | None = None) -> dict:
    response = intercept(persona, session or open_session(persona), "refund", {"amount": amount}, 1)
    assert response.status_code == 202, response.content
    return response.json()


def approve(client, approval_id: str):
    return client.post(f"/api/v1/approvals/{approval_id}/approve", {}, format="json")


def test_an_admin_creates_a_group_naming_members_by_username_or_email(acme, finance):
    assert (finance["name"], finance["members"], finance["updated_by"]) == ("finance", ["dana", "lee"],
                                                                          "acme-admin")
    listed = acme.viewer.get("/api/v1/reviewer-groups").json()["reviewer_groups"]
    assert [(g["name"], g["members"]) for g in listed] == [("finance", ["dana", "lee"])]
    event = Event.objects.get(kind="reviewer_group.changed")
    assert (event.data["action"], event.data["changes"]["members"]) == ("created", [None, ["dana", "lee"]])


@pytest.mark.parametrize("members, says", [
    (["acme-viewer"], "is a viewer"),
    (["globex-reviewer"], "is not a member"),
    (["nobody"], "is not a member"),
])
def test_a_member_who_cannot_approve_here_is_a_400_and_nothing_is_saved(acme, outsider, members, says):
    response = acme.admin.post("/api/v1/reviewer-groups", {"name": "finance", "members": members}, format="json")

    assert (response.status_code, response.json()["error"]) == (400, "invalid")
    assert says in response.json()["fields"]["members"]
    assert not ReviewerGroup.objects.exists()


def test_only_admins_write_groups_and_names_are_unique(acme, finance):
    refused = acme.reviewer.post("/api/v1/reviewer-groups", {"name": "ops"}, format="json")
    again = acme.admin.post("/api/v1/reviewer-groups", {"name": "finance"}, format="json")

    assert refused.status_code == 403
    assert (again.status_code, again.json()["error"]) == (409, "reviewer_group_exists")


def test_another_org_neither_sees_nor_uses_the_group(acme, outsider, finance):
    assert outsider.admin.get("/api/v1/reviewer-groups").json() == {"reviewer_groups": []}
    assert outsider.admin.get(f"/api/v1/reviewer-groups/{finance['id']}").status_code == 404
    register(outsider, irreversible("refund"))
    response = outsider.admin.post("/api/v1/rules", {"name": "r", "condition": "true", "outcome": "require",
                                                     "reviewer_group": "finance"}, format="json")
    assert (response.status_code, response.json()["fields"]["reviewer_group"]) == (
        400, "No reviewer group named 'finance' in this organization.")


def test_only_a_require_rule_names_a_group(acme, finance):
    register(acme, irreversible("refund"))
    created = acme.admin.post("/api/v1/rules", {"name": "r", "condition": "true", "outcome": "approve",
                                                "reviewer_group": "finance"}, format="json")
    assert (created.status_code, created.json()["error"]) == (400, "invalid")

    rule = group_rule(acme)
    switched = acme.admin.patch(f"/api/v1/rules/{rule['id']}", {"outcome": "approve"}, format="json")
    assert switched.status_code == 400 and "reviewer_group" in switched.json()["fields"]
    cleared = acme.admin.patch(f"/api/v1/rules/{rule['id']}", {"outcome": "approve", "reviewer_group": None},
                               format="json")
    assert (cleared.status_code, cleared.json()["reviewer_group"]) == (200, None)


def test_a_reviewer_outside_the_group_cannot_approve_and_a_member_can(acme, finance):
    group_rule(acme)
    body = held_refund(acme)
    approval_id = body["approval"]["id"]
    assert body["decision"] == "await_approval"

    outside = approve(acme.reviewer, approval_id)

    assert (outside.status_code, outside.json()["error"], outside.json()["reviewer_group"]) == (
        403, "not_in_reviewer_group", "finance")
    approval = ApprovalRequest.objects.get(pk=approval_id)
    assert (approval.state, approval.approvals, approval.effect.state) == ("pending", [], "pending")
    queued = acme.viewer.get("/api/v1/approvals?state=pending").json()["approvals"][0]
    assert (queued["reviewer_group"], queued["rule"]) == ("finance", "big-refunds")

    inside = approve(acme.lee, approval_id)

    assert inside.status_code == 200, inside.content
    approval.refresh_from_db()
    assert (approval.state, approval.decided_by_label, approval.effect.state) == ("approved", "lee", "approved")


def test_a_small_refund_the_rule_does_not_match_is_for_any_reviewer(acme, finance):
    group_rule(acme)
    approval_id = held_refund(acme, amount=50)["approval"]["id"]

    assert approve(acme.reviewer, approval_id).status_code == 200
    assert ApprovalRequest.objects.get(pk=approval_id).reviewer_group_name == ""


def test_a_reviewer_outside_the_group_may_still_reject(acme, finance):
    group_rule(acme)
    approval_id = held_refund(acme)["approval"]["id"]

    response = acme.reviewer.post(f"/api/v1/approvals/{approval_id}/reject", {"reason": "looks like fraud"},
                                  format="json")

    assert response.status_code == 200, response.content
    assert ApprovalRequest.objects.get(pk=approval_id).state == "rejected"


def test_two_from_the_group_make_the_quorum_and_outsiders_do_not_count(acme, finance):
    group_rule(acme, approvals_required=2)
    approval_id = held_refund(acme)["approval"]["id"]

    first = approve(acme.dana, approval_id)
    outsider = approve(acme.reviewer, approval_id)
    second = approve(acme.lee, approval_id)

    assert (first.status_code, first.json()["approval"]["quorum"]) == (200, "1 of 2")
    assert (outsider.status_code, outsider.json()["error"]) == (403, "not_in_reviewer_group")
    assert second.status_code == 200
    approval = ApprovalRequest.objects.get(pk=approval_id)
    assert (approval.state, [a["by"] for a in approval.approvals]) == ("approved", ["dana", "lee"])


def test_someone_added_to_the_group_may_approve_a_request_already_waiting(acme, finance):
    group_rule(acme)
    approval_id = held_refund(acme)["approval"]["id"]
    assert approve(acme.reviewer, approval_id).status_code == 403

    changed = acme.admin.patch(f"/api/v1/reviewer-groups/{finance['id']}",
                               {"members": ["dana", "lee", "acme-reviewer"]}, format="json")

    assert changed.json()["members"] == ["acme-reviewer", "dana", "lee"]
    assert approve(acme.reviewer, approval_id).status_code == 200
    change = Event.objects.filter(kind="reviewer_group.changed", data__action="changed").get()
    assert change.data["changes"] == {"members": [["dana", "lee"], ["acme-reviewer", "dana", "lee"]]}
    assert change.data["by"] == "acme-admin"


def test_a_grant_never_decides_a_call_that_waits_for_a_group(acme, finance):
    group_rule(acme)
    session = open_session(acme)
    grant = acme.reviewer.post("/api/v1/grants", {"agent": "cleanup", "tool": "refund", "session": session},
                               format="json")
    assert grant.status_code == 201, grant.content

    small, big = (intercept(acme, session, "refund", {"amount": 10}, 1),
                  intercept(acme, session, "refund", {"amount": 5000}, 2))

    assert (small.status_code, small.json()["decision"]) == (201, "approved")  # the grant, as before
    assert (big.status_code, big.json()["decision"]) == (202, "await_approval")


def test_a_group_in_use_is_not_deleted_until_nothing_depends_on_it(acme, finance):
    rule = group_rule(acme)
    approval_id = held_refund(acme)["approval"]["id"]
    url = f"/api/v1/reviewer-groups/{finance['id']}"

    by_rule = acme.admin.delete(url)
    assert (by_rule.status_code, by_rule.json()["error"]) == (409, "reviewer_group_in_use")
    assert "big-refunds" in by_rule.json()["message"]

    acme.admin.delete(f"/api/v1/rules/{rule['id']}")
    by_request = acme.admin.delete(url)
    assert (by_request.status_code, by_request.json()["error"]) == (409, "reviewer_group_in_use")
    assert "1 pending" in by_request.json()["message"]

    approve(acme.dana, approval_id)
    assert acme.admin.delete(url).status_code == 204
    approval = ApprovalRequest.objects.get(pk=approval_id)
    assert (approval.reviewer_group_id, approval.reviewer_group_name) == (None, "finance")  # history keeps it
    assert Event.objects.filter(kind="reviewer_group.changed", data__action="deleted").count() == 1


def test_a_request_whose_group_is_gone_fails_closed(acme, finance):
    group_rule(acme)
    approval_id = held_refund(acme)["approval"]["id"]
    ApprovalRequest.objects.filter(pk=approval_id).update(reviewer_group=None)  # as a racing delete would leave it

    response = approve(acme.dana, approval_id)

    assert (response.status_code, response.json()["error"]) == (403, "not_in_reviewer_group")


def test_the_page_tells_an_outsider_the_group_decides_and_offers_no_approve(acme, finance):
    group_rule(acme)
    approval_id = held_refund(acme)["approval"]["id"]
    acme.reviewer.force_login(acme.reviewer.user)
    acme.lee.force_login(acme.lee.user)

    outsider = acme.reviewer.get(f"/approvals/{approval_id}/").content.decode()
    member = acme.lee.get(f"/approvals/{approval_id}/").content.decode()
    queue = acme.lee.get("/").content.decode()

    assert 'id="reviewer-group"' in outsider and 'id="not-in-group"' in outsider
    assert 'id="approve-button"' not in outsider and 'id="reject-button"' in outsider
    assert 'id="approve-button"' in member and 'id="not-in-group"' not in member
    assert "needs finance" in queue
