"""One agent's page, `/agents/<name>/`: members see it, admins get the fleet rollback control
(a date and time in the org's zone), its last rollbacks with what each has left; another org's
agent or a missing one is a 404, and the agents page links to it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from approvals import dashboard
from tests.dashboard.conftest import page_client

pytestmark = pytest.mark.django_db


def test_a_member_sees_the_agent_and_only_an_admin_the_rollback_control(acme):
    viewer = page_client(acme, "viewer").get("/agents/cleanup/")
    admin = page_client(acme, "admin").get("/agents/cleanup/")

    assert viewer.status_code == admin.status_code == 200
    assert b'id="rollback-form"' not in viewer.content and b'id="rollback-form"' in admin.content
    assert b"No rollback of this agent yet." in viewer.content
    assert b'href="/agents/cleanup/"' in page_client(acme, "viewer").get("/agents/").content


def test_the_agents_list_rolls_back_only_through_a_link_to_the_agents_page(acme):
    """One place to roll an agent back: the list's card links an admin to the page's control and
    offers no preset of its own ("1 hour ago" counted from the click, in no stated zone)."""
    admin = page_client(acme, "admin").get("/agents/").content.decode()
    viewer = page_client(acme, "viewer").get("/agents/").content.decode()

    assert 'data-action="rollback" href="/agents/cleanup/#rollback-form"' in admin
    assert "rollback-since" not in admin and "hour ago" not in admin
    assert 'data-action="rollback"' not in viewer  # the control there is an admin's, as is this link


def test_the_control_defaults_to_an_hour_ago_on_the_orgs_clocks_and_names_the_zone(acme):
    acme.org.time_zone = "Asia/Kolkata"  # UTC+05:30 all year
    acme.org.save()
    now = datetime(2026, 12, 4, 22, 0, tzinfo=UTC)

    context = dashboard.agent_page(acme.org, "cleanup", now)

    assert (context["since_default"], context["since_max"]) == ("2026-12-05T02:30", "2026-12-05T03:30")
    assert (context["zone"], context["zone_offset"]) == ("Asia/Kolkata", "+05:30")
    page = page_client(acme, "admin").get("/agents/cleanup/").content.decode()
    assert 'data-zone="Asia/Kolkata"' in page and "Asia/Kolkata (now UTC+05:30)" in page


def test_its_rollbacks_show_when_in_the_orgs_zone_and_what_is_left(acme, monkeypatch):
    from lifecycle import rollback
    from tests.conftest import intercept, open_session, register_standard_tools

    monkeypatch.setattr(rollback, "enqueue_walks", lambda ids: None)  # no walk: the entry stays open
    acme.org.time_zone = "Europe/Berlin"
    acme.org.save()
    register_standard_tools(acme)
    run = open_session(acme)
    intercept(acme, run, "send_email", {"to": "a@example.com", "subject": "hi"}, 1)
    since = datetime(2026, 1, 15, 8, 30, tzinfo=UTC)
    rollback.rollback(acme.agent, since, "prompt injection", "alice")

    page = page_client(acme, "viewer").get("/agents/cleanup/").content.decode()

    assert "Jan 15 09:30 CET" in page  # 08:30 UTC on the org's clocks
    assert "prompt injection" in page and "1 entry left in 1 run" in page
    assert page_client(acme, "viewer").get("/agents/cleanup/?part=live").status_code == 200


def test_a_missing_agent_or_another_orgs_is_a_404(acme, outsider):
    from orgs.models import Agent

    Agent.objects.create(org=acme.org, name="billing")
    assert page_client(acme, "viewer").get("/agents/nobody/").status_code == 404
    assert page_client(outsider, "admin").get("/agents/billing/").status_code == 404


def test_it_needs_a_login(client):
    response = client.get("/agents/cleanup/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_it_reads_a_fixed_number_of_queries_however_many_rollbacks(acme):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from lifecycle import rollback

    def queries(rollbacks: int) -> int:
        for _ in range(rollbacks):
            rollback.rollback(acme.agent, timezone.now() - timedelta(minutes=5), "x", "alice")
        with CaptureQueriesContext(connection) as captured:
            dashboard.agent_page(acme.org, "cleanup")
        return len(captured)

    # The agents page's for one agent (9), its rollbacks, and what they have left.
    assert queries(1) == queries(3) == 11
