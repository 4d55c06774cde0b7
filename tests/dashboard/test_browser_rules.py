"""The Rules page and the quorum display in a real headless Chromium against the real ASGI
server: a condition's error shows where it is, the 7-day trial gives the real counts, a saved
rule decides the next call; "1 of 2" in the queue and on the request, live."""

from __future__ import annotations

import httpx
import pytest

from approvals.models import ApprovalRequest, Rule
from tests.approvals.conftest import irreversible, register
from tests.conftest import intercept, open_session, register_standard_tools
from tests.dashboard.conftest import SCREENSHOTS, log_in

pytestmark = pytest.mark.django_db(transaction=True)


def seed(persona, amounts: list[int]) -> None:
    for amount in amounts:
        response = intercept(persona, open_session(persona), "refund", {"amount": amount}, 1)
        assert response.status_code == 202


def test_an_admin_tries_a_rule_against_the_last_seven_days_then_saves_it(acme, server, new_page):
    register_standard_tools(acme)
    register(acme, irreversible("refund"))
    seed(acme, [5, 20, 50, 900, 3000])
    page = new_page()
    log_in(page, acme.admin.user)
    page.goto("/rules/")

    page.fill("textarea[name=condition]", 'tool.name == "refund" &&\n  args.amount <= ')
    page.click("#trial-button")
    page.wait_for_selector("#condition-error:not([hidden])")
    assert "line 2, column 18" in page.inner_text("#condition-error")

    page.fill("textarea[name=condition]", 'tool.name == "refund" && args.amount <= 50')
    page.click("#trial-button")
    page.wait_for_selector("#trial-result:not([hidden])")
    assert page.is_hidden("#condition-error")
    assert ("Of 5 requests in the last 7 days, this rule would have approved 3, denied 0 and left 2 to people"
            in page.inner_text("#trial-counts"))
    assert page.locator(".trial-approved li").count() == 3
    page.screenshot(path=str(SCREENSHOTS / "rules-trial.png"), full_page=True)

    page.fill("input[name=name]", "small-refunds")
    page.click("#save-rule")
    page.wait_for_selector('tr.rule-row:has-text("small-refunds")')
    assert Rule.objects.get().condition == 'tool.name == "refund" && args.amount <= 50'
    assert "created" in page.inner_text("#rule-changes")
    decided = intercept(acme, open_session(acme), "refund", {"amount": 10}, 1).json()
    assert decided["approval"]["decided_by"] == "rule:small-refunds"


def test_the_rules_page_fits_a_phone(acme, server, new_page):
    acme.admin.post("/api/v1/rules", {"name": "big", "condition": "args.amount > 1000", "outcome": "deny"},
                    format="json")
    page = new_page({"width": 390, "height": 844})
    log_in(page, acme.reviewer.user)
    page.goto("/rules/")

    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert page.is_visible("#trial-button")
    assert page.locator("#save-rule").count() == 0  # reviewers try, admins save


def test_the_queue_and_the_request_show_one_of_two_live(acme, server, new_page):
    register_standard_tools(acme)
    register(acme, irreversible("refund", approvals_required=2))
    approval_id = intercept(acme, open_session(acme), "refund", {"amount": 10}, 1).json()["approval"]["id"]
    queue = new_page()
    log_in(queue, acme.viewer.user)
    row = f'tr.queue-row[data-id="{approval_id}"] .quorum'
    assert queue.inner_text(row) == "0 of 2"

    reviewer = new_page()
    log_in(reviewer, acme.reviewer.user)
    reviewer.goto(f"/approvals/{approval_id}/")
    reviewer.click("#approve-button")
    reviewer.wait_for_selector('#quorum .quorum-count:text("1 of 2")')
    assert "another reviewer must approve" in reviewer.inner_text("#flash")
    assert "acme-reviewer" in reviewer.inner_text("#quorum")
    queue.wait_for_selector(f'{row}:text("1 of 2")')  # the queue follows without a reload

    second = acme.person("second", "reviewer")
    token = second._credentials["HTTP_AUTHORIZATION"]
    # Over HTTP: the server's process publishes the decision (this thread runs the browser's loop).
    answer = httpx.post(f"{server}/api/v1/approvals/{approval_id}/approve", json={},
                        headers={"Authorization": token}, timeout=30)
    assert answer.status_code == 200, answer.text
    reviewer.wait_for_selector("#decision.decision-approved")
    assert "second" in reviewer.inner_text("#decision")
    assert ApprovalRequest.objects.get(pk=approval_id).state == "approved"


def test_an_admin_makes_a_reviewer_group_and_hands_big_refunds_to_it(acme, server, new_page):
    register(acme, irreversible("refund"))
    acme.person("dana", "reviewer")
    page = new_page()
    log_in(page, acme.admin.user)
    page.goto("/rules/")

    page.fill("#group-form input[name=name]", "finance")
    page.check('#group-form input[name=members][value="dana"]')
    page.click("#save-group")
    page.wait_for_selector('#group-rows .group-row:has-text("finance")')
    assert "dana" in page.inner_text("#group-rows")

    page.fill("#rule-form input[name=name]", "big-refunds")
    page.fill("textarea[name=condition]", "args.amount > 1000")
    page.select_option("select[name=outcome]", "require")
    page.fill("input[name=approvals_required]", "1")
    assert page.is_visible("#group-field")
    page.select_option("select[name=reviewer_group]", "finance")
    page.click("#save-rule")
    page.wait_for_selector('tr.rule-row:has-text("big-refunds")')
    assert "1 approver from finance" in page.inner_text('tr.rule-row:has-text("big-refunds")')

    approval_id = intercept(acme, open_session(acme), "refund", {"amount": 5000}, 1).json()["approval"]["id"]
    page.goto("/")
    assert page.inner_text(f'tr.queue-row[data-id="{approval_id}"] .group') == "needs finance"
    page.goto(f"/approvals/{approval_id}/")  # the admin is not in finance: no approve, an explanation
    assert page.is_visible("#not-in-group") and page.locator("#approve-button").count() == 0
    assert page.is_visible("#reject-button")
