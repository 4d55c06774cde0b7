"""`/metrics`: off without a token, refused without the right one, and exact counts after a
scripted run (intercepts, a refusal, an approval, a walk, a webhook, the incident switch)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from approvals.models import OrgWebhook
from tests.budgets.conftest import set_budget
from tests.conftest import intercept, open_session, register_standard_tools
from tests.effects.conftest import build_stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]
TOKEN = "metrics-token-for-tests"


@pytest.fixture
def token(settings) -> str:
    settings.UNDOLOG_METRICS_TOKEN = TOKEN
    return TOKEN


def scrape(client) -> dict[tuple[str, frozenset], float]:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(response.content.decode())
            for sample in family.samples}


def delta(before: dict, after: dict, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_it_is_off_while_no_token_is_set(client, settings):
    settings.UNDOLOG_METRICS_TOKEN = ""

    assert client.get("/metrics").status_code == 404
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer anything").status_code == 404


def test_it_refuses_a_scrape_without_the_token(client, token):
    missing = client.get("/metrics")
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer not-the-token")
    other_scheme = client.get("/metrics", HTTP_AUTHORIZATION=f"Token {TOKEN}")

    assert missing.status_code == 401
    assert missing["WWW-Authenticate"].startswith("Bearer")
    assert wrong.status_code == 403
    assert other_scheme.status_code == 401
    assert b"undolog_intercepts" not in missing.content + wrong.content


def test_it_counts_a_scripted_run_exactly(client, token, acme, receiver):
    before = scrape(client)
    # Three compensable calls (executed), one of them again (a replay), then a cap that refuses the fourth.
    stack = build_stack(acme, receiver.url, 3)
    assert intercept(acme, stack.session_id, "send_email", {"to": "user1@x.io"}, 1).json()["decision"] == "replay"
    set_budget(acme, max_tool_calls_per_run=3)
    assert intercept(acme, stack.session_id, "send_email", {"to": "user4@x.io"}, 4).status_code == 429
    # The run fails: its walk compensates the three, newest first (eager: in this process).
    assert stack.fail().status_code == 200
    assert len(receiver.log) == 3
    # An irreversible call in another run, held, then approved; its decision goes to a webhook.
    set_budget(acme, max_tool_calls_per_run=100)
    assert acme.reviewer.post(f"/api/v1/agents/{acme.agent.name}/resume").status_code == 200  # the cap paused it
    register_standard_tools(acme, target=receiver.url)
    OrgWebhook.objects.create(org=acme.org, url=receiver.url, event_types=["approval.decided"])
    held = intercept(acme, open_session(acme), "delete_account", {"account_id": "a-1"}, 1).json()
    pending = scrape(client)
    acme.reviewer.post(f"/api/v1/approvals/{held['approval']['id']}/approve", {}, format="json")
    acme.admin.post("/api/v1/org/incident", {"on": True}, format="json")

    after = scrape(client)

    assert delta(before, after, "undolog_intercepts_total", tier="compensable", decision="execute") == 3
    assert delta(before, after, "undolog_intercepts_total", tier="compensable", decision="replay") == 1
    assert delta(before, after, "undolog_intercepts_total", tier="none", decision="refused") == 1
    assert delta(before, after, "undolog_intercepts_total", tier="irreversible", decision="await_approval") == 1
    assert delta(before, after, "undolog_intercept_duration_seconds_count", path="fast") + \
        delta(before, after, "undolog_intercept_duration_seconds_count", path="slow") == 6
    assert delta(before, after, "undolog_budget_refusals_total", limit="max_tool_calls_per_run",
                 observed="false") == 1
    assert delta(before, after, "undolog_compensations_total", outcome="success") == 3
    assert delta(before, after, "undolog_compensations_total", outcome="failed") == 0
    assert delta(before, after, "undolog_approval_decision_seconds_count", outcome="approved") == 1
    assert delta(before, after, "undolog_webhook_deliveries_total", purpose="event", outcome="delivered") == 1
    assert pending[("undolog_approvals_pending", frozenset())] == 1
    assert pending[("undolog_approvals_oldest_pending_seconds", frozenset())] >= 0
    assert after[("undolog_approvals_pending", frozenset())] == 0
    assert after[("undolog_walks_in_progress", frozenset())] == 0
    assert after[("undolog_incident_switch_on", frozenset())] == 1


def test_the_grafana_dashboard_queries_only_metrics_the_server_exposes(client, token):
    import json
    import re
    from pathlib import Path

    from django.conf import settings

    dashboard = json.loads((Path(settings.BASE_DIR) / "docs" / "grafana-undolog.json").read_text())
    queried = {re.sub(r"_(bucket|count|sum|total)$", "", name) for panel in dashboard["panels"]
               for target in panel["targets"] for name in re.findall(r"undolog_\w+", target["expr"])}
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    exposed = {family.name for family in text_string_to_metric_families(response.content.decode())}
    # A counter or histogram appears in a scrape once a process has written it; declared ones are all in core.metrics.
    from core import metrics

    declared = {m._name for m in vars(metrics).values() if hasattr(m, "_name") and hasattr(m, "_type")}
    assert queried, "the dashboard queries nothing"
    assert queried <= exposed | declared
