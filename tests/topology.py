"""The production topology on one machine, for the multi-node test and the soak (bench/soak.py):
two gunicorn web nodes, one ASGI node for websockets, two Celery workers, one beat, against one
PostgreSQL and one Redis; and the org, agents and reviewer they serve, made in one
`manage.py shell` (a child process: the database is the topology's, not the test's)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import websockets

from tests.processes import BASE_DIR, PIDS, asgi_server, celery_beat, celery_worker, wsgi_server

# Brisk sweeps, so a killed worker's walk is taken over within seconds (production: 5 s and 30 s).
BRISK = {"UNDOLOG_UNDO_SWEEP_S": "1", "UNDOLOG_UNDO_STALL_S": "3", "DB_POOL_MAX": "20"}


@dataclass
class Topology:
    web: list[str]  # the two gunicorn nodes' URLs (a load balancer's upstreams for everything but /ws/)
    asgi: str  # the ASGI node's URL (the load balancer's upstream for /ws/)
    workers: list[subprocess.Popen]
    beat: subprocess.Popen

    @property
    def web_pids(self) -> list[int]:
        return [PIDS[base] for base in self.web]

    @property
    def asgi_pid(self) -> int:
        return PIDS[self.asgi]


@contextmanager
def topology(database_url: str, redis_url: str, *, web_workers: int = 2, **env: str):
    env = {"DATABASE_URL": database_url, "REDIS_URL": redis_url, **BRISK, **env}
    with ExitStack() as stack:
        web = [stack.enter_context(wsgi_server(workers=web_workers, threads=8, **env)) for _ in range(2)]
        asgi = stack.enter_context(asgi_server(**env))
        workers = [stack.enter_context(celery_worker(concurrency=2, **env)) for _ in range(2)]
        beat = stack.enter_context(celery_beat(**env))
        yield Topology(web=web, asgi=asgi, workers=workers, beat=beat)


SETUP = """
import json
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, BACKEND_SESSION_KEY
from rest_framework.authtoken.models import Token
from effects.models import CompensationFunction
from orgs.models import Agent, AgentKey, Membership, Organization
n, target = {n}, {target!r}
org = Organization.objects.create(slug="fleet", name="Fleet", rate_limit_per_key={per_key},
                                  rate_limit_per_org={per_org})
keys = []
for i in range(n):
    agent = Agent.objects.create(org=org, name=f"agent-{{i}}")
    keys.append(AgentKey.issue(agent)[1])
CompensationFunction.objects.create(org=org, fn_name="undo_send_email", fn_version="1.0.0", handler="webhook",
                                    target=target, timeout_ms=5000)
people = {{}}
for name in ("reviewer-1", "reviewer-2"):
    user = get_user_model().objects.create_user(name, password="pw-" + name)
    Membership.objects.create(user=user, org=org, role="reviewer")
    session = SessionStore()
    session[SESSION_KEY], session[BACKEND_SESSION_KEY] = str(user.pk), "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    people[name] = {{"token": Token.objects.create(user=user).key, "session": session.session_key}}
print(json.dumps({{"keys": keys, "people": people, "secret": org.webhook_secret}}))
"""


def create_fleet(database_url: str, redis_url: str, agents: int, target: str, per_key: int = 1_000_000,
                 per_org: int = 1_000_000) -> dict:
    """An org `fleet` with `agents` agents (a key each), the undo webhook at `target`, and two
    reviewers (an API token and a logged-in session each, for the dashboard's websocket). Its rate
    limits are far above the load by default: every request still pays the limiter's round trip."""
    env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url, "UNDOLOG_EMBEDDED_REDIS": "0"}
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", SETUP.format(
        n=agents, target=target, per_key=per_key, per_org=per_org)],
                         cwd=BASE_DIR, env=env, check=True, capture_output=True, text=True, timeout=120).stdout
    return json.loads(out.strip().splitlines()[-1])


TOOLS = [
    {"name": "send_email", "tier": "compensable",
     "compensation": {"fn_name": "undo_send_email", "fn_version": "1.0.0", "args": {"to": "{to}"},
                      "max_retries": 5, "retry_backoff_ms": 200}},
    {"name": "delete_account", "tier": "irreversible",
     "approval": {"reason": "Deletes an account for good", "risk_tags": ["data-loss"], "timeout_s": 600}},
]


class Dashboard:
    """A reviewer's open dashboard page: its websocket on an ASGI node, in a thread of its own.
    Like live.js, it connects again when the socket drops (a Redis outage closes it), and counts
    the connections (`hellos`) and the decisions pushed to it."""

    def __init__(self, asgi: str, session_cookie: str) -> None:
        self.url = asgi.replace("http://", "ws://") + "/ws/dashboard/"
        self.headers = {"Cookie": f"sessionid={session_cookie}", "Origin": asgi}
        self.decided: set[str] = set()
        self.hellos = 0
        self.connected = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        while not self.stop.is_set():
            try:
                async with websockets.connect(self.url, additional_headers=self.headers, open_timeout=5) as socket:
                    await self._listen(socket)
            except (OSError, websockets.WebSocketException, TimeoutError):
                self.connected.clear()
                await asyncio.sleep(0.5)

    async def _listen(self, socket) -> None:
        while not self.stop.is_set():
            try:
                message = json.loads(await asyncio.wait_for(socket.recv(), 0.5))
            except TimeoutError:
                continue
            if message["type"] == "hello":
                self.hellos += 1
                self.connected.set()
            elif message["type"] == "approval.decided":
                payload = message["payload"]
                self.decided.add((payload.get("approval") or payload["data"]["approval"])["id"])
