"""The reviewer API: queue, detail, approve, reject (and roll back), extend; who may do what."""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import ApprovalRequest
from budgets.models import Refusal
from effects.models import Effect, EffectTransition, Session, SessionTransition
from orgs.models import Event
from tests.approvals.conftest import hold
from tests.conftest import intercept, open_session, register_standard_tools


def url(approval_id: str, verb: str = "") -> str:
    return f"/api/v1/approvals/{approval_id}" + (f"/{verb}" if verb else "")


def test_it_lists_pending_requests_oldest_deadline_first(acme):
    held = [hold(acme, args={"account_id": f"acct-{n}"}) for n in range(3)]
    for minutes, body in zip([30, 10, 20], held, strict=True):
        ApprovalRequest.objects.filter(pk=body["approval"]["id"]).update(
            timeout_at=timezone.now() + timedelta(minutes=minutes))

    response = acme.reviewer.get("/api/v1/approvals?state=pending")

    assert response.status_code == 200
    rows = response.json()["approvals"]
    assert [row["id"] for row in rows] == [held[1]["approval"]["id"], held[2]["approval"]["id"],
                                           held[0]["approval"]["id"]]
    first = rows[0]
    assert first["tool"] == "delete_account" and first["agent"] == "cleanup"
    assert first["risk_tags"] == ["data-loss"]
    assert first["estimated_impact"] == "account acct-1 and its data"
    assert first["proposed_args"] == {"account_id": "acct-1"}
    assert 500 < first["seconds_left"] <= 600
    assert "agent_context" not in first


def test_it_filters_by_state_and_refuses_an_unknown_state(acme):
    body = hold(acme)
    acme.reviewer.post(url(body["approval"]["id"], "approve"), {}, format="json")
    hold(acme, args={"account_id": "acct-2"})

    assert [r["state"] for r in acme.reviewer.get("/api/v1/approvals?state=approved").json()["approvals"]] == \
        ["approved"]
    assert len(acme.reviewer.get("/api/v1/approvals").json()["approvals"]) == 2
    bad = acme.reviewer.get("/api/v1/approvals?state=maybe")
    assert bad.status_code == 400 and bad.json()["error"] == "invalid" and "state" in bad.json()["fields"]
    assert acme.reviewer.get("/api/v1/approvals?limit=0").status_code == 400


def test_it_shows_one_request_with_the_agents_full_context(acme):
    register_standard_tools(acme)
    session = open_session(acme)
    intercept(acme, session, "send_email", {"to": "a@x.io"}, 2, reasoning="tell the owner first")
    body = hold(acme, session=session, step=4, reasoning="acct-101 inactive for a year\nsecond line",
                safe_calls=[{"tool": "list_inactive_accounts", "step_index": 3, "args": {}}])

    response = acme.viewer.get(url(body["approval"]["id"]))

    assert response.status_code == 200
    detail = response.json()
    assert [(c["step_index"], c["tool"], c["tier"]) for c in detail["agent_context"]["calls"]] == \
        [(2, "send_email", "compensable"), (3, "list_inactive_accounts", "safe")]
    assert [step["text"] for step in detail["agent_context"]["reasoning"]] == \
        ["tell the owner first", "acct-101 inactive for a year\nsecond line"]
    assert detail["reason"] == "Deletes an account for good"
    assert detail["args_digest"] == Effect.objects.get(pk=body["effect"]["id"]).args_digest
    assert (detail["effect_state"], detail["session_state"], detail["decision"]) == \
        ("pending", "awaiting_approval", None)
    assert detail["executor"] is False


