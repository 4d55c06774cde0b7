"""`GET /metrics`: the counters of every process (core.metrics) and gauges read from the rows."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from approvals.models import ApprovalRequest
from budgets.models import BudgetPolicy
from core import metrics
from effects.models import Session
from orgs.models import Event


def on_event(sender, event: Event, **kwargs) -> None:
    """Metrics that events already describe (`event_recorded`, after commit: counted once)."""
    if event.kind == "permission_denied" and event.data.get("kind") == "budget":
        metrics.budget_refusal(event.data.get("limit") or "", bool(event.data.get("observed")))
    elif event.kind == "compensation.failed":
        metrics.compensation("failed")
    elif event.kind in ("approval.decided", "approval.expired"):
        approval = event.data.get("approval") or {}
        held = kwargs.get("approval")  # the sender's request, in memory (the fast approval path)
        if held is not None and str(held.pk) == approval.get("id"):
            asked = held.created
        else:
            asked = ApprovalRequest.objects.filter(pk=approval.get("id")).values_list("created", flat=True).first()
        if asked is not None:
            metrics.decided(event.data.get("decision") or approval.get("state") or "expired",
                            (event.created - asked).total_seconds())


def on_events(sender, recorded: list, **kwargs) -> None:
    """`on_event` for each event of a batch (`events_recorded`)."""
    for one in recorded:
        on_event(sender, one.event, approval=one.approval)


class RowsCollector:
    """Gauges read from the rows at scrape time (a few indexed counts over all orgs)."""

    def collect(self):
        pending = ApprovalRequest.objects.filter(state=ApprovalRequest.State.PENDING)
        oldest = pending.order_by("created").values_list("created", flat=True).first()
        yield GaugeMetricFamily("undolog_approvals_pending", "Approval requests waiting for a reviewer.",
                                value=pending.count())
        yield GaugeMetricFamily("undolog_approvals_oldest_pending_seconds",
                                "Age of the oldest pending approval request (0 when none).",
                                value=(timezone.now() - oldest).total_seconds() if oldest else 0)
        yield GaugeMetricFamily("undolog_walks_in_progress", "Sessions whose undo stack is being walked.",
                                value=Session.objects.filter(state=Session.State.COMPENSATING).count())
        yield GaugeMetricFamily("undolog_incident_switch_on", "Organizations whose incident switch is on.",
                                value=BudgetPolicy.objects.filter(agent__isnull=True, incident=True).count())


def registry() -> CollectorRegistry:
    scrape = CollectorRegistry()
    MultiProcessCollector(scrape)
    scrape.register(RowsCollector())
    return scrape


def view(request: HttpRequest) -> HttpResponse:
    """`GET /metrics`: 404 unless UNDOLOG_METRICS_TOKEN is set; 401 without a bearer token, 403 with a
    wrong one (compared in constant time)."""
    token = settings.UNDOLOG_METRICS_TOKEN
    if not token:
        raise Http404("metrics are off: set UNDOLOG_METRICS_TOKEN")
    scheme, _, given = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        return HttpResponse("a bearer token is required\n", status=401, content_type="text/plain",
                            headers={"WWW-Authenticate": 'Bearer realm="metrics"'})
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return HttpResponse("wrong token\n", status=403, content_type="text/plain")
    metrics.flush()  # this process's last second of intercepts
    try:
        body = generate_latest(registry())
    finally:
        connection.close_if_unusable_or_obsolete()
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
