"""Prometheus metrics: the counters and histograms, written where things happen (any app may
call these; the scrape view and the gauges read from rows live in `ops.metrics`).

Multiprocess: gunicorn workers and Celery's forked children each write their own files under
PROMETHEUS_MULTIPROC_DIR (settings.py sets it before prometheus_client is first imported;
the launcher empties it at start), and a scrape of any web process sums them all. Gauges that
describe rows (pending approvals, walks in progress, the incident switch) are computed from the
database at scrape time (`ops.metrics.RowsCollector`), so they are right whichever process answers.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

INTERCEPTS = Counter("undolog_intercepts", "Intercepted calls, by tool tier and decision (execute, "
                     "await_approval, replay, refused, or the error code).", ["tier", "decision"])
INTERCEPT_SECONDS = Histogram(
    "undolog_intercept_duration_seconds", "Time to answer an intercept, by the path that answered (fast, slow).",
    ["path"], buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
DECIDE_SECONDS = Histogram(
    "undolog_approval_decision_seconds", "From an approval request to its decision, by outcome.", ["outcome"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 14400, 86400))
COMPENSATIONS = Counter("undolog_compensations", "Compensation attempts, by outcome (success, retry, permanent, "
                        "lost, failed: escalated to a person).", ["outcome"])
BUDGET_REFUSALS = Counter("undolog_budget_refusals", "Calls refused by an autonomy budget, by limit "
                          "(observe-mode refusals included, observed=true).", ["limit", "observed"])
WEBHOOK_DELIVERIES = Counter("undolog_webhook_deliveries", "Webhook delivery attempts, by purpose and outcome "
                             "(delivered, retry, failed).", ["purpose", "outcome"])


def intercepted(tier: str, decision: str, path: str, seconds: float) -> None:
    INTERCEPTS.labels(tier or "none", decision).inc()
    INTERCEPT_SECONDS.labels(path).observe(seconds)


def compensation(outcome: str) -> None:
    COMPENSATIONS.labels(outcome).inc()


def webhook_delivery(purpose: str, outcome: str) -> None:
    WEBHOOK_DELIVERIES.labels(purpose, outcome).inc()


def budget_refusal(limit: str, observed: bool) -> None:
    BUDGET_REFUSALS.labels(limit or "unknown", "true" if observed else "false").inc()


def decided(outcome: str, seconds: float) -> None:
    DECIDE_SECONDS.labels(outcome).observe(max(seconds, 0.0))
