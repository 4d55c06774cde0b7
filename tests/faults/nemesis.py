"""The nemesis run: the production topology on hosts of its own (tests/netns.py: two web nodes, one
ASGI node, two workers, beat, a PostgreSQL primary and its synchronous standby, Redis and a webhook
receiver, one network namespace each), mixed traffic from agents and reviewers, and a scheduler
injecting faults; every request and answer is recorded, and a checker then proves from that
history, the receiver's log and the database what must hold (see `check`).

`python -m tests.faults.nemesis --seconds 600` (`make nemesis`) is the long run; the test suite
runs a short one (tests/faults/test_nemesis.py). Root, iproute2 and nftables needed.

Faults, one at a time, each healed before the next (the kinds rotate, so a run of N faults has
about N/8 of each): a web node cut from the primary (nftables); a worker cut from Redis; a worker
cut from the receiver mid-walk; a node's link taken down (a web node or a worker: it reaches
no one); SIGKILL of a process (a web node's gunicorn, a worker, beat, Redis), restarted; the
failover (the primary crashes, the standby is promoted, the old host comes back as a fresh
standby); a worker paused with SIGSTOP, then continued; a worker restarted with its clock 30-90 s
off (libfaketime), then restarted right."""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import redis

from tests.netns import network
from tests.processes import BASE_DIR
from tests.services import ReplicatedPostgres
from tests.topology import TOOLS, create_fleet

NODES = ["web1", "web2", "ws", "worker1", "worker2", "beat", "pg1", "pg2", "redis", "receiver"]
WEB, WORKERS = ["web1", "web2"], ["worker1", "worker2"]
KINDS = ["web-pg", "worker-redis", "worker-receiver", "link-down", "sigkill", "failover", "sigstop", "clock"]
FAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), "libfaketime.so.1")
CAP = 1  # max_irreversible_per_run
ROLLED_BACK = ("failed", "compensating", "compensated", "compensation_failed")
AGENTS = 6
BRISK = {"UNDOLOG_UNDO_SWEEP_S": "1", "UNDOLOG_UNDO_STALL_S": "3", "DB_POOL_MAX": "10", "UNDOLOG_RATE_LIMITS": "0",
         "UNDOLOG_OUTBOX_GRACE_S": "2", "PYTHONUNBUFFERED": "1", "LOG_LEVEL": "WARNING", "ALLOWED_HOSTS": "*"}
RECEIVER = """
import json, sys, threading
from http.server import ThreadingHTTPServer
from tests.receiver import Receiver
log = open(sys.argv[2], "a")
lock = threading.Lock()
def behaviour(delivery):
    with lock:
        log.write(json.dumps({"key": delivery.key, "n": delivery.n, "at": delivery.at, "body": delivery.body,
                              "verified": delivery.verified}) + "\\n")
        log.flush()
    return 200, 0.0
receiver = Receiver(behaviour=behaviour, keep_alive=True)
receiver.server.server_close()
receiver.server = ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), receiver._handler_class(True))
receiver.server.daemon_threads = True
receiver.server.serve_forever()
"""
BUDGET = """
from budgets.models import BudgetPolicy
from orgs.models import Organization
BudgetPolicy.objects.create(org=Organization.objects.get(slug="fleet"), max_irreversible_per_run={cap},
                            on_exceeded="pause")
"""


@dataclass
class Stats:
    faults: Counter = field(default_factory=Counter)
    recoveries: dict = field(default_factory=lambda: defaultdict(list))  # kind -> seconds to the next ack


