"""The Rules page: the org's rules in order with their recent edits, editing for admins only,
the trial for reviewers, nothing of another org; a bounded number of queries."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.dashboard.conftest import page_client

pytestmark = pytest.mark.django_db


def add(persona, name: str, position: int) -> None:
    response = persona.admin.post("/api/v1/rules", {"name": name, "condition": "args.amount > 5",
                                                    "outcome": "deny", "position": position}, format="json")
    assert response.status_code == 201


def test_it_lists_the_rules_in_order_with_their_edits(acme):
    add(acme, "second", 20)
    add(acme, "first", 10)

    html = page_client(acme, "admin").get("/rules/").content.decode()

    assert html.index(">first<") < html.index(">second<")
    assert 'data-action="edit-rule"' in html and 'id="save-rule"' in html
    assert "acme-admin" in html  # the audited edits


def test_a_reviewer_may_try_but_not_edit_and_a_viewer_only_reads(acme):
    add(acme, "only", 10)

    reviewer = page_client(acme, "reviewer").get("/rules/").content.decode()
    viewer = page_client(acme, "viewer").get("/rules/").content.decode()

    assert 'id="trial-button"' in reviewer and 'id="save-rule"' not in reviewer
    assert 'data-action="edit-rule"' not in reviewer
    assert 'id="trial-button"' not in viewer and ">only<" in viewer


def test_another_orgs_rules_are_not_shown(acme, outsider):
    add(acme, "secret-rule", 10)

    assert "secret-rule" not in page_client(outsider, "admin").get("/rules/").content.decode()


def test_it_reads_with_a_fixed_number_of_queries(acme):
    client = page_client(acme, "admin")
    add(acme, "r0", 0)
    with CaptureQueriesContext(connection) as few:
        client.get("/rules/")
    for n in range(1, 20):
        add(acme, f"r{n}", n)
    with CaptureQueriesContext(connection) as many:
        client.get("/rules/")

    assert len(many.captured_queries) == len(few.captured_queries)
