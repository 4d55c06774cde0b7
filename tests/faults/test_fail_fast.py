"""Fail fast: while PostgreSQL is away an agent's request answers 503 `database_unavailable`
within ~2 s (DB_POOL_TIMEOUT_MS) and /healthz 503 within 1 s (UNDOLOG_HEALTHZ_TIMEOUT_MS), short
of a load balancer's health-check timeout; when it is back the same server answers at once.

Against a PostgreSQL cluster of the test's own (tests/services.py), stopped with `-m immediate`
(as a crash: connections cut, new ones refused) and started again."""

from __future__ import annotations

import time

import httpx
from django.conf import settings

from tests.faults.test_postgres_restart import manage
from tests.processes import wsgi_server
from tests.services import own_postgres


def timed(request) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    answer = request()
    return answer, time.monotonic() - started


def test_it_answers_503_within_two_seconds_and_healthz_within_one_while_the_database_is_down():
    with own_postgres() as pg:
        url = pg.migrated_database("undolog", settings.REDIS_URL)
        manage(url, "createorg", "acme")
        key = manage(url, "createagent", "acme", "cleanup").strip().splitlines()[-1]
        with wsgi_server(workers=1, threads=4, DATABASE_URL=url) as base, \
                httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
            assert client.post("/api/v1/sessions", json={}).status_code == 201  # the pool holds a connection
            pg._run("pg_ctl", "-D", str(pg.data), "-m", "immediate", "-w", "-t", "30", "stop")

            waits = []
            for _ in range(3):  # the pooled connection's request, then the pool's empty ones
                answer, took = timed(lambda: client.post("/api/v1/sessions", json={}))
                assert answer.status_code == 503 and answer.json()["error"] == "database_unavailable", answer.text
                assert answer.headers["Retry-After"]
                waits.append(took)
            health, health_took = timed(lambda: client.get("/healthz"))
            assert health.status_code == 503 and health.json()["status"] == "unhealthy", health.text
            assert max(waits) < 2.6, waits
            assert health_took < 1.0, health_took

            pg.start()
            back = time.monotonic()
            while client.post("/api/v1/sessions", json={}).status_code != 201:
                assert time.monotonic() - back < 5, "the pool did not reconnect"
                time.sleep(0.05)
            recovered = time.monotonic() - back
            assert client.get("/healthz").status_code == 200
            print(f"503 after {', '.join(f'{w:.2f}' for w in waits)} s; /healthz 503 after {health_took:.2f} s; "
                  f"first 201 {recovered:.2f} s after PostgreSQL was up")
            assert recovered < 3, recovered
