"""GET/PATCH /api/v1/org/settings: the approval defaults and notification switches."""

from __future__ import annotations

from datetime import timedelta

from approvals.models import ApprovalRequest
from tests.approvals.conftest import hold
from tests.conftest import open_session


def test_members_read_the_settings(acme):
    response = acme.viewer.get("/api/v1/org/settings")

    assert response.status_code == 200
    assert response.json() == {"org": "acme", "name": "Acme", "approval_timeout_s": 900,
                               "auto_approve_on_timeout": False, "context_window": 10,
                               "email_notifications": False, "time_zone": "UTC", "approvals_by_risk_tag": {},
                               "run_idle_timeout_s": 3600,
                               "rate_limit_per_key": None, "rate_limit_per_org": None}


def test_an_admin_changes_them_and_new_requests_follow(acme, tools):
    tools["delete_account"].approval_timeout_s = None
    tools["delete_account"].auto_approve_on_timeout = None
    tools["delete_account"].save()

    response = acme.admin.patch("/api/v1/org/settings", {"approval_timeout_s": 60, "auto_approve_on_timeout": True,
                                                         "context_window": 3, "time_zone": "Europe/Berlin",
                                                         "email_notifications": True}, format="json")

    assert response.status_code == 200, response.content
    acme.org.refresh_from_db()
    assert (acme.org.approval_timeout_s, acme.org.auto_approve_on_timeout, acme.org.context_window,
            acme.org.time_zone, acme.org.email_notifications) == (60, True, 3, "Europe/Berlin", True)
    approval = ApprovalRequest.objects.get(pk=hold(acme, session=open_session(acme))["approval"]["id"])
    assert approval.auto_approve_on_timeout is True
    assert timedelta(seconds=55) < approval.timeout_at - approval.created <= timedelta(seconds=60)


def test_bad_settings_are_400_and_nothing_changes(acme):
    for bad in [{"approval_timeout_s": 0}, {"context_window": -1}, {"context_window": 101},
                {"time_zone": "Mars/Olympus"}, {"auto_approve_on_timeout": "perhaps"}, {"slug": "x"}, [1]]:
        response = acme.admin.patch("/api/v1/org/settings", bad, format="json")
        assert response.status_code == 400, bad
        assert response.json()["error"] == "invalid"
    acme.org.refresh_from_db()
    assert (acme.org.approval_timeout_s, acme.org.time_zone, acme.org.context_window) == (900, "UTC", 10)


def test_only_admins_change_settings(acme, client):
    for member in [acme.reviewer, acme.viewer, acme.api]:
        assert member.patch("/api/v1/org/settings", {"context_window": 1}, format="json").status_code == 403
    assert acme.api.get("/api/v1/org/settings").status_code == 403
    assert client.get("/api/v1/org/settings").status_code == 401
    acme.org.refresh_from_db()
    assert acme.org.context_window == 10


def test_each_org_sees_its_own_settings(acme, outsider):
    outsider.admin.patch("/api/v1/org/settings", {"context_window": 2}, format="json")

    assert acme.viewer.get("/api/v1/org/settings").json()["context_window"] == 10
    assert outsider.viewer.get("/api/v1/org/settings").json()["org"] == "globex"


def test_wrong_methods_are_405(acme):
    assert acme.admin.post("/api/v1/org/settings", {}, format="json").status_code == 405
    assert acme.admin.put("/api/v1/org/settings", {}, format="json").status_code == 405
