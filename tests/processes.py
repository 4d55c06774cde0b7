"""Real processes for end-to-end tests: a Celery worker (optionally with beat) and the ASGI
server, pointed at the test database and the test Redis. Use with transactional tests
(`@pytest.mark.django_db(transaction=True)`), so what the test writes is committed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
from django.conf import settings
from django.db import connection

BASE_DIR = Path(__file__).resolve().parent.parent


def test_database_url() -> str:
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{Path(db['NAME']).resolve()}"
    user = db.get("USER") or ""
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    return f"postgres://{auth}{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "DATABASE_URL": test_database_url(), "REDIS_URL": settings.REDIS_URL,
           "UNDOLOG_EMBEDDED_REDIS": "0", "PYTHONUNBUFFERED": "1"}
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(process: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        os.killpg(process.pid, sig)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def celery_worker(*, beat: bool = False, concurrency: int = 2, log: Path | None = None, **env: str):
    """A real `celery worker` against the real broker; yields the Popen (kill it to test crashes)."""
    args = ["worker", "--concurrency", str(concurrency), "--pool", "prefork", "--without-gossip", "--without-mingle",
            "--hostname", f"test-{os.getpid()}-{time.monotonic_ns()}@%h"]
    if beat:
        args += ["-B", "--schedule", str(Path(settings.VAR_DIR) / f"test-beat-{os.getpid()}")]
    with _celery(args, log or Path(settings.VAR_DIR) / f"test-worker-{os.getpid()}.log", "ready", env) as process:
        yield process


@contextmanager
def celery_beat(*, log: Path | None = None, **env: str):
    """`celery beat` on its own (production: exactly one, beside any number of workers)."""
    schedule = Path(settings.VAR_DIR) / f"test-beat-schedule-{os.getpid()}-{time.monotonic_ns()}"
    log_path = log or Path(settings.VAR_DIR) / f"test-beat-{os.getpid()}-{time.monotonic_ns()}.log"
    # Its banner: beat logs its own lines at DEBUG (LOG_LEVEL), so "beat: Starting" may never show.
    with _celery(["beat", "--schedule", str(schedule)], log_path, "is starting.", env) as process:
        yield process


@contextmanager
def _celery(args: list[str], log_path: Path, ready: str, env: dict[str, str]):
    """`celery -A undolog_site <args>` in its own process group, logging to `log_path`, once `ready` shows."""
    with open(log_path, "ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "celery", "-A", "undolog_site", *args, "--loglevel", "INFO"],
                                   cwd=BASE_DIR, env=child_env(**env), stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        _wait_for_log(log_path, ready, process)
        yield process
    finally:
        _stop(process)


def _wait_for_log(path: Path, marker: str, process: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited early; see {path}:\n{path.read_text()[-3000:]}")
        if marker in path.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise RuntimeError(f"process not ready after {timeout}s; see {path}")


@contextmanager
def asgi_server(**env: str):
    """The real ASGI app under uvicorn; yields its base URL."""
    port = free_port()
    with _web_server("asgi", [sys.executable, "-m", "uvicorn", "undolog_site.asgi:application", "--host",
                              "127.0.0.1", "--port", str(port), "--no-access-log"], port, env) as base:
        yield base


@contextmanager
def wsgi_server(workers: int = 2, threads: int = 0, **env: str):
    """The WSGI app under gunicorn with several worker processes (the production shape for /api/):
    each has its own caches, so a test can prove that a change reaches every one. `threads`: gthread
    workers with that many threads each (as the README deploys it: long polls do not hold a process).
    Yields its URL."""
    port = free_port()
    command = [sys.executable, "-m", "gunicorn", "undolog_site.wsgi:application", "-b", f"127.0.0.1:{port}",
               "-w", str(workers), "--log-level", "warning"]
    if threads:
        # Keep-alive longer than any client stays idle (as behind a load balancer, whose idle timeout
        # must be the shorter): gthread's default of 2 s closes connections a client is about to
        # reuse, and a POST sent into that close is a connection reset.
        command += ["-k", "gthread", "--threads", str(threads), "--keep-alive", "75"]
    with _web_server("wsgi", command, port, env) as base:
        yield base


# A running web server's URL → the pid of its process (group leader): for the soak's memory readings.
PIDS: dict[str, int] = {}


@contextmanager
def _web_server(kind: str, command: list[str], port: int, env: dict[str, str]):
    """Start a web server process, wait until /healthz answers, yield its URL, stop it."""
    log_path = Path(settings.VAR_DIR) / f"test-{kind}-{os.getpid()}.log"
    with open(log_path, "ab") as out:
        process = subprocess.Popen(command, cwd=BASE_DIR, env=child_env(**env), stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code in (200, 503):
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {kind} server did not start; see {log_path}")
            time.sleep(0.1)
        PIDS[base] = process.pid
        yield base
    finally:
        PIDS.pop(base, None)
        _stop(process)
