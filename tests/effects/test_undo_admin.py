"""The compensation registry in the Django admin: list, search, semver, no deleting a function in
use, and each function's recent attempts and failure rate."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from effects.models import CompensationFunction, Tool, UndoAttempt
from tests.effects.conftest import build_stack

pytestmark = pytest.mark.django_db

FNS = "/admin/effects/compensationfunction/"


@pytest.fixture
def stack(acme):
    return build_stack(acme, "https://hooks.example.com/undo", 2)


def attempt(entry_id: str, number: int, outcome: str, status: int | None = None, error: str = "") -> None:
    UndoAttempt.objects.create(entry_id=entry_id, number=number, started_at=timezone.now(), duration_ms=12,
                               outcome=outcome, status_code=status, error=error)


def test_it_lists_functions_with_their_failure_rate(staff, stack):
    attempt(stack.entries[0], 1, "retry", 503)
    attempt(stack.entries[0], 2, "success", 200)
    attempt(stack.entries[1], 1, "permanent", 404)
    attempt(stack.entries[1], 2, "success", 200)

    page = staff.get(FNS).content.decode()

    assert "undo_send_email" in page
    assert "50% (2 of 4)" in page


def test_it_searches_functions_and_tools(staff, stack, acme):
    CompensationFunction.objects.create(org=acme.org, fn_name="undo_refund", fn_version="2.1.0",
                                        handler="webhook", target="https://hooks.example.com/refund")

    page = staff.get(FNS, {"q": "refund"}).content.decode()
    tools = staff.get("/admin/effects/tool/", {"q": "undo_send"}).content.decode()

    assert "undo_refund" in page and "undo_send_email" not in page
    assert "send_email" in tools


def test_it_shows_a_functions_recent_attempts(staff, stack):
    attempt(stack.entries[0], 1, "retry", None, "timed out after 5 s")
    fn = CompensationFunction.objects.get()

    page = staff.get(f"{FNS}{fn.pk}/change/").content.decode()

    assert "Recent attempts" in page and "timed out after 5 s" in page
    assert "tools: send_email; undo entries: 2" in page


def add_form(acme, version: str) -> dict:
    return {"org": str(acme.org.pk), "fn_name": "undo_refund", "fn_version": version, "handler": "webhook",
            "target": "https://hooks.example.com/refund", "timeout_ms": "5000", "claim_timeout_s": "3600",
            "description": ""}


@pytest.mark.parametrize("version", ["1.0", "v1.0.0", "01.0.0", "1.0.0.0", ""])
def test_it_refuses_a_version_that_is_not_semver(staff, acme, version):
    response = staff.post(f"{FNS}add/", add_form(acme, version))

    assert response.status_code == 200
    assert not CompensationFunction.objects.filter(fn_name="undo_refund").exists()


@pytest.mark.parametrize("version", ["1.0.0", "2.0.0-rc.1", "1.2.3+build.7"])
def test_it_adds_a_semver_version(staff, acme, version):
    response = staff.post(f"{FNS}add/", add_form(acme, version))

    assert response.status_code == 302
    assert CompensationFunction.objects.get(fn_name="undo_refund").fn_version == version


def test_it_refuses_a_python_target_that_is_not_a_dotted_path(staff, acme):
    form = {**add_form(acme, "1.0.0"), "handler": "python", "target": "not a path"}

    assert staff.post(f"{FNS}add/", form).status_code == 200
    assert not CompensationFunction.objects.filter(fn_name="undo_refund").exists()


def test_a_saved_version_cannot_be_edited_in_place(staff, stack, acme):
    fn = CompensationFunction.objects.get()
    form = {**add_form(acme, "9.9.9"), "fn_name": "renamed", "timeout_ms": "7000"}

    assert staff.post(f"{FNS}{fn.pk}/change/", form).status_code == 302

    fn.refresh_from_db()
    assert (fn.fn_name, fn.fn_version, fn.timeout_ms) == ("undo_send_email", "1.0.0", 7000)


def test_a_function_in_use_cannot_be_deleted(staff, stack):
    fn = CompensationFunction.objects.get()

    assert staff.get(f"{FNS}{fn.pk}/delete/").status_code == 403
    response = staff.post(FNS, {"action": "delete_selected", "_selected_action": [fn.pk], "post": "yes"})

    assert "Cannot delete compensation function" in response.content.decode()
    assert CompensationFunction.objects.filter(pk=fn.pk).exists()


def test_a_function_no_longer_used_can_be_deleted(staff, acme):
    fn = CompensationFunction.objects.create(org=acme.org, fn_name="undo_old", fn_version="0.1.0",
                                             handler="webhook", target="https://hooks.example.com/old")

    response = staff.post(f"{FNS}{fn.pk}/delete/", {"post": "yes"})

    assert response.status_code == 302
    assert not CompensationFunction.objects.filter(pk=fn.pk).exists()


def test_a_tool_cannot_point_at_another_orgs_function(staff, stack, outsider):
    theirs = CompensationFunction.objects.create(org=outsider.org, fn_name="undo_x", fn_version="1.0.0",
                                                 handler="webhook", target="https://hooks.example.com/x")
    tool = Tool.objects.get(name="send_email")
    form = {"org": str(tool.org_id), "name": "send_email", "tier": "compensable", "description": "",
            "cost_weight": "1", "irreversible": "", "annotations": "{}", "compensation_fn": str(theirs.pk),
            "compensation_args": "{}", "max_retries": "3", "retry_backoff_ms": "1000", "approval_reason": "",
            "risk_tags": "[]", "estimated_impact": "", "executor_url": "", "executor_timeout_ms": "10000"}

    response = staff.post(f"/admin/effects/tool/{tool.pk}/change/", form)

    assert response.status_code == 200
    assert "another organization" in response.content.decode()
    assert Tool.objects.get(pk=tool.pk).compensation_fn.org_id == tool.org_id


def tool_form(tool: Tool, **changes: str) -> dict:
    return {"org": str(tool.org_id), "name": tool.name, "tier": tool.tier, "description": "", "cost_weight": "1",
            "irreversible": "", "annotations": "{}", "labels": "[]", "untrusted_fields": "[]",
            "compensation_fn": str(tool.compensation_fn_id or ""), "compensation_args": "{}", "max_retries": "3",
            "retry_backoff_ms": "1000", "approval_reason": tool.approval_reason, "risk_tags": "[]",
            "estimated_impact": "", "executor_url": "", "executor_timeout_ms": "10000", "approvals_required": "1",
            **changes}


def test_an_operator_labels_a_tool_in_the_admin_and_the_list_shows_it(staff, stack):
    tool = Tool.objects.get(name="send_email")

    response = staff.post(f"/admin/effects/tool/{tool.pk}/change/",
                          tool_form(tool, labels='["external", "mail"]', untrusted_fields='["body"]'))

    assert response.status_code == 302, response.content.decode()
    tool.refresh_from_db()
    assert (tool.labels, tool.untrusted_fields) == (["external", "mail"], ["body"])
    assert "external" in staff.get("/admin/effects/tool/").content.decode()


BAD_LABELS = ['"untrusted"', "[1, 2]", '[""]', json.dumps(["x" * 41]), json.dumps(["l"] * 17)]


@pytest.mark.parametrize("labels", BAD_LABELS)
def test_the_admin_refuses_labels_that_are_not_a_short_list_of_short_strings(staff, stack, labels):
    tool = Tool.objects.get(name="send_email")

    response = staff.post(f"/admin/effects/tool/{tool.pk}/change/", tool_form(tool, labels=labels))

    assert response.status_code == 200
    assert "at most 16 strings" in response.content.decode()
    assert Tool.objects.get(pk=tool.pk).labels == []
