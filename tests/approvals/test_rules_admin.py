"""Rules in the Django admin: a bad condition is a form error naming its position, and every
add, change and delete through the admin is audited like the API's."""

from __future__ import annotations

import pytest

from approvals.models import Rule, RuleChange

pytestmark = pytest.mark.django_db

RULES = "/admin/approvals/rule/"


def form(acme, **fields) -> dict:
    return {"org": acme.org.pk, "name": "small", "position": 0, "condition": "args.amount < 5",
            "outcome": "approve", "approvals_required": 1, "message": "", "mode": "enforce", "agent": "",
            "tool": "", **fields}


def test_an_admin_edit_is_audited_with_who_and_what(staff, acme):
    assert staff.post(f"{RULES}add/", form(acme)).status_code == 302
    rule = Rule.objects.get()

    staff.post(f"{RULES}{rule.pk}/change/", form(acme, condition="args.amount < 9", mode="observe"))
    staff.post(f"{RULES}{rule.pk}/delete/", {"post": "yes"})

    history = list(RuleChange.objects.order_by("created").values_list("action", "actor", "changes"))
    assert [(action, actor) for action, actor, _ in history] == [
        ("created", "admin:root"), ("changed", "admin:root"), ("deleted", "admin:root")]
    assert history[1][2] == {"condition": ["args.amount < 5", "args.amount < 9"], "mode": ["enforce", "observe"]}
    assert not Rule.objects.exists()


def test_a_bad_condition_is_a_form_error_with_its_position(staff, acme):
    response = staff.post(f"{RULES}add/", form(acme, condition="args.amount <"))

    assert response.status_code == 200
    assert "line 1, column 14" in response.content.decode()
    assert not Rule.objects.exists()


GROUPS = "/admin/approvals/reviewergroup/"


def test_a_reviewer_group_edited_in_the_admin_is_recorded_and_keeps_to_its_org(staff, acme, outsider):
    from approvals.models import ReviewerGroup
    from orgs.models import Event, Membership

    mine = Membership.objects.get(org=acme.org, user__username="acme-reviewer")
    foreign = Membership.objects.get(org=outsider.org, user__username="globex-reviewer")
    fields = {"org": acme.org.pk, "name": "finance", "description": ""}

    refused = staff.post(f"{GROUPS}add/", {**fields, "members": [mine.pk, foreign.pk]})
    assert refused.status_code == 200 and "Not members of" in refused.content.decode()
    assert not ReviewerGroup.objects.exists()

    assert staff.post(f"{GROUPS}add/", {**fields, "members": [mine.pk]}).status_code == 302
    group = ReviewerGroup.objects.get()
    assert staff.post(f"{GROUPS}{group.pk}/change/", {**fields, "members": []}).status_code == 302

    recorded = [(e.data["action"], e.data["by"], e.data["changes"].get("members"))
                for e in Event.objects.filter(kind="reviewer_group.changed").order_by("created")]
    assert recorded == [("created", "admin:root", [None, ["acme-reviewer"]]),
                        ("changed", "admin:root", [["acme-reviewer"], []])]
