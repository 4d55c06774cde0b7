"""Grants (`/api/v1/grants`): a reviewer approves a tool for an agent for the rest of a run or for
some minutes; a matching irreversible call is then decided at once as `grant:<id>` (history,
events, stats), budgets still refuse first, and grants expire and can be revoked."""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import ApprovalRequest, Grant
from budgets.models import Refusal
from effects.models import Effect, EffectTransition, Session
from orgs.models import Event
from tests.approvals.conftest import hold
from tests.conftest import intercept, open_session, register_standard_tools


def grant(persona, **body):
    return persona.reviewer.post("/api/v1/grants", {"agent": "cleanup", "tool": "delete_account", **body},
                                 format="json")


def call(persona, session: str, step: int, account: str = "acct-1"):
    return intercept(persona, session, "delete_account", {"account_id": account}, step)


def test_a_run_grant_decides_the_next_calls_of_that_run_at_once(acme):
    register_standard_tools(acme)
    session = open_session(acme)
    issued = grant(acme, session=session, reason="cleanup of test accounts")
    assert issued.status_code == 201, issued.content
    grant_id = issued.json()["grant"]["id"]

    answer = call(acme, session, 1)

    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["decision"] == "approved"
    assert body["effect"]["state"] == "approved"
    assert body["approval"]["decided_by"] == f"grant:{grant_id}"
    assert Session.objects.get(pk=session).state == "running"
    approval = ApprovalRequest.objects.get(pk=body["approval"]["id"])
    assert (approval.state, approval.decided_by_label, approval.decided_by) == ("approved", f"grant:{grant_id}", None)
    assert EffectTransition.objects.get(effect_id=body["effect"]["id"]).actor == f"grant:{grant_id}"
    decided = Event.objects.get(kind="approval.decided")
    assert (decided.data["decided_by"], decided.data["grant"]) == (f"grant:{grant_id}", grant_id)
    assert not Event.objects.filter(kind="approval.requested").exists()  # nobody is asked
    stats = acme.reviewer.get("/api/v1/approvals/stats").json()
    assert (stats["approved"], stats["granted"], stats["median_time_to_decide_s"]) == (1, 1, None)
    # The agent claims and runs it as after any approval.
    assert acme.api.post(f"/api/v1/effects/{body['effect']['id']}/start").status_code == 200
    assert acme.api.post(f"/api/v1/effects/{body['effect']['id']}/commit", {"result": "ok"},
                         format="json").status_code == 200
    assert call(acme, session, 2, "acct-2").json()["decision"] == "approved"


def test_a_run_grant_does_not_cover_another_run_or_another_tool(acme):
    register_standard_tools(acme)
    first, second = open_session(acme), open_session(acme)
    grant(acme, session=first)
    acme.reviewer.post("/api/v1/grants", {"agent": "cleanup", "tool": "send_email", "minutes": 5}, format="json")

    assert call(acme, second, 1).status_code == 202  # waits for a person


def test_a_minutes_grant_covers_every_run_until_it_expires(acme):
    register_standard_tools(acme)
    grant_id = grant(acme, minutes=30).json()["grant"]["id"]
    assert call(acme, open_session(acme), 1).json()["decision"] == "approved"

    Grant.objects.filter(pk=grant_id).update(expires_at=timezone.now() - timedelta(seconds=1))

    assert call(acme, open_session(acme), 1).status_code == 202
    listed = acme.viewer.get("/api/v1/grants").json()["grants"]
    assert [(g["id"], g["live"]) for g in listed] == [(grant_id, False)]
    assert acme.viewer.get("/api/v1/grants?live=true").json()["grants"] == []


def test_a_revoked_grant_decides_nothing_and_stays_listed(acme):
    register_standard_tools(acme)
    grant_id = grant(acme, minutes=30).json()["grant"]["id"]

    assert acme.reviewer.delete(f"/api/v1/grants/{grant_id}").status_code == 204
    assert acme.reviewer.delete(f"/api/v1/grants/{grant_id}").json()["error"] == "grant_revoked"

    assert call(acme, open_session(acme), 1).status_code == 202
    row = acme.viewer.get("/api/v1/grants").json()["grants"][0]
    assert (row["live"], row["revoked_by"]) == (False, "acme-reviewer")
    assert [e.kind for e in Event.objects.filter(kind__startswith="grant.").order_by("created")] == [
        "grant.issued", "grant.revoked"]


def test_the_budget_refuses_before_any_grant_decides(acme):
    register_standard_tools(acme)
    acme.admin.patch("/api/v1/agents/cleanup/budget", {"max_irreversible_per_run": 1}, format="json")
    session = open_session(acme)
    grant(acme, session=session)
    assert call(acme, session, 1).json()["decision"] == "approved"

    refused = call(acme, session, 2, "acct-2")

    assert refused.status_code == 429 and refused.json()["decision"] == "refused"
    assert Refusal.objects.get().kind == "budget"
    assert Effect.objects.filter(session_id=session).count() == 1


def test_a_grant_costs_one_query_and_only_calls_that_would_wait_pay_it(acme):
    register_standard_tools(acme)
    session = open_session(acme)
    with CaptureQueriesContext(connection) as compensable:
        assert intercept(acme, session, "send_email", {"to": "a@example.com"}, 1).status_code == 201
    assert not [q for q in compensable.captured_queries if "approvals_grant" in q["sql"]]
    with CaptureQueriesContext(connection) as irreversible:
        assert call(acme, session, 2).status_code == 202
    assert len([q for q in irreversible.captured_queries if "approvals_grant" in q["sql"]]) == 1


def test_who_may_issue_and_what_is_refused(acme, outsider):
    register_standard_tools(acme)
    session = open_session(acme)
    assert acme.viewer.post("/api/v1/grants", {"agent": "cleanup", "tool": "delete_account", "minutes": 5},
                            format="json").status_code == 403
    assert acme.api.get("/api/v1/grants").status_code == 403  # agents never see or issue grants
    for body, field in [({"minutes": 5, "session": session}, "session"), ({}, "session"),
                        ({"minutes": 0}, "minutes"), ({"minutes": 5, "agent": "nobody"}, "agent"),
                        ({"minutes": 5, "tool": "nope"}, "tool"),
                        ({"session": "6f1c9b2e-0d3a-4c55-9a51-2f3e1d0c7b8a"}, "session")]:
        response = grant(acme, **body)
        assert response.status_code == 400 and field in response.json()["fields"], (body, response.content)
    assert not Grant.objects.exists()
    grant_id = grant(acme, minutes=5).json()["grant"]["id"]
    assert outsider.reviewer.delete(f"/api/v1/grants/{grant_id}").status_code == 404
    assert outsider.reviewer.get("/api/v1/grants").json()["grants"] == []
    # Another org's run cannot be named either.
    register_standard_tools(outsider)
    assert grant(acme, session=open_session(outsider)).status_code == 400


def test_a_pending_request_is_not_decided_by_a_later_grant(acme):
    body = hold(acme)
    grant(acme, minutes=5)
    assert ApprovalRequest.objects.get(pk=body["approval"]["id"]).state == "pending"
