"""The dashboard's Audit page: the chain's state, the backlog, the last verify, and retention."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from approvals.views import member_page, page
from ops import audit
from ops.models import AuditChain, AuditRecord, Retention
from orgs.models import Membership


@require_GET
@member_page
def audit_page(request: HttpRequest, membership: Membership) -> HttpResponse:
    org = membership.org
    chain = AuditChain.objects.filter(org=org).first()
    retention = Retention.of(org)
    return page(request, membership, "ops/audit.html", {
        "chain": chain,
        "backlog": audit.backlog(org),
        "recent": AuditRecord.objects.filter(org=org).order_by("-seq")[:20],
        "retention": [(label, getattr(retention, name)) for name, label in (
            ("safe_call_days", "SAFE-call reports"), ("transition_days", "State history of closed sessions"),
            ("event_days", "Events (audit-worthy ones once sealed)"),
            ("session_days", "Closed sessions, with their effects"))],
        "is_admin": membership.has_role(Membership.Role.ADMIN),
    })
