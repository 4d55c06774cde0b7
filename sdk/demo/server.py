"""The server the demo talks to: the one `make run` serves on UNDOLOG_URL if it is up,
else one of its own (a throwaway SQLite database and the embedded Redis under var/demo/,
uvicorn and a Celery worker with beat, started by `undolog_site.launcher`), stopped at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
# Its own server gets its own database and Redis, whatever the caller's environment says.
_NOT_INHERITED = ("DATABASE_URL", "REDIS_URL", "UNDOLOG_EMBEDDED_REDIS", "DJANGO_SETTINGS_MODULE")


@dataclass
class Server:
    url: str
    credentials: dict[str, str]
    own: bool
    process: subprocess.Popen | None = None
    log: Path | None = None
    notes: list[str] = field(default_factory=list)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        # The launcher stops uvicorn, the worker and the embedded Redis on SIGTERM.
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def is_up(url: str) -> bool:
    """An undolog server answers /healthz with its checks."""
    try:
        response = httpx.get(f"{url}/healthz", timeout=2)
        return response.status_code in (200, 503) and "status" in response.json()
    except (httpx.HTTPError, ValueError):
        return False


def attach(url: str, key_name: str = "make demo") -> Server:
    """Use the running server; provision its database (this checkout's settings)."""
    credentials = provision(os.environ.copy(), migrate=False, key_name=key_name)
    server = Server(url, credentials, own=False)
    response = httpx.get(f"{url}/api/v1/agents/cleanup/budget", timeout=5,
                         headers={"Authorization": f"Bearer {credentials['agent_key']}"})
    if response.status_code == 401:
        raise SystemExit(f"The server at {url} does not use this checkout's database (the agent "
                         "key made here is unknown to it). Stop it, or run the demo with "
                         "--own-server.")
    return server


def start(var_dir: Path, key_name: str = "make demo") -> Server:
    """A fresh server of its own: migrate, provision, then the launcher; wait until it answers."""
    wipe(var_dir)
    var_dir.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    port = free_port()
    env.update(UNDOLOG_VAR_DIR=str(var_dir), PORT=str(port), WORKER_CONCURRENCY="2",
               DEBUG="1", PYTHONUNBUFFERED="1")
    credentials = provision(env, migrate=True, key_name=key_name)
    log = var_dir / "server.log"
    with log.open("ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "undolog_site.launcher"], cwd=REPO,
                                   env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", credentials, own=True, process=process, log=log)
    try:
        wait_until_up(server)
    except BaseException:
        server.stop()
        raise
    return server


def wipe(var_dir: Path) -> None:
    """Start from nothing, but never wipe a directory that is not a previous demo's."""
    if not var_dir.exists():
        return
    ours = {"undolog.sqlite3", "server.log", "accounts.json", "redis.sock"}
    if any(var_dir.iterdir()) and not ours & {p.name for p in var_dir.iterdir()}:
        raise SystemExit(f"{var_dir} is not empty and holds no earlier demo: "
                         "pick another --var-dir")
    shutil.rmtree(var_dir)


def wait_until_up(server: Server, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not is_up(server.url):
        if server.process is not None and server.process.poll() is not None:
            raise SystemExit(f"the demo's server exited early; see {server.log}")
        if time.monotonic() > deadline:
            raise SystemExit(f"the demo's server did not answer within {timeout:g} s; "
                             f"see {server.log}")
        time.sleep(0.1)


def provision(env: dict[str, str], *, migrate: bool, key_name: str = "make demo") -> dict[str, Any]:
    args = [sys.executable, "-m", "sdk.demo.provision", "--key-name", key_name,
            *(["--migrate"] if migrate else [])]
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"provisioning the demo failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
