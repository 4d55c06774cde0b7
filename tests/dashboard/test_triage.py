"""Triage at volume: the queue filtered by agent, tool, risk tag and age; the Decided tab with
the decision, who and when; keyset pages; counts in the nav; the next pending request after a
decision; time zones on times."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import dashboard
from approvals.models import ApprovalRequest
from effects.models import UndoEntry
from orgs.models import AgentKey
from tests.conftest import agent_client, intercept, open_session
from tests.dashboard.conftest import hold, page_client

OTHER_TOOL = {"name": "wire_money", "tier": "irreversible",
              "approval": {"reason": "Moves money", "risk_tags": ["financial"], "timeout_s": 600}}


@pytest.fixture
def mixed(acme, tools):
    """Two delete_account requests of cleanup (one waiting 2 hours), one wire_money of billing."""
    old = hold(acme, {"account_id": "acct-old"})
    ApprovalRequest.objects.filter(pk=old["approval"]["id"]).update(created=timezone.now() - timedelta(hours=2))
    new = hold(acme, {"account_id": "acct-new"})
    acme.api.post("/api/v1/tools", {"tools": [OTHER_TOOL]}, format="json")
    billing = acme.org.agents.create(name="billing")
    _, key = AgentKey.issue(billing)
    client = agent_client(key)
    session = client.post("/api/v1/sessions", {"agent": "billing"}, format="json").json()["id"]
    wire = client.post(f"/api/v1/sessions/{session}/intercept",
                       {"tool": "wire_money", "args": {"amount": 10}, "step_index": 1}, format="json").json()
    return {"old": old["approval"]["id"], "new": new["approval"]["id"], "wire": wire["approval"]["id"]}


def ids(response, row: str = "queue-row") -> set[str]:
    return set(re.findall(rf'<tr class="{row}" data-id="([0-9a-f-]+)"', response.content.decode()))


@pytest.mark.parametrize("query, expected", [
    ("", {"old", "new", "wire"}),
    ("agent=billing", {"wire"}),
    ("tool=delete_account", {"old", "new"}),
    ("tag=financial", {"wire"}),
    ("tag=data-loss&agent=cleanup", {"old", "new"}),
    ("age=1h", {"old"}),
    ("agent=nobody", set()),
])
def test_it_filters_the_queue_by_agent_tool_risk_tag_and_age(acme, mixed, query, expected):
    response = page_client(acme).get(f"/?{query}")

    assert response.status_code == 200
    assert ids(response) == {mixed[name] for name in expected}


def test_it_offers_the_orgs_agents_tools_and_tags_and_says_when_an_age_is_unknown(acme, mixed, outsider):
    outsider.api.post("/api/v1/tools", {"tools": [{**OTHER_TOOL, "name": "globex_secret",
                                                   "approval": {"reason": "x", "risk_tags": ["globex-only"]}}]},
                      format="json")
    response = page_client(acme).get("/?age=forever")
    html = response.content.decode()

    assert "Unknown age &#x27;forever&#x27;" in html
    assert ids(response) == set(mixed.values())
    assert "<option >financial</option>" in html and "<option >data-loss</option>" in html
    assert "<option >billing</option>" in html and "<option >wire_money</option>" in html
    assert "globex" not in html


def test_the_decided_tab_shows_the_decision_who_and_when_newest_first(acme, mixed):
    acme.reviewer.post(f"/api/v1/approvals/{mixed['old']}/reject", {"reason": "open invoice"}, format="json")
    acme.admin.post(f"/api/v1/approvals/{mixed['wire']}/approve", {}, format="json")

    response = page_client(acme).get("/?tab=decided")
    html = response.content.decode()
    filtered = page_client(acme).get("/?tab=decided&agent=cleanup")

    rows = re.findall(r'<tr class="decided-row" data-id="([0-9a-f-]+)"', html)
    assert rows == [mixed["wire"], mixed["old"]]
    assert "acme-admin" in html and "acme-reviewer" in html and "open invoice" in html
    assert re.search(r"<time datetime=\"[^\"]+\">\w{3} \d\d \d\d:\d\d UTC</time>", html)
    assert ids(filtered, "decided-row") == {mixed["old"]}
    assert ids(page_client(acme).get("/"), "queue-row") == {mixed["new"]}


def test_it_pages_the_queue_and_the_decided_tab_by_keyset(acme, tools, monkeypatch):
    monkeypatch.setattr(dashboard, "QUEUE_LIMIT", 2)
    monkeypatch.setattr(dashboard, "DECIDED_PAGE", 2)
    held = [hold(acme, {"account_id": f"a{n}"})["approval"]["id"] for n in range(5)]
    client = page_client(acme)

    seen, url = [], "/?tag=data-loss"
    while url:
        response = client.get(url)
        seen += re.findall(r'<tr class="queue-row" data-id="([0-9a-f-]+)"', response.content.decode())
        found = re.search(r'id="next-page" href="([^"]+)"', response.content.decode())
        url = "/" + found.group(1).replace("&amp;", "&") if found else None
    for pk in held:
        acme.reviewer.post(f"/api/v1/approvals/{pk}/approve", {}, format="json")
    decided, url = [], "/?tab=decided"
    while url:
        response = client.get(url)
        decided += re.findall(r'<tr class="decided-row" data-id="([0-9a-f-]+)"', response.content.decode())
        found = re.search(r'id="next-page" href="([^"]+)"', response.content.decode())
        url = "/" + found.group(1).replace("&amp;", "&") if found else None

    by_deadline = list(ApprovalRequest.objects.filter(pk__in=held).order_by("timeout_at", "id")
                       .values_list("id", flat=True))
    assert seen == [str(pk) for pk in by_deadline]
    assert sorted(decided) == sorted(held) and len(decided) == 5


def test_the_nav_counts_pending_requests_and_compensation_failures(acme, tools):
    hold(acme)
    session = open_session(acme)
    effect = intercept(acme, session, "send_email", {"to": "a@example.com"}, 1).json()["effect"]["id"]
    UndoEntry.objects.filter(effect_id=effect).update(state=UndoEntry.State.COMPENSATION_FAILED)

    for path in ("/", "/sessions/"):
        html = page_client(acme).get(path).content.decode()
        assert re.search(r'id="nav-pending" >1</span>', html), path
        assert re.search(r'id="nav-failures" >1</span>', html), path


def test_a_decided_request_links_the_next_pending_one_most_urgent_first(acme, mixed):
    ApprovalRequest.objects.filter(pk=mixed["wire"]).update(timeout_at=timezone.now() + timedelta(minutes=2))
    acme.reviewer.post(f"/api/v1/approvals/{mixed['new']}/approve", {}, format="json")

    first = page_client(acme).get(f"/approvals/{mixed['new']}/").content.decode()
    for pk in (mixed["old"], mixed["wire"]):
        acme.reviewer.post(f"/api/v1/approvals/{pk}/approve", {}, format="json")
    last = page_client(acme).get(f"/approvals/{mixed['new']}/").content.decode()
    pending = page_client(acme).get(f"/approvals/{mixed['old']}/?part=live").content.decode()

    assert f'id="next-pending" href="/approvals/{mixed["wire"]}/"' in first
    assert 'id="next-pending"' not in last and "Nothing else is waiting" in last
    assert "approval-history-fresh" in pending  # the live part carries the History card's new rows


def test_times_carry_the_orgs_time_zone_in_pages_and_live_parts(acme, tools):
    acme.org.time_zone = "Asia/Tokyo"
    acme.org.save()
    held = hold(acme)
    client = page_client(acme)

    page = client.get(f"/sessions/{held['session']}/").content.decode()
    live = client.get(f"/sessions/{held['session']}/?part=live").content.decode()
    approval = client.get(f"/approvals/{held['approval']['id']}/?part=live").content.decode()

    assert re.search(r"started \w{3} \d\d \d\d:\d\d:\d\d JST", page)
    assert re.search(r"started \w{3} \d\d \d\d:\d\d:\d\d JST", live)  # the fragment too, not UTC
    assert "times in Asia/Tokyo" in live
    assert re.search(r"\(by \w{3} \d\d:\d\d:\d\d JST;", approval)


def test_it_filters_by_a_risk_tag_with_accents(acme, tools):
    acme.api.post("/api/v1/tools", {"tools": [{**OTHER_TOOL, "approval": {"reason": "x", "risk_tags": ["données"]}}]},
                  format="json")
    session = open_session(acme)
    wire = intercept(acme, session, "wire_money", {"amount": 1}, 1).json()["approval"]["id"]
    hold(acme)

    assert ids(page_client(acme).get("/?tag=données")) == {wire}


def test_compensation_failures_page_by_keyset_each_once_newest_first(acme, tools, monkeypatch):
    monkeypatch.setattr(dashboard, "FAILURES_PAGE", 2)
    session = open_session(acme)
    for step in range(1, 6):
        intercept(acme, session, "send_email", {"to": f"{step}@example.com"}, step)
    UndoEntry.objects.filter(session_id=session).update(state=UndoEntry.State.COMPENSATION_FAILED,
                                                        updated=timezone.now())  # one moment: id breaks ties
    client = page_client(acme)

    seen, url, pages = [], "/compensation-failures/", 0
    while url:
        html = client.get(url).content.decode()
        seen += re.findall(r'<tr class="failure-row" data-entry="([0-9a-f-]+)"', html)
        found = re.search(r'id="next-page" href="([^"]+)"', html)
        url = "/compensation-failures/" + found.group(1).replace("&amp;", "&") if found else None
        pages += 1
    live = client.get("/compensation-failures/?" + re.search(r'id="next-page" href="\?([^"]+)"', client.get(
        "/compensation-failures/").content.decode()).group(1).replace("&amp;", "&") + "&part=live").content.decode()

    newest_first = [str(pk) for pk in UndoEntry.objects.filter(session_id=session)
                    .order_by("-updated", "-id").values_list("id", flat=True)]
    assert seen == newest_first and pages == 3
    # the live refresh of an older page keeps its cursor: rows 3-4, and a link back to the newest
    assert re.findall(r'data-entry="([0-9a-f-]+)"', live) == newest_first[2:4]
    assert "← Newest" in live


def test_a_malformed_failures_cursor_shows_the_first_page(acme, tools):
    session = open_session(acme)
    intercept(acme, session, "send_email", {"to": "a@example.com"}, 1)
    UndoEntry.objects.filter(session_id=session).update(state=UndoEntry.State.COMPENSATION_FAILED)

    response = page_client(acme).get("/compensation-failures/?before=yesterday|nope")

    assert response.status_code == 200
    assert len(re.findall(r'class="failure-row"', response.content.decode())) == 1
