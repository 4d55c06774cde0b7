"""GET /api/v1/refusals and GET /api/v1/events: org-scoped, filtered, newest first, paginated."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from budgets.models import Refusal
from orgs.models import Event
from tests.budgets.conftest import Run, set_budget


@pytest.fixture
def refused(acme, outsider, budget_tools) -> Run:
    """Three refusals in one acme run; one in the outsider's org."""
    set_budget(acme, max_irreversible_per_run=0)
    run = Run(acme)
    for _ in range(3):
        assert run.drop().status_code == 429
    Refusal.record(agent=outsider.agent, kind="approval", tool_name="delete_account", decided_by="bob",
                   reason="no")
    return run


def test_refusals_are_the_orgs_newest_first(acme, refused):
    body = acme.viewer.get("/api/v1/refusals").json()

    assert [r["step_index"] for r in body["refusals"]] == [3, 2, 1]
    first = body["refusals"][0]
    assert (first["kind"], first["agent"], first["session"], first["tool_name"], first["decided_by"],
            first["limit"]) == ("budget", "cleanup", refused.id, "drop_table", "budget", "max_irreversible_per_run")
    assert first["message"].endswith("Stop calling tools and give your final answer.")
    assert body["next"] is None


def test_refusals_page_by_cursor(acme, refused):
    page = acme.viewer.get("/api/v1/refusals?page_size=2").json()
    assert len(page["refusals"]) == 2 and page["next_cursor"]

    rest = acme.viewer.get(f"/api/v1/refusals?page_size=2&cursor={page['next_cursor']}").json()

    assert [r["step_index"] for r in page["refusals"] + rest["refusals"]] == [3, 2, 1]
    assert rest["next_cursor"] is None
    assert page["next"].startswith("http://testserver/api/v1/refusals?")


@pytest.mark.parametrize("query, count", [
    ("kind=budget", 3), ("kind=approval", 0), ("agent=cleanup", 3), ("agent=nobody", 0), ("tool=drop_table", 3),
    ("limit=max_irreversible_per_run", 3), ("limit=max_cost_per_day", 0), ("observed=false", 3),
])
def test_refusals_filter(acme, refused, query, count):
    assert len(acme.viewer.get(f"/api/v1/refusals?{query}").json()["refusals"]) == count


def test_refusals_filter_by_session_and_time(acme, refused):
    assert len(acme.viewer.get(f"/api/v1/refusals?session={refused.id}").json()["refusals"]) == 3
    assert acme.viewer.get(f"/api/v1/refusals?session={Run(acme).id}").json()["refusals"] == []
    later = (timezone.now() + timedelta(minutes=1)).isoformat().replace("+00:00", "Z")
    assert acme.viewer.get(f"/api/v1/refusals?since={later}").json()["refusals"] == []
    assert len(acme.viewer.get(f"/api/v1/refusals?until={later}").json()["refusals"]) == 3
    naive = (timezone.now() - timedelta(minutes=1)).replace(tzinfo=None).isoformat()
    assert len(acme.viewer.get(f"/api/v1/refusals?since={naive}").json()["refusals"]) == 3


@pytest.mark.parametrize("query, field", [
    ("kind=nope", "kind"), ("session=42", "session"), ("since=yesterday", "since"), ("until=2026-13-01T00:00", "until"),
    ("page_size=0", "page_size"), ("page_size=201", "page_size"), ("page_size=x", "page_size"),
    ("cursor=bm9wZQ", "cursor"), ("cursor=%%%", "cursor"), ("observed=maybe", "observed"), ("agnet=cleanup", "agnet"),
])
def test_refusals_reject_bad_filters(acme, refused, query, field):
    response = acme.viewer.get(f"/api/v1/refusals?{query}")

    assert response.status_code == 400
    assert response.json()["error"] == "invalid"
    assert field in response.json()["fields"]


def test_events_are_the_orgs_with_filters(acme, outsider, refused):
    body = acme.viewer.get("/api/v1/events?kind=permission_denied").json()

    assert len(body["events"]) == 3
    assert {e["data"]["kind"] for e in body["events"]} == {"budget"}
    assert all(e["agent"] == "cleanup" and e["session"] == refused.id for e in body["events"])
    assert len(acme.viewer.get(f"/api/v1/events?session={refused.id}").json()["events"]) == 3
    assert acme.viewer.get("/api/v1/events?agent=nobody").json()["events"] == []
    assert len(outsider.viewer.get("/api/v1/events").json()["events"]) == 1


def test_events_page_by_cursor(acme, refused):
    first = acme.viewer.get("/api/v1/events?page_size=1").json()
    second = acme.viewer.get(first["next"]).json()

    assert first["events"][0]["id"] != second["events"][0]["id"]
    assert Event.objects.filter(org=acme.org, kind="permission_denied").count() == 3  # plus the cap's policy.changed


def test_events_reject_bad_filters(acme, refused):
    for query in ("since=nope", "session=nope", "tool=drop_table", "page_size=-1"):
        assert acme.viewer.get(f"/api/v1/events?{query}").status_code == 400, query


@pytest.mark.parametrize("url", ["/api/v1/refusals", "/api/v1/events"])
def test_streams_are_for_people(client, acme, url):
    assert client.get(url).status_code == 401
    assert acme.api.get(url).status_code == 403
    assert acme.viewer.get(url).status_code == 200
    assert acme.admin.post(url, {}, format="json").status_code == 405
    assert acme.admin.delete(url).status_code == 405
