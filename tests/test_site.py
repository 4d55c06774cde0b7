"""The site's own endpoints: health, schema and docs."""

from __future__ import annotations

import pytest


def test_healthz_answers_when_the_database_and_redis_answer(client, db):
    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok", "degraded": [], "database": "ok", "redis": "ok"}


def test_healthz_names_redis_as_degraded_and_stays_200_without_it(client, db, settings):
    # The API works on PostgreSQL alone (tests/faults): a load balancer must keep the node.
    settings.REDIS_URL = "redis://127.0.0.1:1/0"

    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json()["status"] == "degraded" and response.json()["degraded"] == ["redis"]
    assert response.json()["redis"].startswith("error")
    assert response.json()["database"] == "ok"


@pytest.mark.parametrize("path", ["/api/v1/sessions/{id}/intercept", "/api/v1/tools", "/api/v1/compensations",
                                  "/api/v1/effects/{id}/commit"])
def test_the_schema_documents_the_contract(client, db, path):
    response = client.get("/api/schema/?format=json")

    assert response.status_code == 200
    assert path in response.json()["paths"]


def test_the_docs_page_renders(client, db):
    response = client.get("/api/docs/")

    assert response.status_code == 200
    assert b"swagger" in response.content.lower()
    assert b"cdn." not in response.content  # vendored: works offline


def test_an_unknown_api_path_is_a_json_404(client, db):
    response = client.get("/api/v1/nothing-here")

    assert response.status_code == 404
    assert response.json()["error"] == "not_found"