def test_a_reviewer_approves_and_the_run_goes_on(acme):
    body = hold(acme)

    response = acme.reviewer.post(url(body["approval"]["id"], "approve"), {"reason": "checked"}, format="json")

    assert response.status_code == 200, response.content
    approval = response.json()["approval"]
    assert (approval["state"], approval["decided_by"], approval["decision_reason"]) == \
        ("approved", "acme-reviewer", "checked")
    assert approval["decided_at"]
    assert Effect.objects.get(pk=body["effect"]["id"]).state == "approved"
    assert Session.objects.get(pk=body["session"]).state == "running"
    assert [(t.from_state, t.to_state, t.actor) for t in EffectTransition.objects.filter(
        effect_id=body["effect"]["id"])] == [("pending", "approved", "acme-reviewer")]
    assert SessionTransition.objects.filter(session_id=body["session"], to_state="running",
                                            actor="acme-reviewer").count() == 1
    event = Event.objects.get(kind="approval.decided")
    assert (event.data["decision"], event.data["decided_by"]) == ("approved", "acme-reviewer")
    effect = acme.api.get(f"/api/v1/effects/{body['effect']['id']}").json()
    assert (effect["decision"], effect["effect"]["approval"]["decided_by"]) == ("approved", "acme-reviewer")


def test_an_approval_is_bound_to_the_args_digest_it_was_given(acme):
    body = hold(acme)
    digest = Effect.objects.get(pk=body["effect"]["id"]).args_digest

    wrong = acme.reviewer.post(url(body["approval"]["id"], "approve"), {"args_digest": "0" * 64}, format="json")

    assert wrong.status_code == 409
    assert wrong.json()["error"] == "args_digest_mismatch"
    assert ApprovalRequest.objects.get(pk=body["approval"]["id"]).state == "pending"
    assert acme.reviewer.post(url(body["approval"]["id"], "approve"), {"args_digest": "xyz"},
                              format="json").status_code == 400
    right = acme.reviewer.post(url(body["approval"]["id"], "approve"), {"args_digest": digest}, format="json")
    assert right.status_code == 200
    assert ApprovalRequest.objects.get(pk=body["approval"]["id"]).decided_args_digest == digest


def test_a_second_decision_is_409_already_decided(acme):
    body = hold(acme)
    assert acme.reviewer.post(url(body["approval"]["id"], "approve"), {}, format="json").status_code == 200

    for verb, data in [("approve", {}), ("reject", {"reason": "no"}), ("extend", {"minutes": 5})]:
        again = acme.admin.post(url(body["approval"]["id"], verb), data, format="json")
        assert again.status_code == 409, verb
        assert again.json()["error"] == "already_decided"
        assert again.json()["state"] == "approved"
    assert EffectTransition.objects.filter(effect_id=body["effect"]["id"]).count() == 1
    assert Event.objects.filter(kind="approval.decided").count() == 1


def test_a_rejection_needs_a_reason(acme):
    body = hold(acme)

    for data in [{}, {"reason": ""}, {"reason": "   "}]:
        response = acme.reviewer.post(url(body["approval"]["id"], "reject"), data, format="json")
        assert response.status_code == 400, data
        assert response.json()["error"] == "invalid"
        assert "reason" in response.json()["fields"]
    assert acme.reviewer.post(url(body["approval"]["id"], "reject"), {"reason": "no", "extra": 1},
                              format="json").status_code == 400
    assert ApprovalRequest.objects.get(pk=body["approval"]["id"]).state == "pending"
    assert Session.objects.get(pk=body["session"]).state == "awaiting_approval"


def test_a_rejection_halts_the_session_and_tells_the_caller_why(acme):
    body = hold(acme)

    response = acme.reviewer.post(url(body["approval"]["id"], "reject"), {"reason": "open invoice"},
                                  format="json")

    assert response.status_code == 200
    assert response.json()["approval"]["decision"] == "rejected"
    assert Effect.objects.get(pk=body["effect"]["id"]).state == "rejected"
    assert Session.objects.get(pk=body["session"]).state == "halted"
    refusal = Refusal.objects.get()
    assert (refusal.kind, refusal.decided_by, refusal.reason, refusal.tool_name) == \
        ("approval", "acme-reviewer", "open invoice", "delete_account")
    assert Event.objects.get(kind="permission_denied").data["kind"] == "approval"
    polled = acme.api.get(f"/api/v1/effects/{body['effect']['id']}?wait=1").json()
    assert (polled["decision"], polled["reason"]) == ("rejected", "open invoice")
    replay = intercept(acme, body["session"], "delete_account", {"account_id": "acct-101"}, 1).json()
    assert replay["decision"] == "replay"
    assert (replay["effect"]["decision"], replay["effect"]["reason"]) == ("rejected", "open invoice")


