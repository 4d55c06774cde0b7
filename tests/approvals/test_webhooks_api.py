"""Org webhooks: admins register, list, read (with delivery attempts) and delete them."""

from __future__ import annotations

from approvals.models import OrgWebhook

HOOK = {"url": "http://127.0.0.1:9/hook", "event_types": ["approval.requested", "approval.decided"]}


def test_an_admin_registers_a_webhook_and_sees_its_secret_once(acme):
    response = acme.admin.post("/api/v1/webhooks", {**HOOK, "slack": True, "description": "ops"}, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["secret"].startswith("whsec_")
    assert (body["event_types"], body["slack"], body["active"]) == (HOOK["event_types"], True, True)
    listed = acme.admin.get("/api/v1/webhooks").json()["webhooks"]
    assert [hook["id"] for hook in listed] == [body["id"]]
    assert "secret" not in listed[0] and listed[0]["secret_hint"] == "…" + body["secret"][-4:]
    detail = acme.admin.get(f"/api/v1/webhooks/{body['id']}").json()
    assert detail["deliveries"] == []


def test_a_webhook_may_bring_its_own_secret(acme):
    body = acme.admin.post("/api/v1/webhooks", {**HOOK, "secret": "s" * 32}, format="json").json()

    assert OrgWebhook.objects.get(pk=body["id"]).secret == "s" * 32


def test_bad_webhooks_are_400_and_nothing_is_saved(acme, settings):
    for bad in [{"url": "ftp://example.com/x"}, {"url": "not a url"}, {**HOOK, "event_types": ["approval.maybe"]},
                {**HOOK, "secret": "short"}, {**HOOK, "extra": 1}, {}, {**HOOK, "event_types": "approval.decided"}]:
        response = acme.admin.post("/api/v1/webhooks", bad, format="json")
        assert response.status_code == 400, bad
        assert response.json()["error"] == "invalid"
    settings.UNDOLOG_ALLOW_PRIVATE_WEBHOOKS = False
    private = acme.admin.post("/api/v1/webhooks", HOOK, format="json")
    assert private.status_code == 400 and "private" in private.json()["fields"]["url"][0]
    assert not OrgWebhook.objects.exists()


def test_only_admins_manage_webhooks(acme):
    hook = acme.admin.post("/api/v1/webhooks", HOOK, format="json").json()

    for client in [acme.reviewer, acme.viewer, acme.api]:
        assert client.get("/api/v1/webhooks").status_code == 403
        assert client.post("/api/v1/webhooks", HOOK, format="json").status_code == 403
        assert client.delete(f"/api/v1/webhooks/{hook['id']}").status_code == 403
    assert OrgWebhook.objects.count() == 1


def test_anonymous_callers_get_401(client):
    assert client.get("/api/v1/webhooks").status_code == 401


def test_an_admin_deletes_a_webhook_but_not_another_orgs(acme, outsider):
    hook = acme.admin.post("/api/v1/webhooks", HOOK, format="json").json()

    assert outsider.admin.delete(f"/api/v1/webhooks/{hook['id']}").status_code == 404
    assert outsider.admin.get(f"/api/v1/webhooks/{hook['id']}").status_code == 404
    assert outsider.admin.get("/api/v1/webhooks").json()["webhooks"] == []
    assert acme.admin.delete(f"/api/v1/webhooks/{hook['id']}").status_code == 204
    assert acme.admin.delete(f"/api/v1/webhooks/{hook['id']}").json()["error"] == "webhook_not_found"


def test_wrong_methods_are_405(acme):
    hook = acme.admin.post("/api/v1/webhooks", HOOK, format="json").json()

    assert acme.admin.put(f"/api/v1/webhooks/{hook['id']}", HOOK, format="json").status_code == 405
    assert acme.admin.delete("/api/v1/webhooks").status_code == 405
