"""Run a command against a real, fresh undolog server (the TypeScript SDK's test harness):

    .venv/bin/python sdk-js/test/server.py -- npm --prefix sdk-js test

1. A database of its own: with ``DATABASE_URL`` (PostgreSQL) a fresh ``<name>_js`` database
   on that server, else SQLite in a temporary directory; ``REDIS_URL`` is used when set,
   else the embedded Redis (so both CI passes cover the SDK).
2. Migrate and provision it as the demo does (``sdk.demo.provision``: the org
   ``cleanup-demo``, its admin and reviewer tokens, the agent ``cleanup`` with a key).
3. ``undolog_site.launcher``: uvicorn and a Celery worker with beat (the undo walk and the
   webhook compensations are the worker's), with DEBUG=1 so loopback receivers are allowed.
4. Run the command with ``UNDOLOG_TEST_*`` in its environment; stop everything; its exit code.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1:] if "--" in argv else argv
    if not command:
        print(__doc__, file=sys.stderr)
        return 2
    var = Path(tempfile.mkdtemp(prefix="undolog-js-"))
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "UNDOLOG_EMBEDDED_REDIS")}
    port = free_port()
    env.update(UNDOLOG_VAR_DIR=str(var), PORT=str(port), WORKER_CONCURRENCY="2", DEBUG="1",
               PYTHONUNBUFFERED="1", UNDOLOG_WEBHOOK_RETRY_BASE_MS="100")
    database = fresh_database(env.get("DATABASE_URL", ""))
    if database:
        env["DATABASE_URL"] = database
    process = None
    try:
        credentials = provision(env)
        log = var / "server.log"
        with log.open("ab") as out:
            process = subprocess.Popen([sys.executable, "-m", "undolog_site.launcher"], cwd=REPO, env=env,
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, process, log)
        child = {**os.environ, "UNDOLOG_TEST_URL": url, "UNDOLOG_TEST_KEY": credentials["agent_key"],
                 "UNDOLOG_TEST_AGENT": credentials["agent"], "UNDOLOG_TEST_ORG": credentials["org"],
                 "UNDOLOG_TEST_ADMIN_TOKEN": credentials["admin_token"],
                 "UNDOLOG_TEST_REVIEWER_TOKEN": credentials["reviewer_token"],
                 "UNDOLOG_TEST_WEBHOOK_SECRET": credentials["webhook_secret"],
                 "UNDOLOG_TEST_SERVER_LOG": str(log)}
        print(f"undolog test server at {url} ({'PostgreSQL' if database else 'SQLite'}, log {log})", flush=True)
        return subprocess.run(command, env=child).returncode
    finally:
        if process is not None:
            stop(process)
        if database:
            drop_database(database)
        shutil.rmtree(var, ignore_errors=True)


def fresh_database(url: str) -> str:
    """``<name>_js`` on the server of a PostgreSQL ``url``, dropped and created empty ("" for SQLite)."""
    if not url.startswith(("postgres://", "postgresql://")):
        return ""
    parts = urlsplit(url)
    name = f"{parts.path.lstrip('/') or 'undolog'}_js"
    admin_sql(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"')
    return urlunsplit(parts._replace(path=f"/{name}"))


def drop_database(url: str) -> None:
    name = urlsplit(url).path.lstrip("/")
    admin_sql(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def admin_sql(url: str, *statements: str) -> None:
    import psycopg

    parts = urlsplit(url)
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def provision(env: dict[str, str]) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-m", "sdk.demo.provision", "--migrate"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"provisioning the test server failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def wait_until_up(url: str, process: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the test server exited early:\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(f"{url}/healthz", timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # 503: up, with a check failing (the tests will say which)
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the test server did not answer within {timeout:g} s; see {log}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)  # the launcher stops uvicorn, the worker and Redis
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
