"""`make container-test`: the image and deploy/compose.yaml, end to end, as an operator runs them.

1. Brings the compose topology up under a project name of its own (PostgreSQL, Redis, migrate,
   two web, one ws, two workers, one beat, the proxy) with production settings (DEBUG=0), the
   proxy on a free port of 127.0.0.1; PostgreSQL and Redis only on the project's own network.
2. Waits until migrate has exited 0 and every server's HEALTHCHECK passes (podman runs none by
   itself without systemd, so they are run here): the cold start to healthy.
3. Plays the story through the proxy only: an agent registers an undo webhook and two tools,
   intercepts and commits compensable calls; an irreversible call waits while a reviewer's
   dashboard websocket (via /ws/) sees the request and the reviewer approves it over the API; the
   agent starts and commits it. Then RUNS runs fail at once, and one worker container is killed
   (SIGKILL) while their walks run: every compensation still reaches the receiver once (it
   dedupes redeliveries by Idempotency-Key, as a careful receiver does), every undo entry ends
   compensated, every run compensated.
4. Brings everything down (containers, network, volumes), also when a step failed or on Ctrl-C.

The receiver is a real HTTP server on this machine, on the project network's gateway address,
verifying each delivery's Undolog-Signature. Prints each phase's duration."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import websockets

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "deploy" / "compose.yaml"
PROJECT = f"ulct{os.getpid()}"
RUNS, CALLS = 4, 12  # failed runs walked back while a worker is killed; compensable calls in each
DELAY_S = 0.15  # the receiver's time per undo: the walks last a few seconds, long enough to kill into
HEALTHY_WITHIN_S = 480  # the machine is shared: under load the first start is slow
started = time.monotonic()


def log(message: str) -> None:
    print(f"[container-test {time.monotonic() - started:6.1f} s] {message}", flush=True)


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check, timeout=timeout)


def compose(env: dict[str, str], *args: str, timeout: float = 600) -> None:
    out = subprocess.run(["podman-compose", "-p", PROJECT, "-f", str(COMPOSE), *args], env=env,
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"podman-compose {' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def image_or_standin(official: str, standin: str) -> str:
    """The official image where it is here or a registry answers, else the Debian stand-in."""
    if podman("image", "exists", official, check=False).returncode == 0:
        return official
    if subprocess.run(["timeout", "30", "podman", "pull", "-q", official], capture_output=True).returncode == 0:
        return official
    return standin


class Receiver:
    """The undo webhook's receiver: verifies the signature, applies each Idempotency-Key once."""

    def __init__(self, host: str, secret: str = "") -> None:
        self.secret = secret
        self.lock = threading.Lock()
        self.applied: dict[str, dict] = {}
        self.duplicates = 0
        self.unverified = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                time.sleep(DELAY_S)
                key = self.headers.get("Idempotency-Key", "")
                with receiver.lock:
                    if not receiver.verified(self.headers.get("Undolog-Signature", ""), raw):
                        receiver.unverified += 1
                    elif key in receiver.applied:
                        receiver.duplicates += 1
                    else:
                        receiver.applied[key] = json.loads(raw)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://{host}:{self.server.server_address[1]}/undo"

    def verified(self, header: str, raw: bytes) -> bool:
        parts = dict(item.split("=", 1) for item in header.split(",") if "=" in item)
        expected = hmac.new(self.secret.encode(), f"{parts.get('t', '')}.".encode() + raw, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, parts.get("v1", ""))

    def count(self) -> int:
        with self.lock:
            return len(self.applied)


class Dashboard:
    """A reviewer's dashboard page: its websocket through the proxy's /ws/, in a thread."""

    def __init__(self, base: str, cookie: str) -> None:
        self.url = base.replace("http://", "ws://") + "/ws/dashboard/"
        self.headers = {"Cookie": f"sessionid={cookie}", "Origin": base}
        self.seen: list[dict] = []
        self.drops = 0
        self.connected = threading.Event()
        self.stop = threading.Event()
        threading.Thread(target=lambda: asyncio.run(self.run()), daemon=True).start()

    async def run(self) -> None:
        # Like live.js, it connects again if the socket drops (counted: `drops`).
        while not self.stop.is_set():
            try:
                async with websockets.connect(self.url, additional_headers=self.headers, open_timeout=10) as socket_:
                    while not self.stop.is_set():
                        try:
                            message = json.loads(await asyncio.wait_for(socket_.recv(), 0.5))
                        except TimeoutError:
                            continue
                        if message["type"] == "hello":
                            self.connected.set()
                        self.seen.append(message)
            except (OSError, websockets.WebSocketException, TimeoutError) as exc:
                self.drops += 1
                log(f"the dashboard's websocket dropped: {exc!r}")
                await asyncio.sleep(0.5)

    def saw(self, kind: str, approval_id: str) -> bool:
        return any(m["type"] == kind and approval_id in json.dumps(m["payload"]) for m in list(self.seen))


