"""Soak: mixed traffic on the multi-node topology (tests/topology.py: two gunicorn nodes, an ASGI
node, two workers, one beat) for UNDOLOG_SOAK_S seconds (default 600), on a PostgreSQL cluster and
a Redis of its own. Prints each process's memory (RSS of its process group) at start and end,
errors, and the p50/p99 of every request per time window, so a leak or a slow drift shows.

Traffic, from UNDOLOG_SOAK_AGENTS agent threads (default 8): runs of 10 calls through both web
nodes, compensable intercept + commit; one run in five also makes an irreversible call a
reviewer approves; one run in ten fails and is walked back by the workers.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx

SOAK_S = float(os.environ.get("UNDOLOG_SOAK_S", "600"))
AGENTS = int(os.environ.get("UNDOLOG_SOAK_AGENTS", "8"))
WINDOWS = 10
PRODUCTION_LIKE = {"DEBUG": "0", "SECRET_KEY": "soak-only-secret-key-not-for-production-0123456789",
                   "UNDOLOG_SEAL_KEY": "soak-only-seal-key-not-for-production-0123456789",
                   "SECURE_SSL_REDIRECT": "0", "ALLOWED_HOSTS": "127.0.0.1,localhost",
                   "UNDOLOG_ALLOW_PRIVATE_WEBHOOKS": "1", "LOG_LEVEL": "WARNING"}


def rss_mb(leader_pid: int) -> float:
    """The resident memory of a process and its children (its process group), in MiB."""
    total = 0
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == leader_pid:  # pgrp
                total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # rss pages
        except (OSError, IndexError, ValueError):
            continue
    return total / 2**20


class Traffic:
    def __init__(self, web: list[str], fleet: dict) -> None:
        self.web, self.fleet = web, fleet
        self.started = time.monotonic()
        self.latencies: dict[int, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.runs = self.failed_runs = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def window(self) -> int:
        return min(WINDOWS - 1, int((time.monotonic() - self.started) / (SOAK_S / WINDOWS)))

    def post(self, client: httpx.Client, path: str, body: dict, ok: tuple[int, ...]) -> dict:
        started = time.monotonic()
        try:
            answer = client.post(path, json=body)
        except httpx.HTTPError as exc:
            with self.lock:
                self.errors[type(exc).__name__] += 1
            return {}
        with self.lock:
            self.latencies[self.window()].append(time.monotonic() - started)
            if answer.status_code not in ok:
                self.errors[f"{path.split('/')[-1]} {answer.status_code}"] += 1
        return answer.json() if answer.status_code in ok else {}

    def agent(self, n: int) -> None:
        clients = [httpx.Client(base_url=base, headers={"Authorization": f"Bearer {self.fleet['keys'][n]}"},
                                timeout=60) for base in self.web]
        run = 0
        while not self.stop.is_set():
            run += 1
            session = self.post(clients[run % 2], "/api/v1/sessions", {}, (201,)).get("id")
            if not session:
                time.sleep(0.5)
                continue
            for step in range(1, 11):
                client = clients[step % 2]
                if step == 10 and run % 5 == 0:
                    held = self.post(client, f"/api/v1/sessions/{session}/intercept", {
                        "tool": "delete_account", "args": {"account_id": f"{n}-{run}"}, "step_index": step}, (202,))
                    if held:
                        try:
                            client.get(f"/api/v1/effects/{held['effect']['id']}", params={"wait": 30})
                        except httpx.HTTPError as exc:
                            with self.lock:
                                self.errors[f"long poll {type(exc).__name__}"] += 1
                        self.post(client, f"/api/v1/effects/{held['effect']['id']}/start", {}, (200,))
                        self.post(client, f"/api/v1/effects/{held['effect']['id']}/commit", {"result": {}}, (200,))
                    continue
                effect = self.post(client, f"/api/v1/sessions/{session}/intercept", {
                    "tool": "send_email", "args": {"to": f"{n}-{run}-{step}@x.io"}, "step_index": step}, (201,))
                if effect:
                    self.post(clients[(step + 1) % 2], f"/api/v1/effects/{effect['effect']['id']}/commit",
                              {"result": {"step": step}}, (200,))
            verb = "fail" if run % 10 == 0 else "complete"
            self.post(clients[0], f"/api/v1/sessions/{session}/{verb}", {"error": "soak"} if verb == "fail" else {},
                      (200,))
            with self.lock:
                self.runs += 1
                self.failed_runs += verb == "fail"
        for client in clients:
            client.close()

    def reviewer(self, node: int) -> None:
        token = self.fleet["people"][f"reviewer-{node + 1}"]["token"]
        with httpx.Client(base_url=self.web[node], headers={"Authorization": f"Token {token}"}, timeout=60) as me:
            while not self.stop.is_set():
                try:
                    for item in me.get("/api/v1/approvals", params={"state": "pending"}).json()["approvals"]:
                        me.post(f"/api/v1/approvals/{item['id']}/approve", json={})
                except (httpx.HTTPError, KeyError, ValueError):
                    with self.lock:
                        self.errors["reviewer"] += 1
                time.sleep(0.3)


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "undolog_site.settings")
    os.environ.update(PRODUCTION_LIKE)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import django

    django.setup()
    from tests.receiver import Receiver
    from tests.services import own_postgres, own_redis
    from tests.topology import TOOLS, create_fleet, topology

    print(f"soak: {SOAK_S:.0f} s, {AGENTS} agents, two web nodes + ASGI + two workers + beat", flush=True)
    with own_postgres() as pg, own_redis() as redis_server, Receiver() as receiver:
        url = pg.migrated_database("undolog", redis_server.url)
        fleet = create_fleet(url, redis_server.url, AGENTS, receiver.url)
        with topology(url, redis_server.url, **PRODUCTION_LIKE) as nodes:
            with httpx.Client(base_url=nodes.web[0], headers={"Authorization": f"Bearer {fleet['keys'][0]}"}) as c:
                c.post("/api/v1/tools", json={"tools": TOOLS}).raise_for_status()
            processes = {"web-1": nodes.web_pids[0], "web-2": nodes.web_pids[1], "asgi": nodes.asgi_pid,
                         "worker-1": nodes.workers[0].pid, "worker-2": nodes.workers[1].pid, "beat": nodes.beat.pid}
            time.sleep(1)
            memory_start = {name: rss_mb(pid) for name, pid in processes.items()}
            traffic = Traffic(nodes.web, fleet)
            threads = [threading.Thread(target=traffic.agent, args=(n,)) for n in range(AGENTS)]
            threads += [threading.Thread(target=traffic.reviewer, args=(n,), daemon=True) for n in (0, 1)]
            for thread in threads:
                thread.start()
            time.sleep(SOAK_S)
            traffic.stop.set()
            for thread in threads[:AGENTS]:
                thread.join(timeout=90)
            memory_end = {name: rss_mb(pid) for name, pid in processes.items()}
            # Let the last walks finish, then count what reached the receiver.
            time.sleep(5)
    report(traffic, memory_start, memory_end, len(receiver.applied), sum(receiver.duplicates.values()))
    return 1 if traffic.errors else 0


def report(traffic: Traffic, memory_start: dict, memory_end: dict, applied: int, duplicates: int) -> None:
    total = sum(len(v) for v in traffic.latencies.values())
    print(f"requests {total} ({total / SOAK_S:.0f}/s), runs {traffic.runs} ({traffic.failed_runs} failed and walked "
          f"back), compensations applied at the receiver {applied} (redeliveries acknowledged: {duplicates})")
    print(f"errors: {dict(traffic.errors) or 'none'}")
    print("window  requests  p50 ms  p99 ms")
    for window in range(WINDOWS):
        values = sorted(traffic.latencies.get(window, []))
        if values:
            p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
            print(f"{window + 1:>6}  {len(values):>8}  {statistics.median(values) * 1000:>6.1f}  {p99 * 1000:>6.1f}")
    print("process   RSS start MiB  RSS end MiB")
    for name in memory_start:
        print(f"{name:<9} {memory_start[name]:>13.1f}  {memory_end[name]:>11.1f}")


if __name__ == "__main__":
    sys.exit(main())
