"""Bad input: a clear 4xx with an error code and a message, nothing written, never a 500."""

from __future__ import annotations

import pytest

from effects.models import Effect, SafeCall, Session, UndoEntry
from tests.conftest import intercept


def nothing_written(session_id: str) -> bool:
    session = Session.objects.get(pk=session_id)
    return (not Effect.objects.exists() and not UndoEntry.objects.exists() and not SafeCall.objects.exists()
            and session.step_index == 0 and session.tool_calls == 0)


def test_malformed_json_is_a_400(acme, session_id):
    response = acme.api.post(f"/api/v1/sessions/{session_id}/intercept", '{"tool": "send_email",',
                             content_type="application/json")

    assert response.status_code == 400
    assert response.json()["error"] == "malformed_json"
    assert nothing_written(session_id)


@pytest.mark.parametrize(("body", "field"), [
    ({"tool": "send_email", "args": [], "step_index": 1}, "args"),
    ({"tool": "send_email", "args": {}, "step_index": -1}, "step_index"),
    ({"tool": "send_email", "args": {}, "step_index": "3"}, "step_index"),
    ({"tool": "send_email", "args": {}, "step_index": True}, "step_index"),
    ({"tool": "", "args": {}, "step_index": 1}, "tool"),
    ({"tool": 7, "args": {}, "step_index": 1}, "tool"),
    ({"args": {}, "step_index": 1}, "tool"),
    ({"tool": "send_email", "args": {}, "step_index": 1, "dry_run": True}, "dry_run"),
    ({"tool": "send_email", "args": {}, "step_index": 1, "reasoning": 5}, "reasoning"),
    ({"tool": "send_email", "args": {}, "step_index": 1, "idempotency_key": ["k"]}, "idempotency_key"),
    ({"tool": "send_email", "args": {}, "step_index": 1, "safe_calls": {"tool": "x"}}, "safe_calls"),
    ({"tool": "send_email", "args": {}, "step_index": 1, "safe_calls": [{"tool": "x"}]}, "safe_calls[0]"),
    ({"tool": "send_email", "args": {}, "step_index": 1,
      "safe_calls": [{"tool": "x", "step_index": 0, "extra": 1}]}, "safe_calls[0]"),
])
def test_a_bad_intercept_body_is_a_400_naming_the_field(acme, session_id, body, field):
    response = acme.api.post(f"/api/v1/sessions/{session_id}/intercept", body, format="json")

    assert response.status_code == 400
    assert response.json()["error"] == "invalid"
    assert field in response.json()["fields"]
    assert response.json()["message"]
    assert nothing_written(session_id)


def test_a_body_that_is_not_an_object_is_a_400(acme, session_id):
    response = acme.api.post(f"/api/v1/sessions/{session_id}/intercept", [1, 2], format="json")

    assert response.status_code == 400
    assert response.json()["error"] == "invalid"


def test_args_over_256_kib_are_refused(acme, session_id):
    response = intercept(acme, session_id, "send_email", {"to": "a@x.io", "body": "x" * (256 * 1024)}, 1)

    assert response.status_code == 400
    assert "256 KiB" in response.json()["fields"]["args"]
    assert nothing_written(session_id)


def test_a_body_over_the_upload_limit_is_a_413(acme, session_id):
    response = intercept(acme, session_id, "send_email", {"body": "x" * (2 * 1024 * 1024)}, 1)

    assert response.status_code == 413
    assert response.json()["error"] == "too_large"


def test_a_non_json_content_type_is_a_415(acme, session_id):
    response = acme.api.post(f"/api/v1/sessions/{session_id}/intercept", "tool=send_email",
                             content_type="application/x-www-form-urlencoded")

    assert response.status_code == 415
    assert response.json()["error"] == "unsupported_media_type"


def test_a_malformed_session_id_is_a_404(acme, tools):
    response = acme.api.post("/api/v1/sessions/not-a-uuid/intercept", {}, format="json")

    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


def test_a_wrong_method_is_a_405(acme, session_id):
    response = acme.api.get(f"/api/v1/sessions/{session_id}/intercept")

    assert response.status_code == 405
    assert response.json()["error"] == "method_not_allowed"


def test_a_bad_wait_is_a_400(acme, session_id):
    effect = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1).json()["effect"]

    for wait in ("soon", "61", "-1"):
        response = acme.api.get(f"/api/v1/effects/{effect['id']}?wait={wait}")
        assert response.status_code == 400, wait
        assert response.json()["error"] == "invalid"


def test_a_session_for_another_agent_name_is_a_404(acme, tools):
    response = acme.api.post("/api/v1/sessions", {"agent": "someone-else"}, format="json")

    assert response.status_code == 404
    assert response.json()["error"] == "agent_not_found"
    assert not Session.objects.exists()


# ({} is a valid body since the key's agent is implied: tests/orgs/test_keys_api.py.)
@pytest.mark.parametrize("body", [{"agent": 5}, {"agent": "cleanup", "metadata": []},
                                  {"agent": "cleanup", "owner": "x"}, {"metadata": "x"}])
def test_a_bad_session_body_is_a_400(acme, tools, body):
    response = acme.api.post("/api/v1/sessions", body, format="json")

    assert response.status_code == 400
    assert response.json()["error"] == "invalid"
    assert not Session.objects.exists()


def test_committing_a_rejected_or_pending_effect_is_a_409(acme, session_id):
    effect = intercept(acme, session_id, "delete_account", {"account_id": "a1"}, 1).json()["effect"]

    response = acme.api.post(f"/api/v1/effects/{effect['id']}/commit", {"result": {}}, format="json")

    assert response.status_code == 409
    assert response.json()["state"] == "pending"
    Effect.objects.get(pk=effect["id"]).reject("reviewer", "no")
    assert acme.api.post(f"/api/v1/effects/{effect['id']}/commit", {"result": {}},
                         format="json").status_code == 409


def test_failing_an_effect_needs_an_error(acme, session_id):
    effect = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1).json()["effect"]

    assert acme.api.post(f"/api/v1/effects/{effect['id']}/fail", {}, format="json").status_code == 400
    response = acme.api.post(f"/api/v1/effects/{effect['id']}/fail", {"error": "SMTP 554"}, format="json")
    assert response.status_code == 200
    assert response.json()["effect"]["state"] == "failed"
    assert response.json()["effect"]["error"] == "SMTP 554"
