"""The nemesis run: the production topology on hosts of its own (tests/netns.py: two web nodes, one
ASGI node, two workers, beat, a PostgreSQL primary and its synchronous standby, Redis and a webhook
receiver, one network namespace each), mixed traffic from agents, reviewers and an admin, and a
scheduler injecting faults; every request and answer is recorded, and the checker
(tests/faults/checker.py) then holds every acknowledged answer against the history, the
receiver's log and the database.

`python -m tests.faults.nemesis --seconds 600` (`make nemesis`) is the long run; `make
nemesis-short` (CI) runs one fault of each kind on each role it can strike (PLAN: 13). The seed
varies and is printed; `--seed N` or `NEMESIS_SEED=N` replays one. `make nemesis-mutants`
(tests/faults/mutate.py) proves the checker on deliberate bugs. Root, iproute2 and nftables needed.

The workload reaches the races: each run's calls come in batches issued at once (as a model issues
parallel tool calls), irreversible ones too, over a cap of one per run (held for people, decided
by an approve rule on the fast approval path, or left to expire); reviewers race to approve,
reject, or reject and roll back; an admin rolls one agent's runs back (fleet rollback) during the
faults; every run being rolled back gets a second walk task every 0.3 s (the broker's
at-least-once delivery, made common: two workers walk one run at once). The receiver fails some
deliveries (5xx, a dropped connection, a stall past the sender's timeout: applied, answered too
late).

Faults, one at a time, each healed before the next: a web node cut from the primary (nftables);
a worker cut from Redis; a worker cut from the receiver mid-walk; a node's link taken down (a
web node, a worker); SIGKILL of a process (a web node's gunicorn, a worker, beat, Redis),
restarted; the failover (the primary cut from its standby, then crashed; the standby promoted,
the old host back as a fresh standby); a failover a partition causes (the primary alive, cut from
its standby, beat, the ASGI node and one web node and worker, still serving the other two; the
standby promoted: two primaries for a few seconds, then the old one fenced and rebuilt); a worker
paused with SIGSTOP, then continued; a worker restarted with its clock 30-90 s off (libfaketime),
then restarted right. Faults that stop or
cut a worker are held past the lease (the function's timeout plus UNDOLOG_UNDO_STALL_S), so its
claims are taken over."""

from __future__ import annotations

import argparse
import glob
import itertools
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
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg
import redis

from tests.faults import checker
from tests.netns import network
from tests.processes import BASE_DIR
from tests.services import ReplicatedPostgres
from tests.topology import TOOLS, create_fleet

NODES = ["web1", "web2", "ws", "worker1", "worker2", "beat", "pg1", "pg2", "redis", "receiver"]
WEB, WORKERS = ["web1", "web2"], ["worker1", "worker2"]
# One fault of each kind on each role it can strike: the short run's plan (a long run repeats it,
# each round in an order of its own). Faults that stop or cut a worker are held past the lease,
# so that its claims are taken over.
PLAN = [("web-pg", "web"), ("worker-redis", "worker"), ("worker-receiver", "worker"), ("link-down", "web"),
        ("link-down", "worker"), ("sigkill", "web"), ("sigkill", "worker"), ("sigkill", "beat"),
        ("sigkill", "redis"), ("failover", "primary"), ("partition", "primary"), ("sigstop", "worker"),
        ("clock", "worker")]
