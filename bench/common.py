"""What the benchmarks share: the bench database, server processes, load and memory readings."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

BASE_DIR = Path(__file__).resolve().parent.parent


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    _fresh_database()
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _fresh_database() -> None:
    """Every run starts from an empty database, so runs are comparable."""
    import psycopg

    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/undolog_bench")
    name = url.rsplit("/", 1)[1]
    if not name.startswith("undolog_bench"):
        raise SystemExit(f"refusing to recreate {name!r}: the bench database's name must start with undolog_bench")
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


@dataclass
class BenchOrg:
    org: object
    agent: object
    key: str
    send: object  # the compensable tool `send_email`, undone by a webhook


def bench_org(slug: str, *, all_tiers: bool = False) -> BenchOrg:
    """A fresh org with an agent, its key, the compensable `send_email` and the one-INSERT
    baseline's table; with `all_tiers`, an irreversible `delete_account` and a SAFE `list_accounts`."""
    from django.db import connection

    from effects.models import CompensationFunction, Tool
    from orgs.models import Agent, AgentKey, Organization

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_baseline (id bigserial PRIMARY KEY, created timestamptz)")
    # Rate limits far above what one machine serves: every request still pays the limiter's Redis
    # round trip (measured against UNDOLOG_RATE_LIMITS=0), none is refused.
    org = Organization.objects.create(slug=slug, name=slug, rate_limit_per_key=10**9, rate_limit_per_org=10**9)
    agent = Agent.objects.create(org=org, name="bench-agent")
    _, key = AgentKey.issue(agent)
    fn = CompensationFunction.objects.create(org=org, fn_name="undo_send_email", fn_version="1.0.0",
                                             handler="webhook", target="http://127.0.0.1:9/undo")
    send = Tool.objects.create(org=org, name="send_email", tier="compensable", compensation_fn=fn,
                               compensation_args={"to": "{to}"})
    if all_tiers:
        Tool.objects.create(org=org, name="delete_account", tier="irreversible", approval_reason="For good")
        Tool.objects.create(org=org, name="list_accounts", tier="safe", cost_weight="0.01")
        decided_at_once(org, agent)
    return BenchOrg(org, agent, key, send)


def decided_at_once(org, agent) -> None:
    """Irreversible tools decided at the intercept (issue 26): `refund`, which the approve rule
    `small` decides up to an amount of 50, and `archive_account`, granted to the agent for a day."""
    from datetime import timedelta

    from django.utils import timezone

    from approvals.models import Grant, Rule
    from effects.models import Tool

    Tool.objects.create(org=org, name="refund", tier="irreversible", approval_reason="Money leaves")
    Tool.objects.create(org=org, name="archive_account", tier="irreversible", approval_reason="For good")
    Rule.add(org, {"name": "small", "condition": "args.amount <= 50", "outcome": "approve",
                   "message": "small refunds are fine"}, "bench")
    Grant.objects.create(org=org, agent=agent, tool_name="archive_account", created_by_label="bench",
                         expires_at=timezone.now() + timedelta(days=1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


GTHREADS = 8  # threads per gthread worker
SERVERS = {
    # The README's recommended deployment is whichever of these wins.
    "gunicorn (WSGI)": lambda port, workers: [
        sys.executable, "-m", "gunicorn", "bench.wsgi:application", "-b", f"127.0.0.1:{port}",
        "-w", str(workers), "-k", "gthread", "--threads", str(GTHREADS), "--log-level", "warning"],
    # Sync workers, as the hot-path benchmark deploys /api/ (bench/throughput.py).
    "gunicorn (sync)": lambda port, workers: [
        sys.executable, "-m", "gunicorn", "bench.wsgi:application", "-b", f"127.0.0.1:{port}",
        "-w", str(workers), "--log-level", "warning", "--backlog", "512"],
    "uvicorn (ASGI)": lambda port, workers: [
        sys.executable, "-m", "uvicorn", "bench.asgi:application", "--host", "127.0.0.1", "--port", str(port),
        "--workers", str(workers), "--no-access-log", "--log-level", "warning"],
}


class Server:
    def __init__(self, kind: str, workers: int = 2) -> None:
        self.kind, self.port = kind, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings"}
        self.process = subprocess.Popen(SERVERS[kind](self.port, workers), cwd=BASE_DIR, env=env,
                                        start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"{kind} did not start")
            time.sleep(0.2)

    def peak_rss_mb(self) -> float:
        return peak_rss_mb(self.process.pid)

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=20)


def peak_rss_mb(pid: int) -> float:
    """Sum of the peak resident sets (VmHWM) of a process and its children."""
    import psutil

    total = 0
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for proc in procs:
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


@dataclass
class LoadResult:
    count: int
    seconds: float
    latencies_ms: list[float]
    errors: int

    @property
    def rate(self) -> float:
        return self.count / self.seconds

    def pct(self, p: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies_ms) if self.latencies_ms else float("nan")


async def _load(make_op: Callable[[httpx.AsyncClient, int], Callable[[], Awaitable[bool]]],
                clients: int, seconds: float, base: str, headers: dict) -> LoadResult:
    latencies: list[float] = []
    errors = 0
    stop_at = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits, timeout=30) as client:
        async def worker(n: int) -> None:
            nonlocal errors
            op = make_op(client, n)
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                ok = await op()
                if ok:
                    latencies.append((time.perf_counter() - started) * 1000)
                else:
                    errors += 1

        started = time.monotonic()
        await asyncio.gather(*(worker(n) for n in range(clients)))
        elapsed = time.monotonic() - started
    return LoadResult(len(latencies), elapsed, latencies, errors)


def load(make_op, *, clients: int, seconds: float, base: str, headers: dict | None = None) -> LoadResult:
    return asyncio.run(_load(make_op, clients, seconds, base, headers or {}))
