"""`make run`: the embedded Redis (unless REDIS_URL is set), the ASGI server, `WORKERS` Celery
workers (1 by default) and Celery beat, as one foreground command. Ctrl-C stops them all.

`make worker` (`python -m undolog_site.launcher worker`) attaches one more worker to a running
`make run` of the same checkout and database: it finds the embedded Redis's socket as the launcher
named it (`embedded_redis.socket_for`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from undolog_site import embedded_redis

BASE_DIR = Path(__file__).resolve().parent.parent


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "undolog_site.settings")
    workers = _worker_count()
    var = Path(os.environ.get("UNDOLOG_VAR_DIR", BASE_DIR / "var"))
    database_url = os.environ.get("DATABASE_URL", "")
    # One launcher per var dir and database: a second would share its Redis and its beat.
    try:
        held = embedded_redis.hold(var, database_url)  # noqa: F841 (held until this process ends)
    except embedded_redis.AlreadyServed as exc:
        print(f"undolog: {exc}", file=sys.stderr, flush=True)
        return 2
    instance = embedded_redis.instance_suffix(database_url)
    redis_process = None
    if "REDIS_URL" not in os.environ:
        socket_path = embedded_redis.socket_for(var, database_url)
        # We hold the socket: a server answering on it is an orphan of a launcher that was killed.
        redis_process = embedded_redis.start(socket_path, reap=True)
        os.environ["REDIS_URL"] = f"unix://{socket_path}"
    port = os.environ.get("PORT", "8000")
    host = os.environ.get("HOST", "127.0.0.1")
    # A restart counts from zero: counters of processes that are gone would otherwise add up forever.
    metrics_dir = Path(os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(var / f"metrics{instance}")))
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir(parents=True, exist_ok=True)
    children = [
        subprocess.Popen([sys.executable, "-m", "uvicorn", "undolog_site.asgi:application",
                          "--host", host, "--port", port, "--no-access-log", "--log-level", "warning"], cwd=BASE_DIR,
                         **_OWN_GROUP),
        *(subprocess.Popen(worker_command(f"worker{n}"), cwd=BASE_DIR, **_OWN_GROUP) for n in range(1, workers + 1)),
        # Beat in a process of its own, not embedded in the worker (-B): an embedded beat outlived a
        # SIGKILLed launcher, retrying the gone Redis for minutes after its worker had exited.
        subprocess.Popen([sys.executable, "-m", "celery", "-A", "undolog_site", "-q", "beat",
                          "--loglevel", os.environ.get("LOG_LEVEL", "INFO"),
                          "--schedule", str(var / f"celerybeat-schedule{instance}")], cwd=BASE_DIR,
                         **_OWN_GROUP),
    ]
    _wait_until_up(host, port, children[0])
    _wait_for_worker(children[1])
    print(summary(host, port, var, workers=workers, redis_url=shown_url(os.environ["REDIS_URL"])), flush=True)
    stops = 0  # Ctrl-C (or SIGTERM) so far: the first stops gently, a second at once

    def stop(signum, frame) -> None:
        nonlocal stops
        stops += 1

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        while not stops and all(child.poll() is None for child in children):
            time.sleep(0.2)
    finally:
        _shut_down(children, hurry=lambda: stops > 1)
        embedded_redis.stop(redis_process)
    failed = [child.args[2] for child in children if child.returncode not in (0, -signal.SIGTERM, None)]
    return 1 if failed and not stops else 0


# A worker's warm shutdown waits for the tasks it runs; the longest is one walk of the undo stack
# (UNDOLOG_UNDO_WALK_BUDGET_S, 60 s by default, then it re-enqueues itself), plus a compensation's timeout.
WORKER_STOP_S = 120
OTHERS_STOP_S = 10


def _shut_down(children: list[subprocess.Popen], hurry) -> None:
    """Stop every child, letting a Celery worker finish what it runs.

    1. SIGTERM to uvicorn's and beat's process groups, but to a worker's main process only: that is
       Celery's warm shutdown (take no new task, let the pool finish its running ones, then stop
       the pool). SIGTERM to the worker's whole group killed the pool children mid-task, a
       compensation's webhook among them, with a WorkerLostError traceback.
    2. Wait: OTHERS_STOP_S for the others, WORKER_STOP_S for a worker, or until `hurry()` (a
       second Ctrl-C). Say why the wait is long once it is.
    3. SIGKILL what is left of each group.
    """
    for child in children:
        if _is_worker(child):
            _signal(child.pid, signal.SIGTERM)
        else:
            _signal_group(child, signal.SIGTERM)
    started = time.monotonic()
    said = False
    while not hurry():
        elapsed = time.monotonic() - started
        waiting = [child for child in children if child.poll() is None
                   and elapsed < (WORKER_STOP_S if _is_worker(child) else OTHERS_STOP_S)]
        if not waiting:
            break
        if not said and elapsed > 2 and any(_is_worker(child) for child in waiting):
            print("undolog: the worker is finishing its running tasks (Ctrl-C again stops it at once)",
                  file=sys.stderr, flush=True)
            said = True
        time.sleep(0.1)
    for child in children:
        _signal_group(child, signal.SIGKILL)  # what is left of it: a worker's pool children
        child.wait()


def _is_worker(child: subprocess.Popen) -> bool:
    return "celery" in child.args and "worker" in child.args


def worker_command(name: str) -> list[str]:
    """A Celery worker named `name@<host>` (two workers of one name on a host would be one node to
    Celery's control commands). -q: no banner; its periodic tasks log at DEBUG (settings.LOGGING),
    so warnings stand out."""
    return [sys.executable, "-m", "celery", "-A", "undolog_site", "-q", "worker", "-n", f"{name}@%h",
            "--loglevel", os.environ.get("LOG_LEVEL", "INFO"),
            "--concurrency", os.environ.get("WORKER_CONCURRENCY", "4")]


def _worker_count() -> int:
    raw = os.environ.get("WORKERS", "1")
    if not raw.isdigit() or not 1 <= int(raw) <= 32:
        raise SystemExit(f"undolog: WORKERS must be a whole number from 1 to 32, not {raw!r}")
    return int(raw)


def attach_worker() -> int:
    """`make worker`: one more worker for the `make run` of this var dir and database, on its
    embedded Redis (or on REDIS_URL when set, as for the launcher)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "undolog_site.settings")
    var = Path(os.environ.get("UNDOLOG_VAR_DIR", BASE_DIR / "var"))
    if "REDIS_URL" not in os.environ:
        socket_path = embedded_redis.socket_for(var, os.environ.get("DATABASE_URL", ""))
        if not embedded_redis.answers(socket_path):
            print(f"undolog: no Redis answers on {socket_path}: start `make run` first (with the same "
                  "DATABASE_URL and UNDOLOG_VAR_DIR), or set REDIS_URL", file=sys.stderr, flush=True)
            return 2
        os.environ["REDIS_URL"] = f"unix://{socket_path}"
    instance = embedded_redis.instance_suffix(os.environ.get("DATABASE_URL", ""))
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(var / f"metrics{instance}"))
    name = f"worker-{os.getpid()}"
    print(f"undolog: worker {name} on {shown_url(os.environ['REDIS_URL'])} (Ctrl-C stops it)", flush=True)
    os.chdir(BASE_DIR)
    command = worker_command(name)
    os.execv(command[0], command)  # the worker takes this process's place: Ctrl-C reaches it alone


