"""A person in two orgs chooses once: the choice outlives logout in this browser, so a later
visit goes straight to that org's queue instead of stopping at "Choose an organization"."""

from __future__ import annotations

import pytest
from django.test import Client

from orgs.models import Membership

pytestmark = pytest.mark.django_db


@pytest.fixture
def both(acme, outsider):
    """acme's reviewer, also a reviewer of globex."""
    user = acme.reviewer.user
    Membership.objects.create(user=user, org=outsider.org, role="reviewer")
    return user


def test_it_asks_once_then_remembers_the_org_chosen_after_logging_out(both, outsider):
    client = Client()
    client.force_login(both)
    assert client.get("/").status_code == 302  # two orgs: choose

    chosen = client.post("/orgs/", {"org": outsider.org.slug, "next": "/"})
    assert chosen.status_code == 302 and chosen.cookies["undolog_org"].value == outsider.org.slug
    client.post("/accounts/logout/")
    client.force_login(both)  # a new session, the same browser

    page = client.get("/")
    assert page.status_code == 200
    assert page.context["org"] == outsider.org


def test_a_remembered_org_the_person_has_left_asks_again(both, outsider):
    client = Client()
    client.force_login(both)
    client.post("/orgs/", {"org": outsider.org.slug, "next": "/"})
    client.post("/accounts/logout/")
    Membership.objects.filter(user=both, org=outsider.org).delete()
    client.force_login(both)

    page = client.get("/")

    assert page.status_code == 200 and page.context["org"].slug == "acme"  # now their only org


def test_a_cookie_naming_someone_elses_org_grants_nothing(both, outsider):
    Membership.objects.filter(user=both, org=outsider.org).delete()
    client = Client()
    client.force_login(both)
    client.cookies["undolog_org"] = outsider.org.slug

    page = client.get("/")

    assert page.context["org"].slug == "acme"