KINDS = sorted({kind for kind, _ in PLAN})
PAST_LEASE = {"worker-receiver", "link-down", "sigstop"}
FAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), "libfaketime.so.1")
CAP = 1  # max_irreversible_per_run
FN_TIMEOUT_MS = 1000  # the undo webhook's timeout: the lease is this plus UNDOLOG_UNDO_STALL_S
IRREVERSIBLE = {"delete_account", "refund", "wire"}
WALK_TASK = "effects.tasks.walk_undo_stack"  # lifecycle/tasks.py's WALK
ROLLED_BACK = ("failed", "compensating", "compensated", "compensation_failed")
AGENTS = 6
FLEET_AGENT = f"agent-{AGENTS - 1}"  # its runs are rolled back by an admin from time to time
BRISK = {"UNDOLOG_UNDO_SWEEP_S": "1", "UNDOLOG_UNDO_STALL_S": "3", "DB_POOL_MAX": "10", "UNDOLOG_RATE_LIMITS": "0",
         "UNDOLOG_OUTBOX_GRACE_S": "2", "PYTHONUNBUFFERED": "1", "LOG_LEVEL": "WARNING", "ALLOWED_HOSTS": "*"}
# The webhook receiver: a careful one (deduped by Idempotency-Key) that sometimes fails: 5xx, a
# dropped connection (no answer), a stall past the sender's timeout (applied, answered too late).
# Each delivery is logged once answered: its arrival and end, how it was answered, whether it
# applied the key (the first success of it), the sender's attempt number, and what it found on
# arrival: the deliveries of its key not answered yet whose sender still waited for their answer
# (`in_flight_with`: two in flight at once) and those whose sender had hung up (`gave_up_on`: it
# timed out or died; that delivery is no longer in flight, however late this receiver's thread
# for it runs); and whether its own sender had hung up within `hold` of its arrival, long before
# any timeout (`abandoned`: TCP delivered it after its sender gave up, e.g. data a closed socket
# kept retransmitting until a cut healed; nobody waits for it). Whether a sender still waits is
# read from the kernel (its connection open, not closed or reset), not from this process's clock:
# under load a thread of this receiver can run a second late, and a timestamp it takes then says
# when it ran, not when its sender gave up (the 400-fault run's 23 us "overlap").
# `X-Nemesis-Outcome` forces an outcome (tests/faults/test_receiver.py).
RECEIVER = """
import json, random, socket, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port, path, seed, timeout = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
log, lock, rng, seen, applied = open(path, "a"), threading.Lock(), random.Random(seed), {}, set()
unanswered = {}  # key -> {n: (arrived, connection)}: its deliveries whose answer is not decided yet

def sender_waits(connection):
    # Its connection open with nothing to read (the request was read whole): the sender waits.
    # Closed (EOF) or reset: it gave up.
    try:
        return connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key, arrived = self.headers.get("Idempotency-Key", ""), time.time()
        try:
            attempt = json.loads(raw).get("attempt")
        except (ValueError, AttributeError):
            attempt = None
        with lock:
            seen[key] = n = seen.get(key, 0) + 1
            others = unanswered.setdefault(key, {})
            waits = {m: sender_waits(connection) for m, (_, connection) in others.items()}
            in_flight = [{"n": m, "arrived": others[m][0]} for m, w in waits.items() if w]
            gave_up = [m for m, w in waits.items() if not w]
            others[n] = (arrived, self.connection)
            # Abandoned: its own sender had hung up already (checked again after `hold` below, long
            # before any sender's timeout): a request TCP delivered after its sender gave up (data
            # a closed socket still retransmits once a cut heals). No sender waits for it.
            abandoned = not sender_waits(self.connection)
            roll, hold = rng.random(), rng.uniform(0.02, 0.1)
            outcome = self.headers.get("X-Nemesis-Outcome") or (
                "5xx" if roll < 0.08 else "drop" if roll < 0.12 else "stall" if roll < 0.16 else "ok")
            first = outcome in ("ok", "stall") and key not in applied
            applied.add(key) if first else None

        def decided():
            # The answer is decided: from here this delivery is not in flight for a later one (its
            # sender cannot learn the answer, or the drop, before this), and `ended` says when.
            with lock:
                others.pop(n, None)
                if not others and unanswered.get(key) is others:
                    del unanswered[key]
            return time.time()

        if outcome == "drop":
            ended = decided()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        else:
            time.sleep(hold)
            abandoned = abandoned or not sender_waits(self.connection)
            time.sleep(timeout + 0.3 - hold if outcome == "stall" else 0)
            status, body = (503, b'{"error": "scripted"}') if outcome == "5xx" else (200, b'{"ok": true}')
            ended = decided()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass
        with lock:
            log.write(json.dumps({"key": key, "n": n, "attempt": attempt, "arrived": arrived, "ended": ended,
                                  "outcome": outcome, "applied": first, "in_flight_with": in_flight,
                                  "gave_up_on": gave_up, "abandoned": abandoned}) + "\\n")
            log.flush()

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
server.daemon_threads = True
server.serve_forever()
"""
# The org's budget (a cap of CAP irreversible calls per run), the undo webhook's timeout, and an
# admin (fleet rollbacks, the approve rule): its token is printed.
SETUP = """
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from budgets.models import BudgetPolicy
from effects.models import CompensationFunction
from orgs.models import Membership, Organization
org = Organization.objects.get(slug="fleet")
BudgetPolicy.objects.create(org=org, max_irreversible_per_run={cap}, on_exceeded="pause")
CompensationFunction.objects.filter(org=org).update(timeout_ms={timeout_ms})
user = get_user_model().objects.create_user("admin-1", password="pw-admin-1")
Membership.objects.create(user=user, org=org, role="admin")
print(Token.objects.create(user=user).key)
"""
# The fleet's tools: TOOLS' two, an irreversible one an approve rule decides at once (the fast
# approval path), and one whose requests nobody decides: they expire.
NEMESIS_TOOLS = [*TOOLS,
                 {"name": "refund", "tier": "irreversible", "approval": {"reason": "Money out", "timeout_s": 600}},
                 {"name": "wire", "tier": "irreversible", "approval": {"reason": "Wires money", "timeout_s": 2}}]


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
        self.seed = 0

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
            return [py, "-c", RECEIVER, "9000", str(self.work / "receiver.jsonl"), str(self.seed),
                    str(FN_TIMEOUT_MS / 1000)]
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
    """Every request and its answer, in the order they completed, as JSON lines. A request still
    waiting for its answer when the run ends (an actor that outlived the run's end) is recorded
    then with status 0, as a broken connection is: it may have been applied, and the checker must
    not take it for one never sent."""

    def __init__(self, path: Path) -> None:
        self.path, self.lock = path, threading.Lock()
        self.file = open(path, "a")  # noqa: SIM115
        self.acks: list[float] = []
        self.waiting: dict[int, dict] = {}
        self.tickets = itertools.count()

    def sent(self, **entry) -> int:
        with self.lock:
            ticket = next(self.tickets)
            self.waiting[ticket] = entry
            return ticket

    def record(self, ticket: int, **answer) -> None:
        with self.lock:
            entry = {**self.waiting.pop(ticket), **answer}
            if self.file.closed:
                return  # recorded unanswered at the close
            self.file.write(json.dumps(entry) + "\n")
            if entry.get("status") in (200, 201, 202):
                self.acks.append(entry["t1"])

    def close(self) -> None:
        with self.lock:
            unanswered = {"transport": "unanswered at the run's end"}
            for entry in self.waiting.values():
                self.file.write(json.dumps({**entry, "status": 0, "answer": unanswered, "t1": time.time()}) + "\n")
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
            ticket = self.history.sent(who=self.who, node=node, method=method, path=path, body=body, t0=t0)
            try:
                answer = self.clients[node].request(method, path, json=body)
                status, data = answer.status_code, _json(answer)
            except httpx.HTTPError as exc:
                status, data = 0, {"transport": type(exc).__name__}
            self.history.record(ticket, status=status, answer=data, t1=time.time())
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