class Cluster:
    """The processes on their hosts; each can be killed and started again."""

    def __init__(self, net, work: Path, pg: ReplicatedPostgres, redis_port: int) -> None:
        self.net, self.work, self.pg = net, work, pg
        self.redis_url = f"redis://{net.ip('redis')}:{redis_port}/0"
        self.redis_port = redis_port
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_")
                       and k not in ("DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR")},
                    **BRISK, "DATABASE_URL": pg.url(), "REDIS_URL": self.redis_url, "UNDOLOG_EMBEDDED_REDIS": "0",
                    "UNDOLOG_TESTING": "1"}
        self.procs: dict[str, subprocess.Popen] = {}

    def command(self, node: str) -> list[str]:
        py = sys.executable
        if node in WEB:
            return [py, "-m", "gunicorn", "undolog_site.wsgi:application", "-b", "0.0.0.0:8000", "-w", "2", "-k",
                    "gthread", "--threads", "4", "--keep-alive", "75", "--log-level", "warning"]
        if node == "ws":
            return [py, "-m", "uvicorn", "undolog_site.asgi:application", "--host", "0.0.0.0", "--port", "8000",
                    "--no-access-log", "--log-level", "warning"]
        if node in WORKERS:
            return [py, "-m", "celery", "-A", "undolog_site", "worker", "--concurrency", "2", "--without-gossip",
                    "--without-mingle", "--hostname", f"{node}@%h", "--loglevel", "WARNING"]
        if node == "beat":
            return [py, "-m", "celery", "-A", "undolog_site", "beat", "--schedule", str(self.work / "beat-schedule"),
                    "--loglevel", "WARNING"]
        if node == "redis":
            import shutil

            from tests.services import _embedded_redis_binary
            binary = shutil.which("redis-server") or _embedded_redis_binary()
            return [binary, "--port", str(self.redis_port), "--bind", "0.0.0.0", "--protected-mode", "no", "--save",
                    "", "--appendonly", "no", "--dir", str(self.work)]
        if node == "receiver":
            return [py, "-c", RECEIVER, "9000", str(self.work / "receiver.jsonl")]
        raise ValueError(node)

    def start(self, node: str, **env: str) -> None:
        log = open(self.work / f"{node}.log", "ab")  # noqa: SIM115
        self.procs[node] = subprocess.Popen([*self.net.exec(node), *self.command(node)], cwd=BASE_DIR,
                                            env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        log.close()

    def kill(self, node: str, sig: int = signal.SIGKILL) -> None:
        process = self.procs[node]
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        if sig in (signal.SIGKILL, signal.SIGTERM):
            process.wait(timeout=30)

    def url(self, node: str) -> str:
        return f"http://{self.net.ip(node)}:8000"

    def wait_up(self, node: str, timeout: float = 60) -> None:
        deadline, seen = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            try:
                answer = httpx.get(f"{self.url(node)}/healthz", timeout=2)
                if answer.status_code == 200:
                    return
                seen = answer.text
            except httpx.HTTPError as exc:
                seen = repr(exc)
            time.sleep(0.2)
        raise RuntimeError(f"{node} did not come up ({seen[:300]}); see {self.work / (node + '.log')}")


class History:
    """Every request and its answer, in the order they completed, as JSON lines."""

    def __init__(self, path: Path) -> None:
        self.path, self.lock = path, threading.Lock()
        self.file = open(path, "a")  # noqa: SIM115
        self.acks: list[float] = []

    def record(self, **entry) -> None:
        with self.lock:
            self.file.write(json.dumps(entry) + "\n")
            if entry.get("status") in (200, 201, 202):
                self.acks.append(entry["t1"])

    def close(self) -> None:
        self.file.close()


class Client:
    """One actor's HTTP client: each request to a random web node, recorded, retried on a 503 or a
    broken connection as a careful client does (the same request again: a replay, never a second
    effect)."""

    def __init__(self, who: str, cluster: Cluster, history: History, auth: str, stop: threading.Event) -> None:
        self.who, self.cluster, self.history, self.stop = who, cluster, history, stop
        self.clients = {node: httpx.Client(base_url=cluster.url(node), headers={"Authorization": auth}, timeout=10)
                        for node in WEB}

    def send(self, method: str, path: str, body: dict | None = None, *, retry: bool = True,
             deadline: float = 60) -> tuple[int, dict]:
        give_up = time.monotonic() + deadline
        while True:
            node = random.choice(WEB)
            t0 = time.time()
            try:
                answer = self.clients[node].request(method, path, json=body)
                status, data = answer.status_code, _json(answer)
            except httpx.HTTPError as exc:
                status, data = 0, {"transport": type(exc).__name__}
            self.history.record(who=self.who, node=node, method=method, path=path, body=body, status=status,
                                answer=data, t0=t0, t1=time.time())
            if status not in (0, 503) or not retry or time.monotonic() > give_up:
                return status, data
            time.sleep(0.3)

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


def _json(answer: httpx.Response) -> dict:
    try:
        return answer.json()
    except ValueError:
        return {"text": answer.text[:500]}


def agent(n: int, cluster: Cluster, history: History, key: str, stop: threading.Event, runs: dict,
          reviewer_token: str) -> None:
    """Runs: a few compensable calls (each committed; some sent again as after a timeout), then
    maybe an irreversible call or two (the cap is one per run: the run over it pauses the agent,
    and a reviewer resumes it), then complete or fail (rollback)."""
    me = Client(f"agent-{n}", cluster, history, f"Bearer {key}", stop)
    person = Client(f"resumer-{n}", cluster, history, f"Token {reviewer_token}", stop)
    rng = random.Random(n)
    try:
        while not stop.is_set():
            status, data = me.send("POST", "/api/v1/sessions", {})
            if status == 423:
                person.send("POST", f"/api/v1/agents/agent-{n}/resume", {"note": "nemesis"})
                continue
            if status != 201:
                time.sleep(0.3)
                continue
            session = data["id"]
            ending = rng.choice(["complete", "complete", "fail", "fail", "irreversible"])
            runs[session] = ending
            for step in range(1, rng.randint(2, 5) + 1):
                call = {"tool": "send_email", "args": {"to": f"{n}-{session[:8]}-{step}@x.io"}, "step_index": step}
                status, data = me.send("POST", f"/api/v1/sessions/{session}/intercept", call)
                if status not in (200, 201):
                    break
                effect = data["effect"]["id"]
                if rng.random() < 0.3:  # the agent timed out and sends the same call again
                    me.send("POST", f"/api/v1/sessions/{session}/intercept", call)
                me.send("POST", f"/api/v1/effects/{effect}/commit", {"result": {"sent": call["args"]["to"]}})
            if ending == "irreversible":
                for extra in (1, 2):  # the second is over the cap: refused before approval
                    call = {"tool": "delete_account", "args": {"account_id": f"{session[:8]}-{extra}"},
                            "step_index": 10 + extra}
                    status, data = me.send("POST", f"/api/v1/sessions/{session}/intercept", call)
                    if status != 202:
                        continue
                    effect = data["effect"]["id"]
                    until = time.monotonic() + 30
                    while time.monotonic() < until and not stop.is_set():
                        status, data = me.send("GET", f"/api/v1/effects/{effect}")
                        if status == 200 and data["effect"]["state"] in ("approved", "rejected"):
                            break
                        time.sleep(0.5)
                    if status == 200 and data["effect"]["state"] == "approved":
                        me.send("POST", f"/api/v1/effects/{effect}/start", {})
                        me.send("POST", f"/api/v1/effects/{effect}/commit", {"result": {"deleted": True}})
            verb = "fail" if ending == "fail" else "complete"
            me.send("POST", f"/api/v1/sessions/{session}/{verb}", {"error": "nemesis"} if verb == "fail" else {})
    finally:
        me.close()
        person.close()


def reviewer(n: int, cluster: Cluster, history: History, token: str, stop: threading.Event) -> None:
    """Both reviewers approve every pending request they see: they race, and only one may win."""
    me = Client(f"reviewer-{n}", cluster, history, f"Token {token}", stop)
    try:
        while not stop.is_set():
            status, data = me.send("GET", "/api/v1/approvals?state=pending", retry=False)
            for item in data.get("approvals", []) if status == 200 else []:
                me.send("POST", f"/api/v1/approvals/{item['id']}/approve", {"reason": "nemesis"}, deadline=10)
            time.sleep(0.3)
    finally:
        me.close()


def inject(kind: str, cluster: Cluster, rng: random.Random, hold: float) -> str:
    """One fault, held for `hold` seconds, then healed. Returns what was done."""
    net = cluster.net
    primary = "pg1" if cluster.pg.primary.prefix == net.exec("pg1") else "pg2"
    if kind == "web-pg":
        web = rng.choice(WEB)
        net.cut(web, primary)
        time.sleep(hold)
        net.heal(web, primary)
        return f"{web} cut from the primary ({primary})"
    if kind in ("worker-redis", "worker-receiver"):
        worker, peer = rng.choice(WORKERS), kind.split("-")[1]
        net.cut(worker, peer)
        time.sleep(hold)
        net.heal(worker, peer)
        return f"{worker} cut from {peer}"
    if kind == "link-down":
        node = rng.choice([*WEB, *WORKERS])
        net.isolate(node)
        time.sleep(hold)
        net.rejoin(node)
        return f"{node}'s link down"
    if kind == "sigkill":
        node = rng.choice([*WEB, *WORKERS, "beat", "redis"])
        cluster.kill(node)
        cluster.start(node)
        if node in WEB:
            cluster.wait_up(node)
        return f"SIGKILL {node}, restarted"
    if kind == "failover":
        cluster.pg.fail_over()
        time.sleep(hold)
        cluster.pg.rebuild()
        return "failover: primary crashed, standby promoted, old host rebuilt as the standby"
    if kind == "sigstop":
        worker = rng.choice(WORKERS)
        cluster.kill(worker, signal.SIGSTOP)
        time.sleep(hold)
        cluster.kill(worker, signal.SIGCONT)
        return f"SIGSTOP {worker} for {hold:.0f} s"
    if kind == "clock":
        worker, offset = rng.choice(WORKERS), rng.choice([-1, 1]) * rng.randint(30, 90)
        cluster.kill(worker)
        cluster.start(worker, LD_PRELOAD=FAKETIME, FAKETIME=f"{offset:+d}s", FAKETIME_DONT_FAKE_MONOTONIC="1")
        time.sleep(hold)
        cluster.kill(worker)
        cluster.start(worker)
        return f"{worker}'s clock {offset:+d} s"
    raise ValueError(kind)


def run(seconds: float, work: Path, seed: int = 30, min_faults: int = 0, hold: tuple[float, float] = (2, 5),
        gap: tuple[float, float] = (1, 3), out=print) -> dict:
    rng = random.Random(seed)
    stats = Stats()
    work.chmod(0o755)  # the clusters inside belong to the postgres user
    (work / "pg").mkdir()
    with ExitStack() as stack:
        net = stack.enter_context(network(NODES))
        pg = ReplicatedPostgres(work / "pg", listen="*", hosts=(net.ip("pg1"), net.ip("pg2")))
        pg.primary.prefix, pg.standby.prefix = net.exec("pg1"), net.exec("pg2")
        stack.callback(pg.stop)
        pg.init()
        cluster = Cluster(net, work, pg, 6379)
        for node in ("redis", "receiver"):
            cluster.start(node)
        time.sleep(0.5)
        pg.primary.migrated_database("undolog", cluster.redis_url)
        fleet = create_fleet(pg.url(), cluster.redis_url, AGENTS, f"http://{net.ip('receiver')}:9000/undo")
        env = {**os.environ, "DATABASE_URL": pg.url(), "REDIS_URL": cluster.redis_url, "UNDOLOG_EMBEDDED_REDIS": "0"}
        subprocess.run([sys.executable, "manage.py", "shell", "-c", BUDGET.format(cap=CAP)], cwd=BASE_DIR, env=env,
                       check=True, capture_output=True, timeout=120)
        for node in ["web1", "web2", "ws", "worker1", "worker2", "beat"]:
            cluster.start(node)
        stack.callback(lambda: [cluster.kill(node, signal.SIGCONT) for node in WORKERS])
        for node in ["web1", "web2", "ws"]:
            cluster.wait_up(node)
        with httpx.Client(base_url=cluster.url("web1"), headers={"Authorization": f"Bearer {fleet['keys'][0]}"}) as c:
            assert c.post("/api/v1/tools", json={"tools": TOOLS}).status_code == 200

        history = History(work / "history.jsonl")
        stop, runs = threading.Event(), {}
        tokens = {n: fleet["people"][f"reviewer-{n}"]["token"] for n in (1, 2)}
        actors = [threading.Thread(target=agent, args=(n, cluster, history, fleet["keys"][n], stop, runs, tokens[1]))
                  for n in range(AGENTS)]
        actors += [threading.Thread(target=reviewer, args=(n, cluster, history, tokens[n], stop)) for n in (1, 2)]
        for actor in actors:
            actor.start()
        started = time.monotonic()
        faults = []
        time.sleep(3)
        while time.monotonic() - started < seconds or len(faults) < min_faults:
            kind = KINDS[len(faults) % len(KINDS)]
            at = time.time()
            what = inject(kind, cluster, rng, rng.uniform(*hold))
            healed = time.time()
            faults.append({"kind": kind, "what": what, "at": at, "healed": healed})
            stats.faults[kind] += 1
            out(f"[{time.monotonic() - started:6.1f} s] {what}")
            time.sleep(rng.uniform(*gap))
            after = [t for t in history.acks if t > healed]
            stats.recoveries[kind].append((min(after) - healed) if after else None)
        stop.set()
        for actor in actors:
            actor.join(timeout=90)
        history.close()
        # Quiet: every walk the faults held up is finished by the workers and the sweeps.
        # Under load the workers may be minutes behind: wait while the backlog shrinks, and give up
        # only once it has not moved for 60 s (then what is left is stuck: the checker names it).
        left, moved, settle_started = _unsettled(pg.url()), time.monotonic(), time.monotonic()
        while left and time.monotonic() - moved < 60 and time.monotonic() - settle_started < 1200:
            time.sleep(2)
            now_left = _unsettled(pg.url())
            if now_left < left:
                moved = time.monotonic()
            left = now_left
        out(f"settled in {time.monotonic() - settle_started:.0f} s ({left} entries left)")
        stall = diagnose(cluster) if left else None
        report = check(work / "history.jsonl", work / "receiver.jsonl", pg.url(), runs)
        report["faults"] = dict(stats.faults)
        report["errors_per_fault"] = errors_per_fault(work / "history.jsonl", faults)
        report["recovery_s"] = {kind: _summary(values) for kind, values in stats.recoveries.items()}
        report["fault_log"] = faults
        if stall is not None:
            report["stall"] = stall
        return report


def diagnose(cluster: Cluster) -> dict:
    """Where a stalled backlog is held: the primary's backends (what each waits for, how long its
    transaction has been open), the broker's queues, and what each worker is running."""
    found: dict = {}
    try:
        with psycopg.connect(cluster.pg.url(), connect_timeout=3) as db:
            found["backends"] = db.execute("""
                SELECT pid, host(client_addr), application_name, state, wait_event_type, wait_event,
                       round(extract(epoch FROM now() - xact_start)::numeric, 1), left(query, 160)
                FROM pg_stat_activity WHERE datname = 'undolog' AND pid <> pg_backend_pid()
                ORDER BY xact_start NULLS LAST""").fetchall()
    except psycopg.Error as exc:
        found["backends"] = repr(exc)
    try:
        broker = redis.Redis.from_url(cluster.redis_url, socket_timeout=3)
        found["queues"] = {key.decode(): broker.llen(key) for key in broker.keys("*")
                           if broker.type(key) == b"list"}
        found["unacked"] = broker.hlen("unacked")
    except redis.RedisError as exc:
        found["queues"] = repr(exc)
    inspect = subprocess.run([sys.executable, "-m", "celery", "-A", "undolog_site", "inspect", "active", "--json",
                              "--timeout", "5"], cwd=BASE_DIR, env=cluster.env, capture_output=True, text=True,
                             timeout=60)
    found["active"] = inspect.stdout[-20_000:] or inspect.stderr[-2000:]
    return found


def errors_per_fault(history_path: Path, faults: list[dict]) -> dict:
    """Per kind: the answers that were not served (503, a broken connection) from each fault's start
    to the next one's, summed, and the most any one fault of the kind caused."""
    history = [json.loads(line) for line in history_path.read_text().splitlines()]
    by_kind: dict[str, list[int]] = defaultdict(list)
    for n, fault in enumerate(faults):
        end = faults[n + 1]["at"] if n + 1 < len(faults) else float("inf")
        by_kind[fault["kind"]].append(sum(1 for e in history if fault["at"] <= e["t1"] < end
                                          and e["status"] in (0, 503)))
    return {kind: {"sum": sum(counts), "max": max(counts)} for kind, counts in by_kind.items()}


def _summary(values: list) -> dict:
    known = sorted(v for v in values if v is not None)
    return {"n": len(values), "median": round(known[len(known) // 2], 2) if known else None,
            "max": round(known[-1], 2) if known else None, "none_after": len(values) - len(known)}


def _unsettled(url: str) -> int:
    """Undo entries of rolled-back runs not yet compensated."""
    with psycopg.connect(url, connect_timeout=3) as db:
        return db.execute("""SELECT count(*) FROM effects_undoentry u JOIN effects_session s ON s.id = u.session_id
                             WHERE s.state = ANY(%s) AND u.state IN ('pending', 'running')""",
                          (list(ROLLED_BACK),)).fetchone()[0]


def check(history_path: Path, receiver_path: Path, url: str, runs: dict) -> dict:
    """What must hold, from the recorded history, the receiver's log and the database. Each
    violation carries its evidence (the request, the rows)."""
    history = [json.loads(line) for line in history_path.read_text().splitlines()]
    deliveries = [json.loads(line) for line in receiver_path.read_text().splitlines()] if receiver_path.exists() else []
    violations: list[dict] = []
    statuses = Counter(entry["status"] for entry in history)

    # 1. No request answered 500 (a 503 only as database_unavailable, with nothing changed).
    for entry in history:
        if entry["status"] >= 500 and not (entry["status"] == 503
                                          and entry["answer"].get("error") == "database_unavailable"):
            violations.append({"rule": "no 5xx but 503 database_unavailable", "evidence": entry})

    with psycopg.connect(url, connect_timeout=5) as db:
        effects = {str(row[0]): row[1:] for row in db.execute(
            "SELECT id, session_id::text, state, result, call_signature, tool_name, step_index FROM effects_effect")}
        entries = {str(row[0]): row[1:] for row in db.execute(
            "SELECT u.id, u.session_id::text, u.state, e.step_index FROM effects_undoentry u "
            "JOIN effects_effect e ON e.id = u.effect_id")}
        sessions = dict(db.execute("SELECT id::text, state FROM effects_session").fetchall())
        approvals = {str(row[0]): row[1:] for row in db.execute(
            "SELECT id, state, effect_id::text FROM approvals_approvalrequest")}
        signatures = db.execute("""SELECT session_id, call_signature, count(*) FROM effects_effect
                                   GROUP BY 1, 2 HAVING count(*) > 1""").fetchall()

    # 2. Every acknowledged commit is in the database, with the result it was acknowledged with.
    acked = 0
    for entry in history:
        if entry["method"] == "POST" and entry["path"].endswith("/commit") and entry["status"] == 200:
            acked += 1
            effect = entry["path"].split("/")[4]
            row = effects.get(effect)
            kept = row is not None and row[1] in ("committed", "compensated", "compensating")
            if not kept or row[2] != entry["body"]["result"]:
                violations.append({"rule": "acknowledged commit present", "evidence": {"request": entry, "row": row}})

    # 3. No call signature executed twice: one effect per (session, signature) in the database, and
    #    one `execute` decision per effect in the history (every other answer a replay).
    for row in signatures:
        violations.append({"rule": "one effect per call signature", "evidence": row})
    executes: Counter[str] = Counter()
    for entry in history:
        if (entry["path"].endswith("/intercept") and entry["status"] == 201
                and entry["answer"].get("decision") == "execute"):
            executes[entry["answer"]["effect"]["id"]] += 1
    for effect, count in executes.items():
        if count > 1:
            violations.append({"rule": "executed once", "evidence": {"effect": effect, "executes": count}})

    # 4. Every rolled-back run's entries compensated exactly once at the receiver, newest first.
    first: dict[str, dict] = {}
    for delivery in deliveries:
        first.setdefault(delivery["key"], delivery)
    redeliveries = len(deliveries) - len(first)
    by_session: dict[str, list] = defaultdict(list)
    for key, delivery in first.items():
        row = entries.get(key)
        if row is None:
            violations.append({"rule": "delivery of a known entry", "evidence": delivery})
            continue
        by_session[row[0]].append((delivery["at"], row[2], key))
    rolled_back = {session for session, state in sessions.items() if state in ROLLED_BACK}
    stuck = [key for key, (session, state, _step) in entries.items()
             if session in rolled_back and state != "skipped" and (state != "compensated" or key not in first)]
    for key in stuck:
        violations.append({"rule": "rolled-back entry compensated",
                           "evidence": {"entry": key, "delivered": key in first, **_entry_evidence(url, key)}})
    for key, (session, state, _step) in entries.items():
        if state == "skipped" and key in first:
            violations.append({"rule": "a skipped entry is not sent", "evidence": {"entry": key}})
        if session not in rolled_back and key in first:
            violations.append({"rule": "only rolled-back runs compensated",
                               "evidence": {"entry": key, "session": sessions.get(session)}})
    for session, applied in by_session.items():
        steps = [step for _, step, _ in sorted(applied)]
        if steps != sorted(steps, reverse=True):
            violations.append({"rule": "newest first", "evidence": {"session": session, "steps_in_order": steps}})

    # 5. Every approval decided once: at most one 200 per approval, and it matches the row.
    decided: Counter[str] = Counter()
    for entry in history:
        if "/api/v1/approvals/" in entry["path"] and entry["method"] == "POST" and entry["status"] == 200:
            decided[entry["path"].split("/")[4]] += 1
    for approval, count in decided.items():
        if count > 1:
            violations.append({"rule": "decided once", "evidence": {"approval": approval, "200s": count}})
        if approvals.get(approval, ("?",))[0] != "approved":
            violations.append({"rule": "decision recorded", "evidence": {"approval": approval,
                                                                         "row": approvals.get(approval)}})

    # 6. Budget caps never exceeded: at most CAP irreversible calls admitted per run.
    admitted: Counter[str] = Counter()
    for session, _state, _, _, tool, _ in effects.values():
        if tool == "delete_account":  # approved or rejected, it used its slot; a refused one has no effect
            admitted[session] += 1
    for session, count in admitted.items():
        if count > CAP:
            violations.append({"rule": "cap", "evidence": {"session": session, "irreversible": count}})

    return {
        "requests": len(history), "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "acknowledged_commits": acked, "effects": len(effects), "sessions": len(sessions),
        "rolled_back_runs": len(rolled_back), "compensations_applied": len(first), "redeliveries": redeliveries,
        "approvals_decided": len(decided), "refused_over_cap": sum(
            1 for e in history if e["path"].endswith("/intercept") and e["status"] == 429),
        "violations": violations,
    }


def _entry_evidence(url: str, key: str) -> dict:
    """What a stuck entry's rows say: the entry (state, attempts, claim, lease, next attempt), its
    session (state, when it last moved) and the session's and the entry's histories."""
    with psycopg.connect(url, connect_timeout=5) as db:
        entry = db.execute("""SELECT u.state, u.step_index, u.attempts, u.claimed_at, u.lease_until, u.next_attempt_at,
                                     u.updated, u.last_error, s.id::text, s.state, s.updated, now()
                              FROM effects_undoentry u JOIN effects_session s ON s.id = u.session_id
                              WHERE u.id = %s""", (key,)).fetchone()
        attempts = db.execute("""SELECT number, outcome, started_at, status_code, left(error, 200)
                                 FROM effects_undoattempt WHERE entry_id = %s ORDER BY number""", (key,)).fetchall()
        moves = db.execute("""SELECT from_state, to_state, actor, created FROM effects_sessiontransition
                              WHERE session_id = %s ORDER BY created, id""", (entry[8],)).fetchall()
    names = ("state", "step", "attempts", "claimed_at", "lease_until", "next_attempt_at", "updated", "last_error",
             "session", "session_state", "session_updated", "checked_at")
    return {**dict(zip(names, entry, strict=True)), "attempt_log": attempts, "session_moves": moves}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--faults", type=int, default=0, help="at least this many faults, however long it takes")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (history, logs)")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "undolog_site.settings")
    work = Path(tempfile.mkdtemp(prefix="undolog-nemesis-"))
    report = run(args.seconds, work, seed=args.seed, min_faults=args.faults)
    (work / "report.json").write_text(json.dumps(report, indent=1, default=str))
    print_report(report)
    print(f"history and logs in {work}" if args.keep else "")
    if not args.keep:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    return 1 if report["violations"] else 0


def print_report(report: dict, out=print) -> None:
    out(f"faults: {sum(report['faults'].values())} {report['faults']}")
    out("recovery (s from heal to the next acknowledged request): " + json.dumps(report["recovery_s"]))
    out(" ".join(f"{k}={report[k]}" for k in ("requests", "acknowledged_commits", "effects", "sessions",
                                               "rolled_back_runs", "compensations_applied", "redeliveries",
                                               "approvals_decided", "refused_over_cap")))
    out(f"statuses: {report['statuses']}")
    out("unserved answers (503, broken connections) per fault kind: " + json.dumps(report.get("errors_per_fault")))
    out(f"violations: {len(report['violations'])} {dict(Counter(v['rule'] for v in report['violations']))}")
    if "stall" in report:
        out("stall: " + json.dumps(report["stall"], default=str)[:6000])
    for violation in report["violations"][:50]:
        out(f"  {violation['rule']}: {json.dumps(violation['evidence'], default=str)[:600]}")


if __name__ == "__main__":
    sys.exit(main())
