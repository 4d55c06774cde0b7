"""POST /api/v1/tools and /api/v1/compensations: all or nothing, with clear 400s."""

from __future__ import annotations

import pytest

from effects.models import CompensationFunction, Tool
from tests.conftest import STANDARD_TOOLS, register_standard_tools


def post_tools(client, tools):
    return client.post("/api/v1/tools", {"tools": tools}, format="json")


@pytest.fixture
def undo_fn(acme):
    return CompensationFunction.objects.create(org=acme.org, fn_name="undo_send_email", fn_version="1.0.0",
                                               handler="webhook", target="https://hooks.example.com/undo")


def test_it_registers_the_three_tiers_in_one_request(acme, undo_fn):
    response = post_tools(acme.api, STANDARD_TOOLS)

    assert response.status_code == 200
    by_name = {tool["name"]: tool for tool in response.json()["tools"]}
    assert by_name["list_inactive_accounts"]["cost_weight"] == 0.01
    assert by_name["send_email"]["compensation"]["args"] == {"to": "{to}"}
    assert by_name["delete_account"]["irreversible"] is True
    assert by_name["send_email"]["irreversible"] is False
    assert by_name["delete_account"]["approval"]["risk_tags"] == ["data-loss"]
    assert Tool.objects.filter(org=acme.org).count() == 3


def test_it_updates_a_tool_registered_again(acme, undo_fn):
    post_tools(acme.api, STANDARD_TOOLS)

    post_tools(acme.api, [{"name": "list_inactive_accounts", "tier": "safe", "cost_weight": 0.5}])

    assert float(Tool.objects.get(org=acme.org, name="list_inactive_accounts").cost_weight) == 0.5
    assert Tool.objects.filter(org=acme.org).count() == 3


def test_a_compensable_tool_may_count_as_irreversible(acme, undo_fn):
    tool = {**STANDARD_TOOLS[1], "irreversible": True}

    response = post_tools(acme.api, [tool])

    assert response.json()["tools"][0]["irreversible"] is True


@pytest.mark.parametrize(("tool", "field"), [
    ({"name": "send_email", "tier": "compensable"}, "compensation"),
    ({"name": "delete_account", "tier": "irreversible"}, "approval"),
    ({"name": "delete_account", "tier": "irreversible", "approval": {"reason": "  "}}, "approval"),
    ({"name": "x", "tier": "dangerous"}, "tier"),
    ({"name": "x", "tier": "safe", "cost_weight": -1}, "cost_weight"),
    ({"name": "x", "tier": "safe", "colour": "red"}, "colour"),
    ({"name": "send_email", "tier": "compensable",
      "compensation": {"fn_name": "undo_send_email", "fn_version": "1.0"}}, "fn_version"),
])
def test_it_rejects_a_bad_tool_and_writes_nothing(acme, undo_fn, tool, field):
    response = post_tools(acme.api, [STANDARD_TOOLS[0], tool])

    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid"
    assert field in str(body["fields"])
    assert body["message"]
    assert not Tool.objects.exists()


def test_it_rejects_a_compensation_missing_from_the_registry(acme):
    response = post_tools(acme.api, [STANDARD_TOOLS[0], STANDARD_TOOLS[1]])

    assert response.status_code == 400
    assert "undo_send_email@1.0.0 is not in the compensation registry" in response.json()["message"]
    assert not Tool.objects.exists()


def test_it_does_not_use_another_orgs_compensation_function(acme, outsider):
    CompensationFunction.objects.create(org=outsider.org, fn_name="undo_send_email", fn_version="1.0.0",
                                        handler="webhook", target="https://hooks.example.com/undo")

    assert post_tools(acme.api, [STANDARD_TOOLS[1]]).status_code == 400


def test_it_lists_only_the_callers_tools(acme, outsider):
    register_standard_tools(acme)

    assert acme.api.get("/api/v1/tools").json()["tools"][0]["name"] == "delete_account"
    assert outsider.api.get("/api/v1/tools").json() == {"tools": []}
    assert len(acme.viewer.get("/api/v1/tools").json()["tools"]) == 3


def test_a_viewer_cannot_register_tools_but_an_admin_can(acme, undo_fn):
    assert post_tools(acme.viewer, STANDARD_TOOLS).status_code == 403
    assert post_tools(acme.reviewer, STANDARD_TOOLS).status_code == 403
    assert post_tools(acme.admin, STANDARD_TOOLS).status_code == 200


def test_it_registers_a_compensation_function(acme):
    body = {"fn_name": "undo_send_email", "fn_version": "1.2.0-beta.1", "handler": "webhook",
            "target": "https://hooks.example.com/undo", "timeout_ms": 3000}

    created = acme.api.post("/api/v1/compensations", body, format="json")
    again = acme.api.post("/api/v1/compensations", {**body, "timeout_ms": 4000}, format="json")

    assert created.status_code == 201
    assert again.status_code == 200
    assert CompensationFunction.objects.get(org=acme.org).timeout_ms == 4000


@pytest.mark.parametrize(("change", "field"), [
    ({"fn_version": "v1"}, "fn_version"),
    ({"handler": "ftp"}, "handler"),
    ({"target": "ftp://example.com/x"}, "target"),
    ({"handler": "python", "target": "not a path"}, "target"),
    ({"timeout_ms": "soon"}, "timeout_ms"),
])
def test_it_rejects_a_bad_compensation_function(acme, change, field):
    body = {"fn_name": "undo", "fn_version": "1.0.0", "handler": "webhook", "target": "https://h.example.com/u",
            **change}

    response = acme.api.post("/api/v1/compensations", body, format="json")

    assert response.status_code == 400
    assert field in response.json()["fields"]
    assert not CompensationFunction.objects.exists()


def test_private_webhook_targets_are_refused_unless_allowed(acme, settings):
    settings.UNDOLOG_ALLOW_PRIVATE_WEBHOOKS = False
    body = {"fn_name": "undo", "fn_version": "1.0.0", "handler": "webhook", "target": "http://127.0.0.1:9/undo"}

    response = acme.api.post("/api/v1/compensations", body, format="json")

    assert response.status_code == 400
    assert "private or loopback" in response.json()["fields"]["target"][0]
