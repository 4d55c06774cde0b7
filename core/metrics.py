"""Prometheus metrics: the counters and histograms, written where things happen (any app may
call these; the scrape view and the gauges read from rows live in `ops.metrics`).

Multiprocess: gunicorn workers and Celery's forked children each write their own files under
PROMETHEUS_MULTIPROC_DIR (settings.py sets it before prometheus_client is first imported;
the launcher empties it at start), and a scrape of any web process sums them all. Gauges that
describe rows (pending approvals, walks in progress, the incident switch) are computed from the
database at scrape time (`ops.metrics.RowsCollector`), so they are right whichever process answers.
"""

from __future__ import annotations

import atexit
import bisect
import os
import threading
import time
from collections import Counter

import prometheus_client

INTERCEPTS = prometheus_client.Counter(
    "undolog_intercepts", "Intercepted calls, by tool tier and decision (execute, await_approval, replay, refused, "
    "or the error code).", ["tier", "decision"])
INTERCEPT_SECONDS = prometheus_client.Histogram(
    "undolog_intercept_duration_seconds", "Time to answer an intercept, by the path that answered (fast, slow).",
    ["path"], buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
DECIDE_SECONDS = prometheus_client.Histogram(
    "undolog_approval_decision_seconds", "From an approval request to its decision, by outcome.", ["outcome"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 14400, 86400))
COMPENSATIONS = prometheus_client.Counter(
    "undolog_compensations", "Compensation attempts, by outcome (success, retry, permanent, lost, failed: "
    "escalated to a person).", ["outcome"])
BUDGET_REFUSALS = prometheus_client.Counter(
    "undolog_budget_refusals", "Calls refused by an autonomy budget, by limit (observe-mode refusals included, "
    "observed=true).", ["limit", "observed"])
WEBHOOK_DELIVERIES = prometheus_client.Counter(
    "undolog_webhook_deliveries", "Webhook delivery attempts, by purpose and outcome (delivered, retry, failed).",
    ["purpose", "outcome"])


# The intercept's two metrics are tallied in this process's memory and written to the shared files
# at most once a second (and before this process answers a scrape, and at exit): a multiprocess
# write takes a lock and mmap writes, measured here at ~5 µs for a counter and ~25 µs for a
# histogram observation, against well under 1 µs for the tally. A scrape may so miss up to the
# last second of another process's intercepts; a Prometheus scrape interval is 15 s or more.
FLUSH_S = 1.0
_BOUNDS = list(INTERCEPT_SECONDS._upper_bounds)  # ends with +Inf: every observation has a bucket
_lock = threading.Lock()
_counts: Counter[tuple[str, str]] = Counter()
_latency: dict[str, list] = {}  # path -> [sum of seconds, [observations per bucket]]
_flushed = [time.monotonic()]


def intercepted(tier: str, decision: str, path: str, seconds: float) -> None:
    with _lock:
        _counts[(tier or "none", decision)] += 1
        tally = _latency.get(path) or _latency.setdefault(path, [0.0, [0] * len(_BOUNDS)])
        tally[0] += seconds
        tally[1][bisect.bisect_left(_BOUNDS, seconds)] += 1  # the first bound >= seconds, as observe() picks
        due = time.monotonic() - _flushed[0] >= FLUSH_S
    if due:
        flush()


def flush() -> None:
    """Write the tallied intercept metrics to the shared files."""
    with _lock:
        counts, latency = dict(_counts), {path: (tally[0], list(tally[1])) for path, tally in _latency.items()}
        _counts.clear()
        _latency.clear()
        _flushed[0] = time.monotonic()
    for (tier, decision), n in counts.items():
        INTERCEPTS.labels(tier, decision).inc(n)
    for path, (total, buckets) in latency.items():
        child = INTERCEPT_SECONDS.labels(path)
        # What Histogram.observe() does per observation, once per bucket (prometheus_client is pinned).
        child._sum.inc(total)
        for index, n in enumerate(buckets):
            if n:
                child._buckets[index].inc(n)


def _forget_parents_tally() -> None:
    # A forked child starts with its parent's unflushed tally: the parent writes it, not the child.
    global _lock
    _lock = threading.Lock()
    _counts.clear()
    _latency.clear()


atexit.register(flush)
os.register_at_fork(after_in_child=_forget_parents_tally)


def compensation(outcome: str) -> None:
    COMPENSATIONS.labels(outcome).inc()


def webhook_delivery(purpose: str, outcome: str) -> None:
    WEBHOOK_DELIVERIES.labels(purpose, outcome).inc()


def budget_refusal(limit: str, observed: bool) -> None:
    BUDGET_REFUSALS.labels(limit or "unknown", "true" if observed else "false").inc()


def decided(outcome: str, seconds: float) -> None:
    DECIDE_SECONDS.labels(outcome).observe(max(seconds, 0.0))
