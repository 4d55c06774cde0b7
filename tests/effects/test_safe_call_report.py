"""`POST /api/v1/sessions/{id}/safe-calls`: SAFE calls reported on their own (a gateway replica
whose run's next call may reach another replica), charged exactly as an intercept's would be."""

from __future__ import annotations

import pytest

from effects.models import SafeCall, Session

pytestmark = pytest.mark.django_db


def report(persona, session_id, calls):
    return persona.api.post(f"/api/v1/sessions/{session_id}/safe-calls", {"safe_calls": calls}, format="json")


def test_it_charges_reported_safe_calls_once_per_step(acme, tools, session_id):
    calls = [{"tool": "list_inactive_accounts", "step_index": 3, "args": {"a": 1}},
             {"tool": "list_inactive_accounts", "step_index": 7}]

    first = report(acme, session_id, calls)
    again = report(acme, session_id, calls)  # a retry after a lost answer counts nothing twice

    assert first.status_code == 200 and again.status_code == 200
    assert first.json()["session"]["step_index"] == 7
    assert sorted(SafeCall.objects.filter(session_id=session_id).values_list("step_index", flat=True)) == [3, 7]
    assert Session.objects.get(pk=session_id).tool_calls == 2


def test_bad_reports_are_400_and_write_nothing(acme, tools, session_id):
    answers = [report(acme, session_id, "nope"),
               report(acme, session_id, [{"tool": "list_inactive_accounts", "step_index": -1}]),
               acme.api.post(f"/api/v1/sessions/{session_id}/safe-calls", {}, format="json"),
               acme.api.post(f"/api/v1/sessions/{session_id}/safe-calls",
                             {"safe_calls": [], "extra": 1}, format="json")]

    assert [a.status_code for a in answers] == [400, 400, 400, 400]
    assert all(a.json()["error"] == "invalid" for a in answers)
    assert not SafeCall.objects.filter(session_id=session_id).exists()


def test_another_orgs_agent_and_a_reviewer_cannot_report(acme, outsider, tools, session_id):
    calls = [{"tool": "list_inactive_accounts", "step_index": 1}]

    assert report(outsider, session_id, calls).status_code == 404
    assert acme.reviewer.post(f"/api/v1/sessions/{session_id}/safe-calls", {"safe_calls": calls},
                              format="json").status_code == 403
    assert acme.api.get(f"/api/v1/sessions/{session_id}/safe-calls").status_code == 405
    assert not SafeCall.objects.filter(session_id=session_id).exists()
