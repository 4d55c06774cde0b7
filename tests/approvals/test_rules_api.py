"""The rules API: CRUD in order, CEL errors as 400s naming the position, every edit audited,
roles, other orgs' rules 404, wrong methods 405."""

from __future__ import annotations

import pytest

from approvals.models import Rule, RuleChange
from orgs.models import Event, Organization
from tests.approvals.conftest import irreversible, register

pytestmark = pytest.mark.django_db

SMALL = {"name": "small-refunds", "condition": 'tool.name == "refund" && args.amount <= 50', "outcome": "approve"}


def test_an_admin_adds_lists_reads_changes_and_deletes_rules(acme, tools):
    created = acme.admin.post("/api/v1/rules", SMALL, format="json")
    assert created.status_code == 201, created.content
    rule = created.json()
    assert (rule["mode"], rule["approvals_required"], rule["position"], rule["agent"], rule["tool"]) == \
        ("enforce", 1, 0, None, None)
    second = acme.admin.post("/api/v1/rules", {**SMALL, "name": "deny-big", "condition": "args.amount > 1000",
                                               "outcome": "deny", "tool": "delete_account",
                                               "agent": "cleanup"}, format="json").json()
    assert (second["position"], second["tool"], second["agent"]) == (10, "delete_account", "cleanup")

    listed = acme.viewer.get("/api/v1/rules").json()["rules"]
    assert [r["name"] for r in listed] == ["small-refunds", "deny-big"]

    changed = acme.admin.patch(f"/api/v1/rules/{rule['id']}", {"position": 20, "mode": "observe"}, format="json")
    assert changed.status_code == 200
    assert [r["name"] for r in acme.viewer.get("/api/v1/rules").json()["rules"]] == ["deny-big", "small-refunds"]

    detail = acme.viewer.get(f"/api/v1/rules/{rule['id']}").json()
    assert [c["action"] for c in detail["changes"]] == ["changed", "created"]
    assert detail["changes"][0]["changes"] == {"position": [0, 20], "mode": ["enforce", "observe"]}
    assert detail["changes"][0]["by"] == "acme-admin"

    assert acme.admin.delete(f"/api/v1/rules/{rule['id']}").status_code == 204
    assert acme.viewer.get(f"/api/v1/rules/{rule['id']}").status_code == 404
    history = RuleChange.objects.filter(rule_id=rule["id"]).order_by("created")
    assert [c.action for c in history] == ["created", "changed", "deleted"]
    assert list(Event.objects.filter(kind="rule.changed").order_by("created").values_list("data__action", flat=True)) \
        == ["created", "created", "changed", "deleted"]


def test_every_rule_edit_bumps_the_orgs_config_version(acme):
    versions = [Organization.objects.get(pk=acme.org.pk).config_version]
    rule = acme.admin.post("/api/v1/rules", SMALL, format="json").json()
    versions.append(Organization.objects.get(pk=acme.org.pk).config_version)
    acme.admin.patch(f"/api/v1/rules/{rule['id']}", {"message": "m"}, format="json")
    versions.append(Organization.objects.get(pk=acme.org.pk).config_version)
    acme.admin.delete(f"/api/v1/rules/{rule['id']}")
    versions.append(Organization.objects.get(pk=acme.org.pk).config_version)

    assert versions == sorted(set(versions))  # strictly increasing: each edit is seen by the next call


@pytest.mark.parametrize("condition, line, column", [
    ('tool.name == "refund" && args.amount <=', 1, 40),
    ("args.amount > 5 &&& true", 1, 19),
    ('tool.name == "refund" &&\n  (args.amount > ', 2, 18),  # as sent: the trailing space counts
    ("secrets.token == 1", 1, 1),
])
def test_a_condition_that_does_not_compile_is_a_400_naming_its_position(acme, condition, line, column):
    response = acme.admin.post("/api/v1/rules", {**SMALL, "condition": condition}, format="json")

    assert response.status_code == 400
    body = response.json()
    assert (body["error"], body["line"], body["column"]) == ("invalid_condition", line, column)
    assert f"line {line}, column {column}" in body["message"]
    assert "condition" in body["fields"]
    assert not Rule.objects.exists()