def shown_url(url: str) -> str:
    """A broker URL fit for the screen: a REDIS_URL of your own may carry a password."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


# Each child leads a process group of its own, stopped as a whole (a celery worker's pool with it),
# and dies with the launcher even when the launcher is SIGKILLed.
_OWN_GROUP = {"start_new_session": True, "preexec_fn": embedded_redis.die_with_parent}


def _signal_group(child: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_until_up(host: str, port: str, server: subprocess.Popen, timeout: float = 30) -> None:
    """The summary comes after the servers' own start-up lines, so it is the last thing on screen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        try:
            urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)


def _wait_for_worker(worker: subprocess.Popen, timeout: float = 60) -> None:
    """The summary waits for the worker too (a Celery ping answered): a request approved before it
    is ready would still work, but the box must be the last thing its start-up leaves on screen."""
    from undolog_site.celery import app

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and worker.poll() is None:
        try:
            if app.control.ping(timeout=1):
                return
        except Exception:  # the broker is still coming up: ask again
            time.sleep(0.5)


def summary(host: str, port: str, var: Path, *, workers: int = 1, redis_url: str = "") -> str:
    """One box: where to go, how to log in, the demo key and where it is kept, the workers and the
    Redis they share (what an extra worker needs)."""
    base = f"http://{host}:{port}"
    key_file = Path(os.environ.get("UNDOLOG_DEMO_KEY_FILE", var / "demo-agent.key"))
    key = key_file.read_text().strip() if key_file.exists() else ""
    lines = [
        "undolog is running (Ctrl-C stops the server, the workers and Redis)",
        "",
        f"Dashboard   {base}/            log in as admin / admin",
        f"API docs    {base}/api/docs/",
        f"Admin       {base}/admin/",
    ]
    if os.environ.get("UNDOLOG_METRICS_TOKEN"):
        lines.append(f"Metrics     {base}/metrics      (Authorization: Bearer $UNDOLOG_METRICS_TOKEN)")
    if key:
        lines += ["", f"Demo agent key  {key}", f"                saved in {key_file}"]
    else:
        lines += ["", "Demo agent key  issue one on the dashboard's Agents page (as admin)"]
    lines += ["", f"Workers     {workers} (WORKERS=n make run starts n; `make worker` in another terminal adds one)",
              f"Redis       {redis_url}"]
    lines += ["", f"Try it:  PORT={port} make demo"]
    width = max(len(line) for line in lines) + 2
    body = [f"│ {line.ljust(width - 1)}│" for line in lines]
    return "\n".join([f"┌{'─' * width}┐", *body, f"└{'─' * width}┘"])


if __name__ == "__main__":
    sys.exit(attach_worker() if sys.argv[1:] == ["worker"] else main())
