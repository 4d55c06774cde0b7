"""PostgreSQL restarts under load: requests in flight answer 503 `database_unavailable` with
`Retry-After` (never a 500, never half a write), and the connection pool reconnects by itself.

Against a PostgreSQL cluster of the test's own (tests/services.py: initdb on its own port, so
the shared one is untouched), restarted with `pg_ctl restart -m fast` while eight agents call.
It runs the same in both test configurations: the server under test always uses that cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter

import httpx
import psycopg
from django.conf import settings

from tests.processes import BASE_DIR, wsgi_server
from tests.receiver import Receiver
from tests.services import own_postgres

AGENTS = 8


def manage(url: str, *args: str) -> str:
    env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": settings.REDIS_URL, "UNDOLOG_EMBEDDED_REDIS": "0"}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, env=env, check=True,
                          capture_output=True, text=True, timeout=60).stdout


def test_a_restart_answers_503_with_retry_after_writes_nothing_partial_and_the_pool_reconnects():
    with own_postgres() as pg, Receiver() as receiver:
        url = pg.migrated_database("undolog", settings.REDIS_URL)
        manage(url, "createorg", "acme")
        key = manage(url, "createagent", "acme", "cleanup").strip().splitlines()[-1]
        # Rate limits are not what this proves: eight agents calling flat out pass 1200 a minute.
        with wsgi_server(workers=2, DATABASE_URL=url, DB_POOL_MIN="4", UNDOLOG_RATE_LIMIT_PER_KEY="1000000",
                         UNDOLOG_RATE_LIMIT_PER_ORG="10000000") as base, \
                httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30) as setup:
            undo = {"fn_name": "undo", "fn_version": "1.0.0"}
            assert setup.post("/api/v1/compensations", json={
                **undo, "handler": "webhook", "target": receiver.url}).status_code == 201
            assert setup.post("/api/v1/tools", json={"tools": [{
                "name": "send_email", "tier": "compensable", "compensation": {**undo, "args": {"to": "{to}"}}}]}
            ).status_code == 200

            statuses: Counter[int] = Counter()
            bad: list[tuple[int, str]] = []
            steps: dict[str, int] = {}
            restarted = threading.Event()
            recovered_after: list[float] = []
            lock = threading.Lock()

            def call(client: httpx.Client, path: str, body: dict, ok: tuple[int, ...]) -> httpx.Response:
                """Retry what a 503 (or a cut connection) refused, as a client should; the same call
                again is a replay, never a second effect."""
                while True:
                    try:
                        answer = client.post(path, json=body)
                    except httpx.TransportError:
                        time.sleep(0.2)
                        continue
                    with lock:
                        statuses[answer.status_code] += 1
                        if answer.status_code == 503:
                            if (answer.json().get("error") != "database_unavailable"
                                    or not answer.headers.get("Retry-After")):
                                bad.append((answer.status_code, answer.text))
                        elif answer.status_code not in ok:
                            bad.append((answer.status_code, answer.text))
                    if answer.status_code in ok:
                        return answer
                    if answer.status_code != 503:
                        raise AssertionError(answer.text)
                    time.sleep(min(float(answer.headers.get("Retry-After", "1")), 0.5))

            def agent(n: int) -> None:
                with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
                    session = call(client, "/api/v1/sessions", {}, (201,)).json()["id"]
                    step, until = 0, None
                    while until is None or time.monotonic() < until:
                        step += 1
                        effect = call(client, f"/api/v1/sessions/{session}/intercept", {
                            "tool": "send_email", "args": {"to": f"{n}-{step}@x.io"}, "step_index": step},
                            (200, 201)).json()["effect"]
                        call(client, f"/api/v1/effects/{effect['id']}/commit", {"result": {"step": step}}, (200, 409))
                        if restarted.is_set() and until is None:
                            until = time.monotonic() + 2
                    steps[session] = step

            threads = [threading.Thread(target=agent, args=(n,)) for n in range(AGENTS)]
            for thread in threads:
                thread.start()
            time.sleep(2)
            pg.restart()
            restart_done = time.monotonic()
            restarted.set()
            for thread in threads:
                thread.join(timeout=120)
            assert not any(thread.is_alive() for thread in threads)
            # After the restart the same server answers again, with no restart of its own.
            health = setup.get("/healthz")
            recovered_after.append(time.monotonic() - restart_done)
            assert health.status_code == 200 and health.json()["database"] == "ok", health.text

        assert bad == [], bad[:5]
        assert statuses[503] >= 1, statuses  # the restart did cut requests in flight
        assert set(statuses) <= {200, 201, 409, 503}, statuses  # never a 500
        with psycopg.connect(url) as db:
            for session, step in steps.items():
                counted, effects, entries, committed = db.execute("""
                    SELECT s.tool_calls,
                           (SELECT count(*) FROM effects_effect e WHERE e.session_id = s.id),
                           (SELECT count(*) FROM effects_undoentry u WHERE u.session_id = s.id),
                           (SELECT count(*) FROM effects_effect e WHERE e.session_id = s.id AND e.state = 'committed')
                    FROM effects_session s WHERE s.id = %s""", (session,)).fetchone()
                # Every call the agent made exists once, with its undo entry, counted once, committed.
                assert counted == effects == entries == committed == step, (session, counted, effects, entries, step)
