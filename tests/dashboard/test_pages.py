"""The dashboard's pages: who may see them, that they show the org's data and only its data."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from approvals.models import ApprovalRequest
from effects.models import Session
from orgs.models import Membership
from tests.conftest import open_session
from tests.dashboard.conftest import hold, page_client

PAGES = ["/", "/sessions/", "/agents/", "/compensation-failures/", "/settings/"]


@pytest.mark.parametrize("path", PAGES)
def test_it_sends_anonymous_visitors_to_the_login_page(client, path):
    response = client.get(path)

    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_it_logs_in_with_the_username_and_password_form(acme):
    client = Client()

    page = client.get("/accounts/login/")
    response = client.post("/accounts/login/", {"username": "acme-reviewer", "password": "pw-acme-reviewer"})

    assert page.status_code == 200 and b'name="username"' in page.content
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_it_shows_a_wrong_password_as_an_error(acme):
    response = Client().post("/accounts/login/", {"username": "acme-reviewer", "password": "nope"})

    assert response.status_code == 200
    assert b"Please enter a correct username and password" in response.content


@pytest.mark.parametrize("path", PAGES)
@pytest.mark.parametrize("role", ["viewer", "reviewer", "admin"])
def test_it_shows_every_page_to_every_role(acme, tools, path, role):
    response = page_client(acme, role).get(path)

    assert response.status_code == 200
    assert f'<span class="role role-{role}">{role}</span>'.encode() in response.content


def test_it_lists_pending_requests_most_urgent_first(acme, tools):
    later = hold(acme, {"account_id": "acct-later"})
    sooner = hold(acme, {"account_id": "acct-sooner"})
    ApprovalRequest.objects.filter(pk=sooner["approval"]["id"]).update(timeout_at=timezone.now() + timedelta(minutes=1))

    html = page_client(acme).get("/").content.decode()

    assert html.index(sooner["approval"]["id"]) < html.index(later["approval"]["id"])
    assert "account acct-sooner and its data" in html  # the estimated impact
    assert 'class="tag risk-loss">data-loss<' in html  # coloured risk tag
    assert "Inactive for a year." in html and "The owner asked" not in html  # the reasoning's first line
    assert "<title>Approval queue · undolog</title>" in html


def test_it_shows_an_approval_with_its_args_context_and_deadline(acme, tools):
    held = hold(acme)

    html = page_client(acme).get(f"/approvals/{held['approval']['id']}/").content.decode()

    assert "&quot;account_id&quot;: &quot;acct-101&quot;" in html  # readable JSON, escaped
    assert "send_email" in html and "committed" in html  # the agent's context: the earlier call
    assert "Tell the owner first." in html  # its reasoning
    assert 'id="approve-button"' in html and 'id="reject-form"' in html and 'id="extend-form"' in html
    assert 'class="countdown big"' in html


def test_it_hides_the_decision_buttons_from_viewers(acme, tools):
    held = hold(acme)

    html = page_client(acme, "viewer").get(f"/approvals/{held['approval']['id']}/").content.decode()

    assert 'id="approve-button"' not in html
    assert "a reviewer or admin decides" in html


def test_it_shows_who_decided(acme, tools):
    held = hold(acme)
    ApprovalRequest.objects.filter(pk=held["approval"]["id"]).update(
        state="rejected", decided_by_label="acme-reviewer", decision_reason="Not this one")

    html = page_client(acme).get(f"/approvals/{held['approval']['id']}/?part=live").content.decode()

    assert "acme-reviewer" in html and "Not this one" in html
    assert 'id="approve-button"' not in html


def test_it_shows_a_session_timeline_with_transitions_and_undo_stack(acme, tools):
    held = hold(acme)

    html = page_client(acme).get(f"/sessions/{held['session']}/").content.decode()

    assert "awaiting approval" in html.lower()
    assert "executing → committed" in html  # the compensable call's transitions
    assert "undo_send_email" in html  # its undo entry
    assert "delete_account" in html and "approval request" in html
    assert 'id="fail-button"' in html


def test_it_filters_sessions_by_agent_state_and_time(acme, tools):
    running = open_session(acme)
    done = open_session(acme)
    acme.api.post(f"/api/v1/sessions/{done}/complete", {}, format="json")
    client = page_client(acme)

    by_state = client.get("/sessions/?state=completed").content.decode()
    by_agent = client.get("/sessions/?agent=nobody").content.decode()
    recent = client.get("/sessions/?since=1h").content.decode()
    bad = client.get("/sessions/?state=exploded&since=forever")

    assert done in by_state and running not in by_state
    assert "No sessions match." in by_agent
    assert done in recent and running in recent
    assert bad.status_code == 200 and b"Unknown state" in bad.content and b"Unknown time range" in bad.content


def test_it_pages_through_sessions_newest_first(acme, tools):
    agent = acme.agent
    Session.objects.bulk_create(Session(org=acme.org, agent=agent) for _ in range(55))
    client = page_client(acme)

    first = client.get("/sessions/")
    next_link = first.context["listing"].next_query
    second = client.get(f"/sessions/?{next_link}")

    assert len(first.context["listing"].sessions) == 50
    assert len(second.context["listing"].sessions) == 5
    assert not {s.pk for s in first.context["listing"].sessions} & {s.pk for s in second.context["listing"].sessions}


@pytest.mark.parametrize("path", ["/approvals/{approval}/", "/sessions/{session}/",
                                  "/approvals/{approval}/?part=live", "/sessions/{session}/?part=live"])
def test_it_answers_404_for_another_orgs_pages(acme, outsider, tools, path):
    held = hold(acme)
    url = path.format(approval=held["approval"]["id"], session=held["session"])

    assert page_client(outsider).get(url).status_code == 404
    assert page_client(acme).get(url).status_code == 200


def test_it_answers_404_for_unknown_ids(acme):
    client = page_client(acme)

    assert client.get(f"/approvals/{uuid.uuid4()}/").status_code == 404
    assert client.get(f"/sessions/{uuid.uuid4()}/").status_code == 404
    assert client.get("/sessions/not-a-uuid/").status_code == 404


def test_it_shows_another_org_none_of_the_queue(acme, outsider, tools):
    held = hold(acme)

    html = page_client(outsider).get("/").content.decode()
    sessions = page_client(outsider).get("/sessions/").content.decode()

    assert held["approval"]["id"] not in html and "acct-101" not in html
    assert held["session"] not in sessions


@pytest.mark.parametrize("path", PAGES)
def test_it_refuses_other_methods(acme, path):
    assert page_client(acme).post(path).status_code == 405


def test_it_asks_a_member_of_several_orgs_to_pick_one(acme, outsider, tools):
    held = hold(acme)
    user = acme.reviewer.user
    Membership.objects.create(user=user, org=outsider.org, role="viewer")
    client = Client()
    client.force_login(user)

    first = client.get(f"/approvals/{held['approval']['id']}/")
    picker = client.get(first["Location"])
    chosen = client.post("/orgs/", {"org": "acme", "next": f"/approvals/{held['approval']['id']}/"})
    shown = client.get(chosen["Location"])

    assert first.status_code == 302 and first["Location"].startswith("/orgs/?next=")
    assert b"Acme" in picker.content and b"Globex" in picker.content
    assert chosen.status_code == 302 and client.session["org"] == "acme"
    assert shown.status_code == 200


def test_it_switches_org_and_then_hides_the_first_orgs_pages(acme, outsider, tools):
    held = hold(acme)
    user = acme.reviewer.user
    Membership.objects.create(user=user, org=outsider.org, role="viewer")
    client = Client()
    client.force_login(user)
    client.post("/orgs/", {"org": "globex"})

    response = client.get(f"/approvals/{held['approval']['id']}/")

    assert client.session["org"] == "globex"
    assert response.status_code == 404


def test_it_refuses_to_pick_an_org_one_is_not_a_member_of(acme, outsider):
    client = page_client(acme)

    response = client.post("/orgs/", {"org": "globex"})

    assert response.status_code == 400 and b"not a member of that organization" in response.content
    assert client.session.get("org") != "globex"
    assert page_client(acme).get("/").status_code == 200


def test_it_ignores_an_unsafe_next_url(acme):
    response = page_client(acme).post("/orgs/", {"org": "acme", "next": "https://evil.example.com/"})

    assert response["Location"] == "/"


def test_it_tells_a_user_without_an_org_so(db):
    user = get_user_model().objects.create_user("loner", password="pw")
    client = Client()
    client.force_login(user)

    response = client.get("/", follow=True)

    assert response.status_code == 403
    assert b"not a member of any organization" in response.content


def test_it_forgets_a_chosen_org_the_user_was_removed_from(acme, outsider):
    user = acme.reviewer.user
    membership = Membership.objects.create(user=user, org=outsider.org, role="viewer")
    client = Client()
    client.force_login(user)
    client.post("/orgs/", {"org": "globex"})
    membership.delete()

    response = client.get("/")

    assert response.status_code == 200 and client.session["org"] == "acme"


def test_it_serves_the_static_files_it_links(acme):
    from django.contrib.staticfiles import finders

    for name in ["dashboard.css", "live.js", "queue.js", "approval.js", "session.js", "agents.js",
                 "failures.js", "settings.js"]:
        assert finders.find(f"undolog/{name}"), name
    html = page_client(acme).get("/").content.decode()
    assert "http://" not in html.split("<main>")[0] and "https://" not in html.split("<main>")[0]  # no CDN


def test_it_shows_an_agents_limits_counters_and_caps(acme, tools):
    acme.admin.patch("/api/v1/agents/cleanup/budget", {"max_irreversible_per_run": 2, "max_cost_per_day": 50},
                     format="json")
    hold(acme)

    html = page_client(acme, "admin").get("/agents/").content.decode()
    viewer = page_client(acme, "viewer").get("/agents/").content.decode()

    assert 'name="max_irreversible_per_run" value="2"' in html
    assert 'name="max_cost_per_day" value="50.0"' in html
    assert "6 / 50" in html  # today's cost against the daily cap
    assert 'class="cap"' in html and "cap 2" in html  # the chart's cap line
    assert "its own policy" in html
    assert 'id="incident-on"' in html and 'data-action="agent-incident-on"' in html
    assert 'id="incident-on"' not in viewer and "<fieldset disabled>" in viewer


def test_it_shows_refusals_in_place_in_the_sessions_timeline(acme, tools):
    held = hold(acme)
    acme.reviewer.post(f"/api/v1/approvals/{held['approval']['id']}/approve", {}, format="json")
    acme.api.post(f"/api/v1/effects/{held['effect']['id']}/commit", {"result": {"deleted": True}}, format="json")
    acme.admin.post("/api/v1/org/incident", {"on": True}, format="json")
    refused = acme.api.post(f"/api/v1/sessions/{held['session']}/intercept",
                            {"tool": "delete_account", "args": {"account_id": "acct-9"}, "step_index": 3},
                            format="json")
    acme.api.post(f"/api/v1/sessions/{held['session']}/intercept",
                  {"tool": "send_email", "args": {"to": "after@x.io"}, "step_index": 4}, format="json")

    html = page_client(acme).get(f"/sessions/{held['session']}/").content.decode()

    assert refused.status_code == 429
    steps = [html.index(f'<span class="step">#{n}</span>') for n in (1, 2, 3, 4)]
    assert steps == sorted(steps)  # the refusal sits at its step, between the calls around it
    refusal = html[steps[2]:steps[3]]
    assert 'class="tier refused"' in refusal and "delete_account" in refusal
    assert "max_irreversible_per_run" in refusal and "acct-9" in refusal
    assert "incident switch is on" in html.lower()  # the banner, on every page


@pytest.mark.django_db(transaction=True)
def test_it_shows_each_undo_entrys_attempts_and_the_failures_page_lists_it(acme, eager):
    from tests.effects.conftest import build_stack

    stack = build_stack(acme, "tests.effects.undo_handlers.gone_for_good", 2, handler="python")
    stack.fail()  # the walk runs here: the top entry fails for good, the walk stops for a person

    session_html = page_client(acme).get(f"/sessions/{stack.session_id}/").content.decode()
    failures = page_client(acme).get("/compensation-failures/").content.decode()
    viewer = page_client(acme, "viewer").get("/compensation-failures/").content.decode()

    top = stack.entry(1)
    assert top.state == "compensation_failed" and stack.entry(0).state == "pending"
    assert "attempt 1 · permanent" in session_html and "the mailbox no longer exists" in session_html
    assert f'data-entry="{top.pk}"' in failures and f'data-entry="{stack.entries[0]}"' not in failures
    assert 'data-action="retry"' in failures and 'data-action="resolve"' in failures
    assert f'data-entry="{top.pk}"' in viewer and 'data-action="retry"' not in viewer


def test_it_shows_the_same_7_day_numbers_as_the_stats_api(acme, tools):
    for n in range(3):
        held = hold(acme, {"account_id": f"acct-{n}"})
        verb = "approve" if n else "reject"
        acme.reviewer.post(f"/api/v1/approvals/{held['approval']['id']}/{verb}", {"reason": "checked"}, format="json")
    hold(acme, {"account_id": "acct-waiting"})

    stats = acme.viewer.get("/api/v1/approvals/stats").json()
    html = page_client(acme).get("/").content.decode()

    assert stats["decided"] == 3 and stats["pending"] == 1
    assert f"<strong>{stats['decided']}</strong> decided" in html
    assert f"<strong>{round(stats['approval_rate'] * 100)} %</strong> approved" in html
    assert '<span class="badge" id="nav-pending" >1</span>' in html
    assert html.count('class="bar approved"') == 1 and html.count('class="bar rejected"') == 1  # one day


def test_it_shows_webhooks_to_admins_only(acme, tools):
    acme.admin.post("/api/v1/webhooks", {"url": "http://127.0.0.1:9/hook"}, format="json")

    admin = page_client(acme, "admin").get("/settings/").content.decode()
    reviewer = page_client(acme, "reviewer").get("/settings/").content.decode()

    assert "http://127.0.0.1:9/hook" in admin and 'id="webhook-form"' in admin
    assert "http://127.0.0.1:9/hook" not in reviewer and 'id="webhook-form"' not in reviewer
    assert "<fieldset disabled>" in reviewer  # the settings form, read only


def test_it_offers_to_restore_the_cap_an_agent_had_before_its_switch(acme, tools):
    acme.admin.patch("/api/v1/agents/cleanup/budget", {"max_irreversible_per_run": 4}, format="json")
    acme.admin.patch("/api/v1/agents/cleanup/budget", {"max_irreversible_per_run": 0}, format="json")

    html = page_client(acme, "admin").get("/agents/").content.decode()

    assert 'data-action="agent-incident-off" data-restore="4"' in html
    assert "irreversible calls stopped" in html


def test_the_admin_link_is_for_staff_only(acme, tools):
    staff = acme.admin.user
    staff.is_staff = True
    staff.save()

    shown = page_client(acme, "admin").get("/").content.decode()
    hidden = page_client(acme, "reviewer").get("/").content.decode()

    assert 'class="admin-link" href="/admin/"' in shown
    assert "admin-link" not in hidden
