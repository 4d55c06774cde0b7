"""The `agent` handler: undo entries claimed and reported over the API by the agent side, in
the walk's order, with the webhook's lease, attempts, backoff and escalation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from effects.models import UndoAttempt, UndoEntry
from lifecycle import undo
from tests.conftest import intercept, open_session

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]


def setup_stack(persona, n: int = 2, *, claim_timeout_s: int = 3600, max_retries: int = 1) -> str:
    response = persona.api.post("/api/v1/compensations", {"fn_name": "close_issue", "fn_version": "1.0.0",
                                                          "handler": "agent", "claim_timeout_s": claim_timeout_s},
                                format="json")
    assert response.status_code == 201, response.content
    assert response.json()["handler"] == "agent" and response.json()["target"] == ""
    persona.api.post("/api/v1/tools", {"tools": [
        {"name": "create_issue", "tier": "compensable",
         "compensation": {"fn_name": "close_issue", "fn_version": "1.0.0", "args": {"number": "{result.number}"},
                          "max_retries": max_retries, "retry_backoff_ms": 1}}]}, format="json")
    session_id = open_session(persona)
    for step in range(1, n + 1):
        effect = intercept(persona, session_id, "create_issue", {"title": f"t{step}"}, step).json()["effect"]
        persona.api.post(f"/api/v1/effects/{effect['id']}/commit", {"result": {"number": step}}, format="json")
    return session_id


def claim(persona, **body) -> list[dict]:
    response = persona.api.post("/api/v1/undo-entries/claim", {"max": 10, "lease_s": 30, **body}, format="json")
    assert response.status_code == 200, response.content
    return response.json()["entries"]


def report(persona, entry: dict, **body):
    return persona.api.post(f"/api/v1/undo-entries/{entry['id']}/report", body, format="json")


def session_state(persona, session_id: str) -> str:
    return persona.viewer.get(f"/api/v1/sessions/{session_id}").json()["state"]


def test_it_hands_entries_to_the_claimer_newest_first_and_finishes_the_walk(acme):
    session_id = setup_stack(acme)
    assert claim(acme) == []  # nothing to undo yet: the run is going fine

    acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "x"}, format="json")
    first = claim(acme)
    assert [(e["fn_name"], e["args"], e["attempt"]) for e in first] == [("close_issue", {"number": 2}, 1)]
    assert set(first[0]) >= {"id", "fn_name", "fn_version", "args", "attempt", "lease_expires_at"}
    assert claim(acme) == []  # held under its lease; the one below waits its turn

    assert report(acme, first[0], ok=True).status_code == 200
    second = claim(acme)
    assert [e["args"] for e in second] == [{"number": 1}]
    report(acme, second[0], ok=True)

    assert session_state(acme, session_id) == "compensated"


def test_the_dashboard_api_says_what_an_unclaimed_entry_waits_for(acme):
    session_id = setup_stack(acme, 1)
    acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "x"}, format="json")

    entry = acme.viewer.get("/api/v1/undo-entries", {"session": session_id}).json()["undo_entries"][0]

    assert entry["handler"] == "agent" and entry["state"] == "pending"
    assert "waiting for the agent side to claim it" in entry["waiting_for"]
    assert entry["claim_deadline"]


def test_a_failed_report_is_retried_after_backoff_then_escalates(acme):
    session_id = setup_stack(acme, 1, max_retries=1)
    acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "x"}, format="json")

    (entry,) = claim(acme)
    report(acme, entry, ok=False, error="upstream 503")
    (again,) = _eventually_claim(acme)
    assert again["attempt"] == 2
    report(acme, again, ok=False, error="upstream 503")

    assert session_state(acme, session_id) == "compensation_failed"
    assert [a.outcome for a in UndoAttempt.objects.filter(entry_id=entry["id"]).order_by("number")] == \
        ["retry", "retry"]


def _eventually_claim(persona) -> list[dict]:
    from tests.conftest import eventually

    return eventually(lambda: claim(persona) or None, timeout=5)


def test_a_permanent_failure_goes_to_a_person_at_once(acme):
    session_id = setup_stack(acme, 1, max_retries=5)
    acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "x"}, format="json")

    (entry,) = claim(acme)
    report(acme, entry, ok=False, error="issue is locked", permanent=True)

    assert session_state(acme, session_id) == "compensation_failed"
    assert UndoEntry.objects.get(pk=entry["id"]).last_error == "issue is locked"


def test_a_report_under_a_lost_claim_is_refused_and_the_entry_claimed_again(acme):
    session_id = setup_stack(acme, 1, max_retries=2)
    acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "x"}, format="json")
    (entry,) = claim(acme)
    UndoEntry.objects.filter(pk=entry["id"]).update(lease_until=timezone.now() - timedelta(seconds=1))

    (again,) = claim(acme)  # the first claimer died: its lease ran out

    assert again["attempt"] == 2
    answer = report(acme, entry, ok=True, attempt=1)
    assert answer.status_code == 409 and answer.json()["error"] == "undo_entry_not_claimed"
    assert [a.outcome for a in UndoAttempt.objects.filter(entry_id=entry["id"])] == ["lost"]
    assert report(acme, again, ok=True, attempt=2).status_code == 200
    assert session_state(acme, session_id) == "compensated"


def test_an_entry_nobody_claims_escalates_past_its_deadline(acme):
    session_id = setup_stack(acme, 1, claim_timeout_s=1)

    acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "x"}, format="json")  # eager: waits 1 s

    assert session_state(acme, session_id) == "compensation_failed"
    entry = UndoEntry.objects.get(session_id=session_id)
    assert entry.state == "compensation_failed" and "no agent claimed close_issue@1.0.0 within 1 s" in entry.last_error
    assert undo.due_sessions() == []


def test_claims_and_reports_are_for_agents_of_the_run_only(acme, outsider):
    session_id = setup_stack(acme, 1)
    acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "x"}, format="json")

    assert acme.reviewer.post("/api/v1/undo-entries/claim", {}, format="json").status_code == 403
    assert claim(outsider) == []
    (entry,) = claim(acme)
    answer = report(outsider, entry, ok=True)
    assert answer.status_code == 404 and answer.json()["error"] == "undo_entry_not_found"


@pytest.mark.parametrize("body", [{"max": 0}, {"max": 101}, {"lease_s": 0}, {"lease_s": "x"}, {"extra": 1}])
def test_a_bad_claim_is_a_400(acme, body):
    answer = acme.api.post("/api/v1/undo-entries/claim", body, format="json")
    assert answer.status_code == 400 and answer.json()["error"] == "invalid"


def test_an_agent_handler_takes_no_target_and_others_need_one(acme):
    bad = acme.api.post("/api/v1/compensations", {"fn_name": "f", "fn_version": "1.0.0", "handler": "agent",
                                                  "target": "https://x.io"}, format="json")
    missing = acme.api.post("/api/v1/compensations", {"fn_name": "f", "fn_version": "1.0.0",
                                                      "handler": "webhook"}, format="json")
    assert bad.status_code == missing.status_code == 400
    assert "target" in bad.json()["fields"] and "target" in missing.json()["fields"]


def test_the_session_page_says_what_an_unclaimed_entry_waits_for(acme):
    from tests.dashboard.conftest import page_client

    session_id = setup_stack(acme, 1)
    acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "x"}, format="json")

    html = page_client(acme).get(f"/sessions/{session_id}/").content.decode()

    assert "waiting for the agent side to claim it (gateway or serve_compensations)" in html
