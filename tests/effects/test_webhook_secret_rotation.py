"""The org's webhook secret for org admins (settings page and API) and its rotation with a
two-secret overlap: during it a receiver holding either secret verifies, after it only the new."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from core.errors import Conflict
from core.outbound import verify
from effects.models import CompensationFunction
from orgs.models import Organization
from tests.receiver import Receiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]


def delivered_to(acme, stack_of) -> Receiver:
    """A real compensation webhook of acme's, as a receiver that checks no secret records it."""
    with Receiver(secrets=None) as receiver:
        stack = stack_of(1)
        CompensationFunction.objects.filter(org=acme.org).update(target=receiver.url)
        stack.fail()
    assert len(receiver.log) == 1
    return receiver


def verifies(receiver: Receiver, secret: str) -> bool:
    (delivery,) = receiver.log
    return verify([secret], delivery.headers["Undolog-Signature"], delivery.raw)


def test_org_admins_read_the_secret_and_no_one_else_does(acme, outsider):
    answer = acme.admin.get("/api/v1/org/webhook-secret")

    assert answer.status_code == 200
    assert answer.json() == {"secret": acme.org.webhook_secret, "signing_secrets": 1,
                             "previous_secret_expires_at": None}
    assert outsider.admin.get("/api/v1/org/webhook-secret").json()["secret"] == outsider.org.webhook_secret
    for client in (acme.reviewer, acme.viewer, acme.api):
        assert client.get("/api/v1/org/webhook-secret").status_code == 403
        assert client.post("/api/v1/org/webhook-secret/rotate", {}, format="json").status_code == 403
    assert Organization.objects.get(pk=acme.org.pk).webhook_secret == acme.org.webhook_secret


def test_both_secrets_verify_during_the_overlap_and_only_the_new_one_after(acme, stack_of):
    old = acme.org.webhook_secret
    answer = acme.admin.post("/api/v1/org/webhook-secret/rotate", {"overlap_s": 3600}, format="json")
    assert answer.status_code == 200, answer.content
    new = answer.json()["secret"]
    assert new != old and answer.json()["signing_secrets"] == 2
    assert acme.admin.get("/api/v1/org/webhook-secret").json()["secret"] == new

    during = delivered_to(acme, stack_of)
    assert verifies(during, old) and verifies(during, new)

    Organization.objects.filter(pk=acme.org.pk).update(
        previous_webhook_secret_expires_at=timezone.now() - timedelta(seconds=1))  # the overlap is over
    after = delivered_to(acme, stack_of)
    assert verifies(after, new) and not verifies(after, old)
    assert acme.admin.get("/api/v1/org/webhook-secret").json()["signing_secrets"] == 1


def test_an_overlap_of_zero_cuts_the_old_secret_off_at_once(acme, stack_of):
    old = acme.org.webhook_secret
    new = acme.admin.post("/api/v1/org/webhook-secret/rotate", {"overlap_s": 0}, format="json").json()["secret"]

    receiver = delivered_to(acme, stack_of)

    assert verifies(receiver, new) and not verifies(receiver, old)


def test_the_default_overlap_is_the_key_rotation_grace(acme, settings):
    settings.UNDOLOG_KEY_ROTATION_GRACE_S = 600
    before = timezone.now()

    body = acme.admin.post("/api/v1/org/webhook-secret/rotate", {}, format="json").json()

    org = Organization.objects.get(pk=acme.org.pk)
    assert body["secret"] == org.webhook_secret and org.previous_webhook_secret
    assert timedelta(seconds=599) < org.previous_webhook_secret_expires_at - before < timedelta(seconds=610)


def test_a_second_rotation_keeps_only_two_secrets_signing(acme):
    first = acme.org.webhook_secret
    acme.admin.post("/api/v1/org/webhook-secret/rotate", {}, format="json")
    acme.admin.post("/api/v1/org/webhook-secret/rotate", {}, format="json")

    org = Organization.objects.get(pk=acme.org.pk)
    assert len(org.signing_secrets()) == 2 and first not in org.signing_secrets()


def test_a_rotation_that_lost_the_race_is_a_409_and_changes_nothing(acme):
    stale = Organization.objects.get(pk=acme.org.pk)
    acme.admin.post("/api/v1/org/webhook-secret/rotate", {}, format="json")
    current = Organization.objects.get(pk=acme.org.pk).webhook_secret

    with pytest.raises(Conflict) as raised:
        stale.rotate_webhook_secret()

    assert raised.value.code == "webhook_secret_rotated"
    assert Organization.objects.get(pk=acme.org.pk).webhook_secret == current


@pytest.mark.parametrize("body", [{"overlap_s": -1}, {"overlap_s": "soon"}, {"overlap_s": 31 * 86400},
                                  {"grace": 10}])
def test_bad_rotation_input_is_a_400_that_changes_nothing(acme, body):
    before = acme.org.webhook_secret

    answer = acme.admin.post("/api/v1/org/webhook-secret/rotate", body, format="json")

    assert answer.status_code == 400 and answer.json()["error"] == "invalid"
    assert Organization.objects.get(pk=acme.org.pk).webhook_secret == before


def test_the_settings_page_shows_the_secret_to_admins_only(acme, client):
    from django.contrib.auth.models import User

    admin = User.objects.get(memberships__org=acme.org, memberships__role="admin")
    client.force_login(admin)
    assert acme.org.webhook_secret in client.get("/settings/").content.decode()
    reviewer = User.objects.get(memberships__org=acme.org, memberships__role="reviewer")
    client.force_login(reviewer)
    page = client.get("/settings/").content.decode()
    assert acme.org.webhook_secret not in page and "visible to admins only" in page