def _together(work, items: list) -> list:
    """work(item) for each item at once, each in a thread of its own (parallel tool calls, as a
    model issues them); what each returned, in order."""
    results: list = [None] * len(items)

    def one(n: int) -> None:
        results[n] = work(items[n])

    threads = [threading.Thread(target=one, args=(n,)) for n in range(len(items))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def agent(n: int, cluster: Cluster, history: History, key: str, stop: threading.Event, seed: int,
          reviewer_token: str) -> None:
    """Runs: batches of compensable calls issued at once (each committed; some sent again as after
    a timeout), then maybe irreversible calls issued at once over the cap of one per run (held for
    the reviewers, who approve, reject or reject and roll back; decided at once by an approve rule;
    or left to expire), then complete or fail (rollback). The run over the cap pauses the agent:
    a person resumes it. The fleet's agent (FLEET_AGENT) runs compensable runs only: an admin
    rolls them all back from time to time."""
    me = Client(f"agent-{n}", cluster, history, f"Bearer {key}", stop)
    person = Client(f"resumer-{n}", cluster, history, f"Token {reviewer_token}", stop)
    rng = random.Random(seed * 1000 + n)
    fleet = f"agent-{n}" == FLEET_AGENT

    def send(method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        for _ in range(3):
            status, data = me.send(method, path, body)
            if status != 423:
                return status, data
            person.send("POST", f"/api/v1/agents/agent-{n}/resume", {"note": "nemesis"})
        return status, data

    def compensable(call: tuple[str, dict, bool]) -> bool:
        session, body, again = call
        status, data = send("POST", f"/api/v1/sessions/{session}/intercept", body)
        if status not in (200, 201):
            return False
        if again:  # the agent timed out and sends the same call again
            send("POST", f"/api/v1/sessions/{session}/intercept", body)
        status, _ = send("POST", f"/api/v1/effects/{data['effect']['id']}/commit",
                         {"result": {"sent": body["args"]["to"]}})
        return status == 200

    def irreversible(call: tuple[str, dict]) -> tuple[int, dict]:
        session, body = call
        return send("POST", f"/api/v1/sessions/{session}/intercept", body)

    try:
        while not stop.is_set():
            status, data = send("POST", "/api/v1/sessions", {})
            if status != 201:
                time.sleep(0.3)
                continue
            session, step = data["id"], 0
            ending = rng.choice(["complete", "fail"] if fleet else
                                ["complete", "complete", "fail", "fail", "held", "held", "rule", "expire"])
            going = True
            for _batch in range(rng.randint(1, 3)):
                calls = []
                for _ in range(rng.randint(1, 3)):
                    step += 1
                    calls.append((session, {"tool": "send_email", "args": {"to": f"{n}-{session[:8]}-{step}@x.io"},
                                            "step_index": step}, rng.random() < 0.3))
                going = all(_together(compensable, calls))
                if not going or stop.is_set():
                    break
                if fleet:  # the model thinks between steps: a fleet rollback lands there too
                    time.sleep(rng.uniform(0.3, 1.0))
            if going and ending in ("held", "rule", "expire"):
                tool = {"held": "delete_account", "rule": "refund", "expire": "wire"}[ending]
                count = 1 if ending == "expire" else rng.randint(2, 3)  # over the cap: one admitted
                calls = []
                for _ in range(count):
                    step += 1
                    args = {"account_id": f"{session[:8]}-{step}"} if tool == "delete_account" else \
                        {"amount": 10, "order": f"{session[:8]}-{step}"}
                    calls.append((session, {"tool": tool, "args": args, "step_index": step}))
                answers = _together(irreversible, calls)
                admitted = [data for status, data in answers if status in (201, 202)]
                effect = admitted[0]["effect"]["id"] if admitted else None
                state = admitted[0]["effect"]["state"] if admitted else None
                until = time.monotonic() + 30
                while effect and state not in ("approved", "rejected", "expired") and time.monotonic() < until \
                        and not stop.is_set():
                    time.sleep(0.5)
                    status, data = me.send("GET", f"/api/v1/effects/{effect}")
                    state = data["effect"]["state"] if status == 200 else state
                if state == "approved":
                    send("POST", f"/api/v1/effects/{effect}/start", {})
                    send("POST", f"/api/v1/effects/{effect}/commit", {"result": {"done": True}})
                going = state == "approved"
                ending = rng.choice(["complete", "fail"])
            if going or ending == "fail":
                verb = "fail" if ending == "fail" else "complete"
                send("POST", f"/api/v1/sessions/{session}/{verb}", {"error": "nemesis"} if verb == "fail" else {})
    finally:
        me.close()
        person.close()


def reviewer(n: int, cluster: Cluster, history: History, token: str, stop: threading.Event, seed: int) -> None:
    """Both reviewers decide every pending request they see but the expiring tool's: they race,
    and only one may win. Mostly approve; some reject, some reject and roll the run back."""
    me = Client(f"reviewer-{n}", cluster, history, f"Token {token}", stop)
    rng = random.Random(seed * 1000 + 100 + n)
    try:
        while not stop.is_set():
            status, data = me.send("GET", "/api/v1/approvals?state=pending", retry=False)
            for item in data.get("approvals", []) if status == 200 else []:
                if item.get("tool") == "wire":
                    continue
                roll = rng.random()
                path = f"/api/v1/approvals/{item['id']}/" + (
                    "approve" if roll < 0.7 else "reject" if roll < 0.85 else "reject?rollback=true")
                me.send("POST", path, {"reason": "nemesis"}, deadline=10)
            time.sleep(0.3)
    finally:
        me.close()


def admin(cluster: Cluster, history: History, token: str, stop: threading.Event, seed: int, since: str) -> None:
    """Rolls back every run of the fleet's agent since the start, every 5-10 s (during the faults)."""
    me = Client("admin", cluster, history, f"Token {token}", stop)
    rng = random.Random(seed * 1000 + 200)
    try:
        while not stop.wait(rng.uniform(5, 10)):
            me.send("POST", f"/api/v1/agents/{FLEET_AGENT}/rollback", {"since": since, "reason": "nemesis"},
                    deadline=10)
    finally:
        me.close()


def duplicator(cluster: Cluster, stop: threading.Event) -> None:
    """The broker's at-least-once delivery, made common: every 0.3 s each run being rolled back
    gets a second walk task (as a redelivered or re-swept task would), so that two workers walk
    one run at once; only the claim may keep them from sending one entry twice."""
    from celery import Celery

    broker = Celery(broker=cluster.redis_url)
    while not stop.wait(0.3):
        try:
            with psycopg.connect(cluster.pg.url(), connect_timeout=2) as db:
                walking = [str(row[0]) for row in db.execute(
                    "SELECT id FROM effects_session WHERE state = 'compensating'").fetchall()]
            for session in walking:
                broker.send_task(WALK_TASK, args=[session])
        except Exception:  # a fault in the way (the primary, Redis): the next round tries again
            continue


def inject(kind: str, role: str, cluster: Cluster, rng: random.Random, hold: float) -> str:
    """One fault, held for `hold` seconds, then healed. Returns what was done."""
    net = cluster.net
    primary = "pg1" if cluster.pg.primary.prefix == net.exec("pg1") else "pg2"
    standby = "pg2" if primary == "pg1" else "pg1"
    node = rng.choice({"web": WEB, "worker": WORKERS}.get(role, [role]))
    if kind == "web-pg":
        net.cut(node, primary)
        time.sleep(hold)
        net.heal(node, primary)
        return f"{node} cut from the primary ({primary}) for {hold:.1f} s"
    if kind in ("worker-redis", "worker-receiver"):
        peer = kind.split("-")[1]
        net.cut(node, peer)
        time.sleep(hold)
        net.heal(node, peer)
        return f"{node} cut from {peer} for {hold:.1f} s"
    if kind == "link-down":
        net.isolate(node)
        time.sleep(hold)
        net.rejoin(node)
        return f"{node}'s link down for {hold:.1f} s"
    if kind == "sigkill":
        cluster.kill(node)
        cluster.start(node)
        if node in WEB:
            cluster.wait_up(node)
        return f"SIGKILL {node}, restarted"
    if kind == "failover":
        # A partition first: the primary cut from its standby (a synchronous one holds every commit
        # meanwhile; an asynchronous one would let the primary acknowledge commits it never gets),
        # then the primary crashes and the standby is promoted.
        net.cut(primary, standby)
        time.sleep(1.5)
        cluster.pg.fail_over()
        net.heal(primary, standby)
        time.sleep(hold)
        cluster.pg.rebuild()
        return f"failover: {primary} cut from {standby} 1.5 s, crashed; {standby} promoted, {primary} rebuilt"
    if kind == "partition":
        # A failover a partition causes: the primary stays up, cut from its standby and from the
        # majority side (a web node, a worker, beat, the ASGI node), still reachable from a
        # minority (the other web node and worker) that keeps using it. The standby is promoted,
        # so for `hold` seconds there are two primaries. The old one can acknowledge no commit
        # (its synchronous standby is gone: each waits), but what it commits without waiting is
        # committed there alone; then it is fenced (crashed, as a failover manager's STONITH),
        # the cuts healed and its host rebuilt as a standby.
        minority = [rng.choice(WEB), rng.choice(WORKERS)]
        majority = [standby, *(n for n in [*WEB, *WORKERS, "beat", "ws"] if n not in minority)]
        for other in majority:
            net.cut(primary, other)
        time.sleep(1.5)
        cluster.pg.promote()
        time.sleep(hold)
        cluster.pg.kill_primary()
        cluster.pg.primary, cluster.pg.standby = cluster.pg.standby, cluster.pg.primary
        for other in majority:
            net.heal(primary, other)
        time.sleep(1)
        cluster.pg.rebuild()
        return (f"partition: {primary} cut from {', '.join(majority)}, still serving {', '.join(minority)}; "
                f"{standby} promoted, both primaries {hold:.1f} s, then {primary} fenced and rebuilt")
    if kind == "sigstop":
        cluster.kill(node, signal.SIGSTOP)
        time.sleep(hold)
        cluster.kill(node, signal.SIGCONT)
        return f"SIGSTOP {node} for {hold:.1f} s"
    if kind == "clock":
        offset = rng.choice([-1, 1]) * rng.randint(30, 90)
        cluster.kill(node)
        cluster.start(node, LD_PRELOAD=FAKETIME, FAKETIME=f"{offset:+d}s", FAKETIME_DONT_FAKE_MONOTONIC="1")
        time.sleep(hold)
        cluster.kill(node)
        cluster.start(node)
        return f"{node}'s clock {offset:+d} s"
    raise ValueError(kind)


def run(seconds: float, work: Path, seed: int, min_faults: int = 0, hold: tuple[float, float] = (2, 4),
        past_lease: tuple[float, float] = (5, 7), gap: tuple[float, float] = (1, 2), out=print) -> dict:
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
        cluster.seed = seed
        for node in ("redis", "receiver"):
            cluster.start(node)
        time.sleep(0.5)
        pg.primary.migrated_database("undolog", cluster.redis_url)
        fleet = create_fleet(pg.url(), cluster.redis_url, AGENTS, f"http://{net.ip('receiver')}:9000/undo")
        env = {**os.environ, "DATABASE_URL": pg.url(), "REDIS_URL": cluster.redis_url, "UNDOLOG_EMBEDDED_REDIS": "0"}
        admin_token = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", SETUP.format(cap=CAP, timeout_ms=FN_TIMEOUT_MS)],
            cwd=BASE_DIR, env=env, check=True, capture_output=True, text=True, timeout=120).stdout.split()[-1]
        for node in ["web1", "web2", "ws", "worker1", "worker2", "beat"]:
            cluster.start(node)
        stack.callback(lambda: [cluster.kill(node, signal.SIGCONT) for node in WORKERS])
        for node in ["web1", "web2", "ws"]:
            cluster.wait_up(node)
        with httpx.Client(base_url=cluster.url("web1"), headers={"Authorization": f"Token {admin_token}"}) as c:
            assert c.post("/api/v1/tools", json={"tools": NEMESIS_TOOLS}).status_code == 200
            rule = {"outcome": "approve", "name": "small-refunds", "tool": "refund", "condition": "args.amount <= 50"}
            created = c.post("/api/v1/rules", json=rule)
            assert created.status_code == 201, created.text

        history = History(work / "history.jsonl")
        stop = threading.Event()
        since = datetime.now(UTC).isoformat()
        tokens = {n: fleet["people"][f"reviewer-{n}"]["token"] for n in (1, 2)}
        actors = [threading.Thread(target=agent, args=(n, cluster, history, fleet["keys"][n], stop, seed, tokens[1]))
                  for n in range(AGENTS)]
        actors += [threading.Thread(target=reviewer, args=(n, cluster, history, tokens[n], stop, seed))
                   for n in (1, 2)]
        actors.append(threading.Thread(target=admin, args=(cluster, history, admin_token, stop, seed, since)))
        actors.append(threading.Thread(target=duplicator, args=(cluster, stop), daemon=True))
        for actor in actors:
            actor.start()
        started = time.monotonic()
        faults: list[dict] = []
        plan: list[tuple[str, str]] = []
        time.sleep(3)
        while time.monotonic() - started < seconds or len(faults) < min_faults:
            if not plan:
                plan = rng.sample(PLAN, len(PLAN))
            kind, role = plan.pop()
            at = time.time()
            what = inject(kind, role, cluster, rng, rng.uniform(*(past_lease if kind in PAST_LEASE else hold)))
            healed = time.time()
            faults.append({"kind": kind, "role": role, "what": what, "at": at, "healed": healed})
            stats.faults[kind] += 1
            out(f"[{time.monotonic() - started:6.1f} s] {what}")
            time.sleep(rng.uniform(*gap))
            after = [t for t in history.acks if t > healed]
            stats.recoveries[kind].append((min(after) - healed) if after else None)
        time.sleep(3)  # the last fault's effects under load too
        stop.set()
        for actor in actors:
            actor.join(timeout=90)
        history.close()
        # Quiet: every walk the faults held up is finished by the workers and the sweeps, and every
        # request nobody decides has expired. Under load the workers may be minutes behind: wait
        # while the backlog shrinks, and give up only once it has not moved for 60 s (then what is
        # left is stuck: the checker names it).
        left, moved, settle_started = _unsettled(pg.url()), time.monotonic(), time.monotonic()
        while left and time.monotonic() - moved < 60 and time.monotonic() - settle_started < 1200:
            time.sleep(2)
            now_left = _unsettled(pg.url())
            if now_left < left:
                moved = time.monotonic()
            left = now_left
        out(f"settled in {time.monotonic() - settle_started:.0f} s ({left} entries or requests left)")
        stall = diagnose(cluster) if left else None
        # Kept beside the history and the receiver's log (with --keep): `python -m
        # tests.faults.checker WORK` judges them again, with the rules as they are then.
        state = checker.read_state(pg.url())
        (work / "state.json").write_text(json.dumps(state, default=str))
        (work / "faults.json").write_text(json.dumps(faults))
        report = checker.judge(checker._load(work / "history.jsonl"), checker._load(work / "receiver.jsonl"), state,
                               faults=faults, **checker_options())
        report["seed"] = seed
        report["attempts"] = _attempts(pg.url())
        report["faults"] = dict(stats.faults)
        report["fault_roles"] = dict(Counter(f"{f['kind']}:{f['role']}" for f in faults))
        report["errors_per_fault"] = errors_per_fault(work / "history.jsonl", faults)
        report["recovery_s"] = {kind: _summary(values) for kind, values in stats.recoveries.items()}
        report["fault_log"] = faults
        if stall is not None:
            report["stall"] = stall
        return report


def checker_options() -> dict:
    return {"irreversible": IRREVERSIBLE, "cap": CAP, "fleet_agent": FLEET_AGENT}


def _attempts(url: str) -> dict:
    """The compensation attempts the database recorded, by outcome: `retry` (the receiver failed
    or could not be reached), `lost` (a claim that ran out: taken over by another worker)."""
    with psycopg.connect(url, connect_timeout=5) as db:
        return dict(db.execute("SELECT outcome, count(*) FROM effects_undoattempt GROUP BY 1").fetchall())


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
    """Undo entries of rolled-back runs not yet compensated, and requests past their deadline not
    yet expired."""
    with psycopg.connect(url, connect_timeout=3) as db:
        return db.execute("""SELECT count(*) FROM effects_undoentry u JOIN effects_session s ON s.id = u.session_id
                             WHERE s.state = ANY(%s) AND u.state IN ('pending', 'running')""",
                          (list(ROLLED_BACK),)).fetchone()[0] + db.execute(
            "SELECT count(*) FROM approvals_approvalrequest WHERE state = 'pending' AND timeout_at < now()"
        ).fetchone()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: NEMESIS_SEED, else random)")
    parser.add_argument("--faults", type=int, default=0, help="at least this many faults, however long it takes")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (history, logs)")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "undolog_site.settings")
    seed = args.seed if args.seed is not None else int(os.environ.get("NEMESIS_SEED") or random.randrange(10**6))
    print(f"nemesis seed {seed} (replay it: NEMESIS_SEED={seed})", flush=True)
    work = Path(tempfile.mkdtemp(prefix="undolog-nemesis-"))
    report = run(args.seconds, work, seed=seed, min_faults=args.faults)
    (work / "report.json").write_text(json.dumps(report, indent=1, default=str))
    print_report(report)
    print(f"history and logs in {work}" if args.keep else "")
    if not args.keep:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    return 1 if report["violations"] else 0


