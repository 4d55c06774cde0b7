"""Words and times a reviewer read (issue 39): the run-wide approval has its verb, a decided
request no longer says what approving would do, the last failed undo attempt is not a "retry",
the audit page's times carry the org's zone, count axes show whole numbers, and the page's
scripts get the org's zone to write times the way the server does."""

from __future__ import annotations

import json
import re

import pytest
from django.utils import timezone

from approvals import charts
from effects.models import UndoAttempt, UndoEntry
from ops import audit
from tests.dashboard.conftest import hold, page_client
from tests.effects.conftest import build_stack

pytestmark = pytest.mark.django_db


def test_the_run_wide_approval_has_a_verb_and_only_a_pending_request_says_what_approving_does(acme):
    held = hold(acme)
    url = f"/approvals/{held['approval']['id']}/"
    pending = page_client(acme).get(url).content.decode()

    acme.reviewer.post(f"/api/v1/approvals/{held['approval']['id']}/approve", {}, format="json")
    decided = page_client(acme).get(url).content.decode()

    assert "Approve, and allow delete_account for the rest of this run" in pending
    assert "Approving approves exactly these arguments" in pending
    assert "Approving approves" not in decided and "Digest of these arguments" in decided


def test_the_last_attempt_of_an_entry_out_of_retries_reads_failed(acme):
    stack = build_stack(acme, "https://hooks.example.com/undo", 2)
    spent, waiting = (UndoEntry.objects.get(pk=pk) for pk in stack.entries)
    for entry, state in ((spent, "compensation_failed"), (waiting, "pending")):
        UndoEntry.objects.filter(pk=entry.pk).update(state=state, attempts=2)
        for number in (1, 2):
            UndoAttempt.objects.create(entry=entry, number=number, started_at=timezone.now(), duration_ms=5,
                                       outcome="retry", status_code=503)

    html = page_client(acme).get(f"/sessions/{stack.session_id}/").content.decode()
    attempts = re.findall(r"<li>attempt (\d) · ([^·<]+?) ·", html)

    # Newest entry first: the waiting one's second attempt is a retry (another follows); the spent one's is not.
    assert attempts == [("1", "retry"), ("2", "retry"), ("1", "retry"), ("2", "failed, no retries left")]


def test_the_audit_page_writes_times_in_the_orgs_zone_with_the_zone(acme):
    acme.org.time_zone = "Asia/Tokyo"
    acme.org.save(update_fields=["time_zone"])
    held = hold(acme)
    acme.reviewer.post(f"/api/v1/approvals/{held['approval']['id']}/approve", {}, format="json")
    audit.seal(acme.org.pk)

    html = page_client(acme, "admin").get("/audit/").content.decode()
    whens = re.findall(r'data-label="when">([^<]+)<', html)

    assert whens and all(when.endswith(" JST") for when in whens), whens
    config = json.loads(re.search(r'id="dashboard-config" type="application/json">(.*?)</script>', html).group(1))
    assert config["time_zone"] == "Asia/Tokyo"  # for the scripts' times (UL.formatTime)


@pytest.mark.parametrize("most", [1, 3, 5])
def test_a_count_axis_shows_whole_numbers_only(most):
    day = {"date": timezone.now().date(), "approved": most, "rejected": 0, "expired": 0,
           "median_time_to_decide_s": 10}
    decided = str(charts.decisions_per_day([day]))
    irreversible = str(charts.runs_against_cap([{"date": day["date"], "runs": 1, "max_irreversible": most,
                                                 "max_cost": 0.5}], {})["irreversible"])

    for svg in (decided, irreversible):
        ticks = re.findall(r'<text class="axis"[^>]*text-anchor="end">([^<]+)</text>', svg)
        assert ticks and all(float(tick) == int(float(tick)) for tick in ticks), ticks
