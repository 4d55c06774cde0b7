"""The dashboard's Audit page shows the chain's state: records, backlog, and a broken verify."""

from __future__ import annotations

import pytest

from ops import audit
from ops.models import AuditRecord
from orgs.models import Event
from tests.dashboard.conftest import page_client

pytestmark = pytest.mark.django_db


def test_the_audit_page_shows_the_chain_the_backlog_and_the_last_verify(acme, outsider):
    for n in range(3):
        Event.record(acme.org, "permission_denied", kind="budget", step_index=n)
    audit.seal(acme.org.id)
    Event.record(acme.org, "incident.changed", on=True, by="admin")  # not sealed yet
    Event.record(outsider.org, "incident.changed", on=True, by="them")

    html = page_client(acme, "viewer").get("/audit/").content.decode()

    assert '<dd id="audit-seq">3</dd>' in html
    assert '<dd id="audit-backlog">1</dd>' in html
    assert "never: run" in html
    AuditRecord.objects.filter(org=acme.org, seq=2).update(hash="0" * 64)
    audit.verify(acme.org)
    html = page_client(acme, "viewer").get("/audit/").content.decode()
    assert "broken" in html and "record #2" in html


def test_an_org_with_nothing_sealed_says_so(acme):
    html = page_client(acme, "viewer").get("/audit/").content.decode()

    assert "Nothing sealed yet" in html
    assert "365 days" in html  # the documented default retention of events
