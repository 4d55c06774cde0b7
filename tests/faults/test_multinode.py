"""The production topology on one machine (tests/topology.py): two gunicorn web nodes, one ASGI
node, two Celery workers and one beat against one PostgreSQL and one Redis. 50 agents make 20
calls each through both web nodes; two reviewers decide the 100 irreversible calls, each through
its own node; ten runs are rejected and rolled back; one worker is killed with SIGKILL while the
walks run. Every count is exact, every compensation takes effect once at the receiver, and every
decision reaches a dashboard socket open on the ASGI node.

PostgreSQL only, by construction: the topology runs on a cluster of the test's own
(tests/services.py), in both test configurations; Redis is its own too."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest

from tests.conftest import eventually
from tests.receiver import Receiver
from tests.services import own_postgres, own_redis
from tests.topology import TOOLS, Dashboard, create_fleet, topology

AGENTS, CALLS = 50, 20  # per agent: 18 compensable calls, then 2 irreversible ones
ROLLED_BACK = 10  # agents whose last call is rejected with rollback: 18 compensations each
DEADLINE_S = 150


def test_two_web_nodes_two_workers_one_beat_keep_every_count_exact_through_a_worker_kill():
    started = time.monotonic()
    with own_postgres() as pg, own_redis() as redis_server, Receiver() as receiver:
        url = pg.migrated_database("undolog", redis_server.url)
        fleet = create_fleet(url, redis_server.url, AGENTS, receiver.url)
        receiver.secrets = [fleet["secret"]]  # every undo is signed with the org's secret
        with topology(url, redis_server.url) as nodes:
            web = nodes.web
            with httpx.Client(base_url=web[0], headers={"Authorization": f"Bearer {fleet['keys'][0]}"}) as setup:
                assert setup.post("/api/v1/tools", json={"tools": TOOLS}).status_code == 200
            dashboard = Dashboard(nodes.asgi, fleet["people"]["reviewer-1"]["session"])
            dashboard.thread.start()
            assert dashboard.connected.wait(15)

            answers: Counter[tuple[str, int]] = Counter()
            rollback_sessions: set[str] = set()
            sessions: dict[int, str] = {}
            lock = threading.Lock()

            def post(client: httpx.Client, what: str, path: str, body: dict) -> httpx.Response:
                answer = client.post(path, json=body)
                with lock:
                    answers[(what, answer.status_code)] += 1
                return answer

            def run_agent(i: int) -> None:
                nodes_of = [httpx.Client(base_url=base, headers={"Authorization": f"Bearer {fleet['keys'][i]}"},
                                         timeout=60) for base in web]
                try:
                    session = post(nodes_of[i % 2], "open", "/api/v1/sessions", {}).json()["id"]
                    sessions[i] = session
                    if i < ROLLED_BACK:
                        with lock:
                            rollback_sessions.add(session)
                    for step in range(1, CALLS + 1):
                        client = nodes_of[step % 2]  # every other request to the other node
                        if step <= CALLS - 2:
                            effect = post(client, "intercept", f"/api/v1/sessions/{session}/intercept", {
                                "tool": "send_email", "args": {"to": f"{i}-{step}@x.io"}, "step_index": step}).json()
                            post(nodes_of[(step + 1) % 2], "commit", f"/api/v1/effects/{effect['effect']['id']}/commit",
                                 {"result": {"id": f"{i}-{step}"}})
                            continue
                        held = post(client, "intercept", f"/api/v1/sessions/{session}/intercept", {
                            "tool": "delete_account", "args": {"account_id": f"{i}-{step}"}, "step_index": step}).json()
                        effect_id = held["effect"]["id"]
                        state = eventually(lambda e=effect_id, c=client: (s := c.get(f"/api/v1/effects/{e}").json()[
                            "effect"]["state"]) in ("approved", "rejected") and s, timeout=DEADLINE_S, every=0.25)
                        if state == "rejected":
                            return
                        post(client, "start", f"/api/v1/effects/{effect_id}/start", {})
                        post(client, "commit", f"/api/v1/effects/{effect_id}/commit", {"result": {}})
                    post(nodes_of[0], "complete", f"/api/v1/sessions/{session}/complete", {})
                finally:
                    for c in nodes_of:
                        c.close()

            decisions: Counter[int] = Counter()  # web node → decisions it made
            done = threading.Event()

            def review(node: int) -> None:
                token = fleet["people"][f"reviewer-{node + 1}"]["token"]
                with httpx.Client(base_url=web[node], headers={"Authorization": f"Token {token}"}, timeout=60) as me:
                    while not done.is_set():
                        for item in me.get("/api/v1/approvals", params={"state": "pending"}).json()["approvals"]:
                            with lock:
                                reject = item["session"] in rollback_sessions and item["step_index"] == CALLS
                            verb = "reject?rollback=true" if reject else "approve"
                            answer = me.post(f"/api/v1/approvals/{item['id']}/{verb}", json={"reason": "review"})
                            assert answer.status_code in (200, 409), answer.text  # 409: the other reviewer was first
                            if answer.status_code == 200:
                                with lock:
                                    decisions[node] += 1
                        time.sleep(0.2)

            reviewers = [threading.Thread(target=review, args=(n,), daemon=True) for n in (0, 1)]
            for reviewer in reviewers:
                reviewer.start()

            def kill_a_worker() -> None:
                receiver.wait_for(lambda r: len(r.applied) >= 20, timeout=DEADLINE_S)
                os.killpg(nodes.workers[0].pid, signal.SIGKILL)

            killer = threading.Thread(target=kill_a_worker, daemon=True)
            killer.start()
            with ThreadPoolExecutor(max_workers=10) as pool:
                list(pool.map(run_agent, range(AGENTS)))
            done.set()

            receiver.wait_for(lambda r: len(r.applied) >= ROLLED_BACK * (CALLS - 2), timeout=DEADLINE_S)
            killer.join(timeout=5)
            assert nodes.workers[0].poll() is not None, "the first worker was killed mid-run"
            eventually(lambda: dashboard.decided >= decided_ids(url), timeout=10)
            dashboard.stop.set()

            with psycopg.connect(url) as db:
                assert_counts(db)
            assert len(receiver.applied) == ROLLED_BACK * (CALLS - 2)  # each undo took effect once
            assert all(delivery.verified for delivery in receiver.log)
            assert decisions[0] > 0 and decisions[1] > 0 and sum(decisions.values()) == AGENTS * 2, decisions
            assert dashboard.decided == decided_ids(url) and len(dashboard.decided) == AGENTS * 2
            assert not [key for key in answers if key[1] >= 500], answers
            assert answers[("intercept", 201)] == AGENTS * (CALLS - 2)
            assert answers[("intercept", 202)] == AGENTS * 2
    print(f"multi-node run: {time.monotonic() - started:.0f} s; requests {dict(answers)}; "
          f"redeliveries acknowledged by the receiver {sum(receiver.duplicates.values())}")


def decided_ids(url: str) -> set[str]:
    with psycopg.connect(url) as db:
        return {str(row[0]) for row in db.execute("SELECT id FROM approvals_approvalrequest WHERE state <> 'pending'")}


def assert_counts(db: psycopg.Connection) -> None:
    one = lambda sql: db.execute(sql).fetchone()[0]  # noqa: E731
    assert one("SELECT count(*) FROM effects_effect") == AGENTS * CALLS
    assert one("SELECT count(*) FROM effects_effect WHERE state = 'rejected'") == ROLLED_BACK
    assert one("SELECT count(*) FROM effects_effect WHERE state = 'compensated'") == ROLLED_BACK * (CALLS - 2)
    assert one("SELECT count(*) FROM effects_effect WHERE state = 'committed'") == (
        (AGENTS - ROLLED_BACK) * CALLS + ROLLED_BACK * (CALLS - 1) - ROLLED_BACK * (CALLS - 2))
    assert one("SELECT count(*) FROM effects_undoentry") == AGENTS * (CALLS - 2)
    assert one("SELECT count(*) FROM effects_undoentry WHERE state = 'compensated'") == ROLLED_BACK * (CALLS - 2)
    assert one("SELECT count(*) FROM effects_session WHERE state = 'completed'") == AGENTS - ROLLED_BACK
    assert one("SELECT count(*) FROM effects_session WHERE state = 'compensated'") == ROLLED_BACK
    assert one("SELECT sum(tool_calls) FROM effects_session") == AGENTS * CALLS
    assert one("SELECT sum(irreversible_calls) FROM effects_session") == AGENTS * 2
    assert one("SELECT count(*) FROM approvals_approvalrequest WHERE state = 'approved'") == AGENTS * 2 - ROLLED_BACK
    assert one("SELECT count(*) FROM orgs_event WHERE kind = 'approval.requested'") == AGENTS * 2
    assert one("SELECT count(*) FROM orgs_event WHERE kind = 'approval.decided'") == AGENTS * 2


pytestmark = pytest.mark.timeout(400)