def print_report(report: dict, out=print) -> None:
    out(f"seed {report['seed']}; faults: {sum(report['faults'].values())} {report['fault_roles']}")
    out("recovery (s from heal to the next acknowledged request): " + json.dumps(report["recovery_s"]))
    out(" ".join(f"{k}={report[k]}" for k in (
        "requests", "acknowledged_commits", "executes", "replays", "effects", "sessions", "rollbacks_acknowledged",
        "completions_acknowledged", "fleet_rollbacks", "approvals_decided", "rejections", "expired",
        "refused_over_cap", "deliveries", "compensations_applied", "redeliveries", "redeliveries_after_receiver",
        "redeliveries_after_fault",
        "resent_after_sender_gave_up", "delivered_after_sender_gave_up", "decisions_answer_lost")))
    out(f"receiver answers: {report['deliveries_by_outcome']}; attempts recorded: {report['attempts']}")
    out(f"statuses: {report['statuses']}")
    out("unserved answers (503, broken connections) per fault kind: " + json.dumps(report.get("errors_per_fault")))
    out(f"violations: {len(report['violations'])} {dict(Counter(v['rule'] for v in report['violations']))}")
    if "stall" in report:
        out("stall: " + json.dumps(report["stall"], default=str)[:6000])
    shown: Counter[str] = Counter()
    for violation in report["violations"]:  # up to five of each rule, each with its evidence
        shown[violation["rule"]] += 1
        if shown[violation["rule"]] <= 5:
            out(f"  {violation['rule']}: {json.dumps(violation['evidence'], default=str)[:1500]}")


if __name__ == "__main__":
    sys.exit(main())