def test_reject_with_rollback_fails_the_session_so_its_undo_stack_is_walked(acme):
    body = hold(acme)

    response = acme.reviewer.post(url(body["approval"]["id"], "reject") + "?rollback=true",
                                  {"reason": "wrong account"}, format="json")

    assert response.status_code == 200
    assert response.json()["approval"]["rollback"] is True
    session = Session.objects.get(pk=body["session"])
    assert session.state in ("compensating", "compensated")  # failed, then walked back
    assert session.transitions.filter(to_state="failed").count() == 1
    assert session.error == "wrong account"
    assert acme.reviewer.post(url(hold(acme, args={"account_id": "x"})["approval"]["id"], "reject")
                              + "?rollback=perhaps", {"reason": "no"}, format="json").status_code == 400


def test_extend_pushes_the_deadline_further(acme):
    body = hold(acme)
    before = ApprovalRequest.objects.get(pk=body["approval"]["id"]).timeout_at

    response = acme.reviewer.post(url(body["approval"]["id"], "extend"), {"minutes": 30}, format="json")

    assert response.status_code == 200
    after = ApprovalRequest.objects.get(pk=body["approval"]["id"]).timeout_at
    assert after - before == timedelta(minutes=30)
    assert Event.objects.get(kind="approval.extended").data["extended_by"] == "acme-reviewer"
    for bad in [{}, {"minutes": 0}, {"minutes": "soon"}, {"minutes": 10**6}]:
        assert acme.reviewer.post(url(body["approval"]["id"], "extend"), bad, format="json").status_code == 400


def test_a_viewer_reads_but_cannot_decide(acme):
    body = hold(acme)

    assert acme.viewer.get("/api/v1/approvals?state=pending").status_code == 200
    assert acme.viewer.get(url(body["approval"]["id"])).status_code == 200
    for verb, data in [("approve", {}), ("reject", {"reason": "no"}), ("extend", {"minutes": 5})]:
        response = acme.viewer.post(url(body["approval"]["id"], verb), data, format="json")
        assert response.status_code == 403, verb
        assert response.json()["error"] == "forbidden"
    assert ApprovalRequest.objects.get(pk=body["approval"]["id"]).state == "pending"


def test_an_admin_decides_too(acme):
    body = hold(acme)

    assert acme.admin.post(url(body["approval"]["id"], "reject"), {"reason": "no"}, format="json").status_code == 200


def test_the_agents_own_key_can_never_decide(acme):
    body = hold(acme)

    for verb, data in [("approve", {}), ("reject", {"reason": "no"}), ("extend", {"minutes": 5})]:
        assert acme.api.post(url(body["approval"]["id"], verb), data, format="json").status_code == 403
    assert acme.api.get("/api/v1/approvals").status_code == 403
    assert ApprovalRequest.objects.get(pk=body["approval"]["id"]).state == "pending"


def test_anonymous_callers_get_401(acme, client):
    body = hold(acme)

    assert client.get("/api/v1/approvals").status_code == 401
    assert client.post(url(body["approval"]["id"], "approve"), {}, content_type="application/json").status_code == 401


def test_another_orgs_request_is_404(acme, outsider):
    body = hold(acme)

    for response in [outsider.reviewer.get(url(body["approval"]["id"])),
                     outsider.reviewer.post(url(body["approval"]["id"], "approve"), {}, format="json"),
                     outsider.admin.post(url(body["approval"]["id"], "reject"), {"reason": "x"}, format="json"),
                     acme.reviewer.post(url("0" * 8 + "-0000-0000-0000-" + "0" * 12, "approve"), {}, format="json"),
                     acme.reviewer.get(url("-" * 36))]:
        assert response.status_code == 404
        assert response.json()["error"] == "approval_not_found"
    assert outsider.reviewer.get("/api/v1/approvals").json()["approvals"] == []
    assert ApprovalRequest.objects.get(pk=body["approval"]["id"]).state == "pending"