def eventually(check, timeout: float, what: str, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


_said_at = [0.0]


def migrate_finished(since: float) -> bool:
    """Whether the one-shot migrate has ended; every minute until then, what each container is doing
    (a start that hangs shows here as containers still `created`, with nothing in their logs)."""
    if state_of(container("migrate"))["Status"] in ("exited", "stopped"):
        return True
    if time.monotonic() - _said_at[0] > 60:
        _said_at[0] = time.monotonic()
        states = podman("ps", "-a", "--format", "{{.Names}}={{.Status}}", "--filter",
                        f"label=io.podman.compose.project={PROJECT}", check=False).stdout.split("\n")
        log(f"{time.monotonic() - since:.0f} s after up, migrate still running: {', '.join(filter(None, states))}")
    return False


def container(service: str, n: int = 1) -> str:
    return f"{PROJECT}_{service}_{n}"


def state_of(name: str) -> dict:
    return json.loads(podman("inspect", name, "--format", "{{json .State}}").stdout)


SETUP = """
import json
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.db import SessionStore
from rest_framework.authtoken.models import Token
from orgs.models import Agent, AgentKey, Membership, Organization
org = Organization.objects.create(slug="story", name="Story")
agent = Agent.objects.create(org=org, name="story-agent")
user = get_user_model().objects.create_user("reviewer", password="pw-" + "x" * 20)
Membership.objects.create(user=user, org=org, role="reviewer")
session = SessionStore()
session[SESSION_KEY], session[BACKEND_SESSION_KEY] = str(user.pk), "django.contrib.auth.backends.ModelBackend"
session[HASH_SESSION_KEY] = user.get_session_auth_hash()
session.create()
print(json.dumps({"key": AgentKey.issue(agent)[1], "token": Token.objects.create(user=user).key,
                  "session": session.session_key, "secret": org.webhook_secret}))
"""

TOOLS = [
    {"name": "send_email", "tier": "compensable",
     "compensation": {"fn_name": "undo_send_email", "fn_version": "1.0.0", "args": {"to": "{to}"},
                      "max_retries": 5, "retry_backoff_ms": 200}},
    {"name": "delete_account", "tier": "irreversible",
     "approval": {"reason": "Deletes an account for good", "risk_tags": ["data-loss"], "timeout_s": 600}},
]


def story(base: str, fleet: dict, receiver: Receiver) -> None:
    agent = httpx.Client(base_url=base + "/api/v1", headers={"Authorization": f"Bearer {fleet['key']}"}, timeout=70)
    reviewer = httpx.Client(base_url=base + "/api/v1", headers={"Authorization": f"Token {fleet['token']}"},
                            timeout=30)
    answer = agent.post("/compensations", json={"fn_name": "undo_send_email", "fn_version": "1.0.0",
                                                "handler": "webhook", "target": receiver.url, "timeout_ms": 5000})
    assert answer.status_code in (200, 201), answer.text
    assert agent.post("/tools", json={"tools": TOOLS}).status_code == 200

    dashboard = Dashboard(base, fleet["session"])
    assert dashboard.connected.wait(20), "the dashboard's websocket said hello through the proxy's /ws/"

    # One run: two compensable calls committed, then an irreversible one a reviewer approves.
    run = agent.post("/sessions", json={}).json()["id"]
    for step in (1, 2):
        answer = agent.post(f"/sessions/{run}/intercept", json={
            "tool": "send_email", "args": {"to": f"a{step}@x.io"}, "step_index": step})
        assert answer.status_code == 201 and answer.json()["decision"] == "execute", answer.text
        assert agent.post(f"/effects/{answer.json()['effect']['id']}/commit",
                          json={"result": {"id": step}}).status_code == 200
    held = agent.post(f"/sessions/{run}/intercept", json={
        "tool": "delete_account", "args": {"account_id": "acct-1"}, "step_index": 3, "reasoning": "inactive"})
    assert held.status_code == 202 and held.json()["decision"] == "await_approval", held.text
    effect = held.json()["effect"]["id"]
    pending = eventually(lambda: reviewer.get("/approvals", params={"state": "pending"}).json()["approvals"],
                         20, "the pending approval")
    approval = pending[0]["id"]
    eventually(lambda: dashboard.saw("approval.requested", approval), 20, "approval.requested on the websocket")
    waiting: dict = {}
    poll = threading.Thread(target=lambda: waiting.update(agent.get(f"/effects/{effect}", params={"wait": 30}).json()))
    poll.start()  # the agent long-polls through the proxy while the reviewer decides
    time.sleep(0.5)
    answer = reviewer.post(f"/approvals/{approval}/approve", json={"reason": "checked"})
    assert answer.status_code == 200, answer.text
    poll.join(40)
    assert waiting["effect"]["state"] == "approved", waiting
    assert agent.post(f"/effects/{effect}/start", json={}).status_code == 200
    assert agent.post(f"/effects/{effect}/commit", json={"result": {"deleted": True}}).status_code == 200
    assert agent.post(f"/sessions/{run}/complete", json={}).status_code == 200
    eventually(lambda: dashboard.saw("approval.decided", approval), 20, "approval.decided on the websocket")
    log("story: intercept, commit, an irreversible call approved over the API while the websocket saw it"
        f" (socket drops so far: {dashboard.drops})")

    # RUNS runs fail; one worker is killed while their walks run.
    failed = []
    for r in range(RUNS):
        run = agent.post("/sessions", json={}).json()["id"]
        for step in range(1, CALLS + 1):
            effect = agent.post(f"/sessions/{run}/intercept", json={
                "tool": "send_email", "args": {"to": f"r{r}-{step}@x.io"}, "step_index": step}).json()["effect"]["id"]
            assert agent.post(f"/effects/{effect}/commit", json={"result": {}}).status_code == 200
        failed.append(run)
    for run in failed:
        assert agent.post(f"/sessions/{run}/fail", json={"error": "the agent crashed"}).status_code == 200
    expected = RUNS * CALLS
    eventually(lambda: receiver.count() >= 4, 60, "the first compensations")
    podman("kill", "--signal", "KILL", container("worker", 1))
    at_kill = receiver.count()
    log(f"killed {container('worker', 1)} with SIGKILL after {at_kill} of {expected} compensations")
    assert at_kill < expected, "the worker was killed mid-walk"
    eventually(lambda: receiver.count() >= expected, 120, f"all {expected} compensations")
    time.sleep(2)  # anything sent twice would arrive now
    for run in failed:
        detail = agent.get(f"/sessions/{run}").json()
        assert detail["state"] == "compensated", detail["state"]
        states = {entry["state"] for entry in detail["undo_stack"]}
        assert states == {"compensated"}, states
    assert receiver.count() == expected and receiver.unverified == 0, (receiver.count(), receiver.unverified)
    recipients = sorted(body["args"]["to"] for body in receiver.applied.values())
    assert recipients == sorted(f"r{r}-{s}@x.io" for r in range(RUNS) for s in range(1, CALLS + 1)), recipients
    log(f"walks: {expected} compensations applied once each through a worker kill "
        f"({receiver.duplicates} redeliveries deduped by the receiver)")
    dashboard.stop.set()
    log(f"the dashboard's websocket dropped {dashboard.drops} times in all")


def main() -> int:
    if not shutil.which("podman-compose"):
        subprocess.run([str(ROOT / "deploy" / "podman-setup.sh")], check=True)
    port = int(os.environ.get("UNDOLOG_HTTP_PORT") or free_port())
    base = f"http://127.0.0.1:{port}"
    workdir = Path(tempfile.mkdtemp(prefix="undolog-ct-"))
    env_file = workdir / "undolog.env"
    password = secrets.token_urlsafe(16)
    env_file.write_text("\n".join([
        "POSTGRES_USER=undolog", "POSTGRES_DB=undolog", f"POSTGRES_PASSWORD={password}",
        f"DATABASE_URL=postgres://undolog:{password}@postgres:5432/undolog", "REDIS_URL=redis://redis:6379/0",
        "DEBUG=0", f"SECRET_KEY={secrets.token_urlsafe(50)}", f"UNDOLOG_SEAL_KEY={secrets.token_urlsafe(32)}",
        "ALLOWED_HOSTS=127.0.0.1,localhost",
        f"CSRF_TRUSTED_ORIGINS={base}", "SECURE_SSL_REDIRECT=0", "UNDOLOG_TRUSTED_PROXIES=1",
        "UNDOLOG_ARCHIVE_DIR=/var/lib/undolog-archive", "WEB_CONCURRENCY=2",
        # The receiver is on this machine's address on the project network: a private address.
        "UNDOLOG_ALLOW_PRIVATE_WEBHOOKS=1",
        # Brisk sweeps, so the killed worker's walk is taken over in seconds (production: 5 s, 30 s).
        "UNDOLOG_UNDO_SWEEP_S=1", "UNDOLOG_UNDO_STALL_S=3", ""]))
    env = {**os.environ, "UNDOLOG_ENV_FILE": str(env_file), "UNDOLOG_HTTP_PORT": str(port),
           "UNDOLOG_IMAGE": os.environ.get("IMAGE", "localhost/undolog:latest")}
    env["POSTGRES_IMAGE"] = image_or_standin("docker.io/library/postgres:15-bookworm",
                                             "localhost/undolog-standin-postgres:latest")
    env["REDIS_IMAGE"] = image_or_standin("docker.io/library/redis:7-bookworm",
                                          "localhost/undolog-standin-redis:latest")
    if "standin" in env["POSTGRES_IMAGE"] + env["REDIS_IMAGE"]:
        subprocess.run([str(ROOT / "deploy" / "services.sh")], check=True, capture_output=True)

    def down(*_args) -> None:
        log("bringing everything down")
        subprocess.run(["podman-compose", "-p", PROJECT, "-f", str(COMPOSE), "down", "-v", "-t", "30"],
                       env=env, capture_output=True, timeout=300)
        # Whatever compose left behind (a failed `up` half way): by the project's label only.
        ids = podman("ps", "-aq", "--filter", f"label=io.podman.compose.project={PROJECT}", check=False).stdout.split()
        if ids:
            podman("rm", "-f", "-t", "5", *ids, check=False)
        for volume in podman("volume", "ls", "-q", "--filter", f"label=io.podman.compose.project={PROJECT}",
                             check=False).stdout.split():
            podman("volume", "rm", "-f", volume, check=False)
        podman("network", "rm", "-f", f"{PROJECT}_default", check=False)
        shutil.rmtree(workdir, ignore_errors=True)

    def interrupted(signum, _frame) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    ok = False
    try:
        log(f"compose up: project {PROJECT}, proxy on {base}, {env['POSTGRES_IMAGE']}, {env['REDIS_IMAGE']}")
        up_at = time.monotonic()
        compose(env, "up", "-d")
        # Podman without systemd may leave an exited container "stopped" until its cleanup runs.
        eventually(lambda: migrate_finished(up_at), HEALTHY_WITHIN_S, "migrate to finish")
        assert state_of(container("migrate"))["ExitCode"] == 0, podman("logs", container("migrate")).stderr[-3000:]
        servers = [container("web", 1), container("web", 2), container("ws"), container("proxy"),
                   container("worker", 1), container("worker", 2), container("beat")]
        for name in servers:
            eventually(lambda n=name: podman("healthcheck", "run", n, check=False, timeout=60).returncode == 0,
                       HEALTHY_WITHIN_S - (time.monotonic() - up_at), f"{name} to be healthy", every=1)
        cold = time.monotonic() - up_at
        log(f"cold start: compose up to every server healthy in {cold:.1f} s")
        answer = httpx.get(base + "/healthz", timeout=10)
        assert answer.status_code == 200 and answer.json()["status"] == "ok", answer.text
        assert httpx.get(base + "/accounts/login/", timeout=10).status_code == 200  # the dashboard's door
        assert httpx.get(base + "/static/admin/css/base.css", timeout=10).status_code == 200  # collected at build

        gateway = podman("network", "inspect", f"{PROJECT}_default", "--format",
                         "{{range .Subnets}}{{.Gateway}}{{end}}").stdout.strip()
        out = podman("exec", container("web", 1), "python", "manage.py", "shell", "-c", SETUP).stdout
        fleet = json.loads(out.strip().splitlines()[-1])
        receiver = Receiver(gateway, fleet["secret"])
        story(base, fleet, receiver)
        ok = True
    except BaseException as exc:
        log(f"FAILED: {exc!r}")
        for name in podman("ps", "-a", "--format", "{{.Names}}", "--filter",
                           f"label=io.podman.compose.project={PROJECT}", check=False).stdout.split():
            logs = podman("logs", "--tail", "25", name, check=False)
            state = podman("inspect", name, "--format", "{{.State.Status}}, exit code {{.State.ExitCode}}",
                           check=False).stdout.strip()
            print(f"--- {name} ({state})\n{logs.stdout[-2500:]}{logs.stderr[-2500:]}", flush=True)
        raise
    finally:
        down()
        leftovers = podman("ps", "-aq", "--filter", f"label=io.podman.compose.project={PROJECT}", check=False).stdout
        log(f"{'passed' if ok else 'failed'}; containers left: {len(leftovers.split())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
