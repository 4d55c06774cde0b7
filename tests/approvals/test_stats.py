"""GET /api/v1/approvals/stats: pending, approval rate, median time to decide, expiries (7 days)."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from approvals.models import ApprovalRequest
from tests.approvals.conftest import hold


def decide(approval_id: str, state: str, label: str, waited_s: int, days_ago: int = 0) -> None:
    decided_at = timezone.now() - timedelta(days=days_ago)
    ApprovalRequest.objects.filter(pk=approval_id).update(
        state=state, decided_by_label=label, created=decided_at - timedelta(seconds=waited_s), decided_at=decided_at)


def test_it_counts_the_last_seven_days(acme, outsider):
    ids = [hold(acme, args={"account_id": f"a{n}"})["approval"]["id"] for n in range(7)]
    decide(ids[0], "approved", "alice", 60)
    decide(ids[1], "approved", "bob", 120, days_ago=2)
    decide(ids[2], "rejected", "alice", 300)
    decide(ids[3], "expired", "timeout", 900)
    decide(ids[4], "approved", "timeout", 900)
    decide(ids[5], "approved", "alice", 10, days_ago=9)  # outside the window
    hold(outsider)

    response = acme.viewer.get("/api/v1/approvals/stats")

    assert response.status_code == 200
    stats = response.json()
    assert (stats["pending"], stats["decided"], stats["approved"], stats["auto_approved"], stats["rejected"],
            stats["expired"]) == (1, 5, 3, 1, 1, 1)
    assert stats["approval_rate"] == 0.6
    assert stats["median_time_to_decide_s"] == 120.0  # people only: 60, 120, 300
    assert stats["window_days"] == 7
    today = stats["per_day"][-1]
    assert (today["approved"], today["rejected"], today["expired"], today["median_time_to_decide_s"]) == \
        (2, 1, 1, 180.0)
    assert sum(day["approved"] for day in stats["per_day"]) == 3


def test_an_org_without_decisions_has_no_rate(acme):
    stats = acme.viewer.get("/api/v1/approvals/stats").json()

    assert (stats["pending"], stats["approval_rate"], stats["median_time_to_decide_s"]) == (0, None, None)


def test_stats_are_for_people_of_the_org(acme, client):
    assert acme.api.get("/api/v1/approvals/stats").status_code == 403
    assert client.get("/api/v1/approvals/stats").status_code == 401