def test_wrong_methods_are_405(acme):
    body = hold(acme)

    assert acme.reviewer.get(url(body["approval"]["id"], "approve")).status_code == 405
    assert acme.reviewer.delete(url(body["approval"]["id"])).status_code == 405
    assert acme.reviewer.put(url(body["approval"]["id"]), {}, format="json").status_code == 405
    assert acme.reviewer.post("/api/v1/approvals", {}, format="json").status_code == 405
    assert acme.reviewer.post("/api/v1/approvals/stats", {}, format="json").status_code == 405


def test_malformed_json_is_400(acme):
    body = hold(acme)

    response = acme.reviewer.post(url(body["approval"]["id"], "reject"), "{not json",
                                  content_type="application/json")

    assert response.status_code == 400
    assert response.json()["error"] == "malformed_json"
    assert acme.reviewer.post(url(body["approval"]["id"], "reject"), [1], format="json").status_code == 400


def test_a_run_failed_while_waiting_withdraws_its_request(acme):
    body = hold(acme)
    assert acme.api.post(f"/api/v1/sessions/{body['session']}/fail", {"error": "gave up"},
                         format="json").status_code == 200

    approval = ApprovalRequest.objects.get(pk=body["approval"]["id"])
    assert (approval.state, approval.decided_by_label) == ("expired", "agent:cleanup")
    assert Effect.objects.get(pk=body["effect"]["id"]).state == "expired"
    assert not acme.reviewer.get("/api/v1/approvals?state=pending").json()["approvals"]
    for verb, data in [("approve", {}), ("reject", {"reason": "run is over"})]:
        late = acme.reviewer.post(url(body["approval"]["id"], verb), data, format="json")
        assert (late.status_code, late.json()["error"]) == (409, "already_decided"), verb
    assert Event.objects.filter(kind="approval.expired", data__withdrawn=True).count() == 1


def test_after_the_deadline_only_the_deadline_approves_but_a_reviewer_may_still_reject(acme):
    body = hold(acme)
    ApprovalRequest.objects.filter(pk=body["approval"]["id"]).update(timeout_at=timezone.now() - timedelta(seconds=1))

    for verb, data in [("approve", {}), ("extend", {"minutes": 5})]:
        late = acme.reviewer.post(url(body["approval"]["id"], verb), data, format="json")
        assert late.status_code == 409, verb
        assert late.json()["error"] == "deadline_passed"
    assert ApprovalRequest.objects.get(pk=body["approval"]["id"]).state == "pending"
    assert acme.reviewer.post(url(body["approval"]["id"], "reject"), {"reason": "too late anyway"},
                              format="json").status_code == 200


def test_a_reviewer_logged_in_with_a_session_needs_the_csrf_token(acme):
    from django.test import Client

    body = hold(acme)
    acme.reviewer.user.set_password("pw")
    acme.reviewer.user.save()
    browser = Client(enforce_csrf_checks=True)
    login = browser.get("/accounts/login/")
    browser.post("/accounts/login/", {"username": "acme-reviewer", "password": "pw",
                                      "csrfmiddlewaretoken": login.cookies["csrftoken"].value})

    without = browser.post(url(body["approval"]["id"], "approve"), {}, content_type="application/json")
    assert without.status_code == 403
    assert ApprovalRequest.objects.get(pk=body["approval"]["id"]).state == "pending"
    token = browser.cookies["csrftoken"].value
    with_token = browser.post(url(body["approval"]["id"], "approve"), {}, content_type="application/json",
                              HTTP_X_CSRFTOKEN=token)
    assert with_token.status_code == 200, with_token.content


def test_the_queue_takes_the_same_queries_for_one_request_or_twenty(acme, django_assert_max_num_queries):
    hold(acme)
    with CaptureQueriesContext(connection) as one:
        acme.reviewer.get("/api/v1/approvals?state=pending")
    queries_for_one = len(one)  # now: the log it reads is reset by the next request
    for n in range(19):
        hold(acme, args={"account_id": f"acct-{n}"})

    with django_assert_max_num_queries(queries_for_one):
        response = acme.reviewer.get("/api/v1/approvals?state=pending")
    assert len(response.json()["approvals"]) == 20