def test_a_patch_with_a_bad_condition_changes_nothing(acme):
    rule = acme.admin.post("/api/v1/rules", SMALL, format="json").json()

    response = acme.admin.patch(f"/api/v1/rules/{rule['id']}", {"condition": "args.("}, format="json")

    assert response.json()["error"] == "invalid_condition"
    assert Rule.objects.get().condition == SMALL["condition"]
    assert RuleChange.objects.count() == 1


@pytest.mark.parametrize("body, field", [
    ({**SMALL, "outcome": "maybe"}, "outcome"),
    ({**SMALL, "mode": "loud"}, "mode"),
    ({**SMALL, "name": "has spaces"}, "name"),
    ({**SMALL, "approvals_required": 0}, "approvals_required"),
    ({**SMALL, "approvals_required": 11}, "approvals_required"),
    ({**SMALL, "agent": "nobody"}, "agent"),
    ({**SMALL, "tool": "no_such_tool"}, "tool"),
    ({**SMALL, "tool": "list_inactive_accounts"}, "tool"),  # SAFE: reported, never intercepted
    ({**SMALL, "condition": 7}, "condition"),
    ({**SMALL, "colour": "red"}, "colour"),
])
def test_bad_input_is_a_400_naming_the_field(acme, tools, body, field):
    response = acme.admin.post("/api/v1/rules", body, format="json")

    assert response.status_code == 400, response.content
    assert field in response.json()["fields"]


def test_a_second_rule_with_the_same_name_is_a_409(acme):
    acme.admin.post("/api/v1/rules", SMALL, format="json")

    response = acme.admin.post("/api/v1/rules", SMALL, format="json")

    assert (response.status_code, response.json()["error"]) == (409, "rule_exists")


def test_only_admins_write_reviewers_try_viewers_read_agents_nothing(acme):
    rule = acme.admin.post("/api/v1/rules", SMALL, format="json").json()
    trial = {"condition": "true", "outcome": "approve"}

    for client in (acme.reviewer, acme.viewer):
        assert client.post("/api/v1/rules", {**SMALL, "name": "x"}, format="json").status_code == 403
        assert client.patch(f"/api/v1/rules/{rule['id']}", {"message": "x"}, format="json").status_code == 403
        assert client.delete(f"/api/v1/rules/{rule['id']}").status_code == 403
        assert client.get("/api/v1/rules").status_code == 200
    assert acme.reviewer.post("/api/v1/rules/trial", trial, format="json").status_code == 200
    assert acme.viewer.post("/api/v1/rules/trial", trial, format="json").status_code == 403
    assert acme.api.get("/api/v1/rules").status_code == 403


def test_another_orgs_rules_are_404_and_never_listed(acme, outsider):
    rule = acme.admin.post("/api/v1/rules", SMALL, format="json").json()

    assert outsider.admin.get(f"/api/v1/rules/{rule['id']}").status_code == 404
    assert outsider.admin.patch(f"/api/v1/rules/{rule['id']}", {"message": "x"}, format="json").status_code == 404
    assert outsider.admin.delete(f"/api/v1/rules/{rule['id']}").status_code == 404
    assert outsider.admin.get("/api/v1/rules").json() == {"rules": []}
    assert acme.admin.get("/api/v1/rules/" + "f" * 36).json()["error"] == "rule_not_found"


def test_put_is_405(acme):
    rule = acme.admin.post("/api/v1/rules", SMALL, format="json").json()

    assert acme.admin.put(f"/api/v1/rules/{rule['id']}", SMALL, format="json").status_code == 405


def test_a_tool_takes_approvals_required_and_the_org_a_quorum_per_risk_tag(acme):
    register(acme, irreversible("refund", approvals_required=2))
    tools = acme.admin.get("/api/v1/tools").json()["tools"]
    assert next(t for t in tools if t["name"] == "refund")["approval"]["approvals_required"] == 2

    response = acme.admin.patch("/api/v1/org/settings", {"approvals_by_risk_tag": {"payments": 3}}, format="json")
    assert response.json()["approvals_by_risk_tag"] == {"payments": 3}
    bad = acme.admin.patch("/api/v1/org/settings", {"approvals_by_risk_tag": {"payments": 0}}, format="json")
    assert bad.status_code == 400
