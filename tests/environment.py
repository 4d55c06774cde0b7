"""Loaded by pytest before Django (`-p tests.environment` in pytest.ini).

Without REDIS_URL the tests get their own embedded Redis on var/test-redis.sock, so they
never share a broker with a `make run` that may be up; it stops when the run ends.
The environment is set at import, because pytest-django reads settings before any
configure hook runs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# The test suite's fault-injection points (core/faults.py) exist only with this on; the
# servers and workers the tests start inherit it.
os.environ["UNDOLOG_TESTING"] = "1"

VAR = Path(os.environ.get("UNDOLOG_VAR_DIR", Path(__file__).resolve().parent.parent / "var"))
if "REDIS_URL" not in os.environ:
    os.environ["REDIS_URL"] = f"unix://{VAR / 'test-redis.sock'}"
    os.environ["UNDOLOG_EMBEDDED_REDIS"] = "1"

# Each test run counts its metrics in a directory of its own (the server and worker processes the
# tests start inherit it), so a `make run` or an earlier run never adds to what a test scrapes.
METRICS_DIR = VAR / f"test-metrics-{os.getpid()}"
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(METRICS_DIR)

# setupdemo's tests must not overwrite the key `make run` saved for the developer.
os.environ["UNDOLOG_DEMO_KEY_FILE"] = str(VAR / "test-demo-agent.key")

_process = None


def pytest_configure(config) -> None:
    global _process
    _flush_retrying_deadlocks()
    if os.environ.get("UNDOLOG_EMBEDDED_REDIS") == "1":
        from undolog_site import embedded_redis

        _process = embedded_redis.start(embedded_redis.socket_of(os.environ["REDIS_URL"]))


def pytest_unconfigure(config) -> None:
    shutil.rmtree(METRICS_DIR, ignore_errors=True)
    if _process is not None:
        from undolog_site import embedded_redis

        embedded_redis.stop(_process)


def _flush_retrying_deadlocks() -> None:
    """A transactional test ends with a flush (TRUNCATE of every table) while the package's real
    worker and beat keep sweeping: PostgreSQL may find the two deadlocked and abort the TRUNCATE.
    The sweep's transaction is short, so the flush tries again (the tests' own data is untouched
    by this; only the cleanup between tests is retried)."""
    import time

    from django.core.management.base import CommandError
    from django.core.management.commands import flush

    handle = flush.Command.handle

    def retrying(self, **options):
        for attempt in range(1, 6):
            try:
                return handle(self, **options)
            except CommandError as exc:
                if attempt == 5 or "deadlock detected" not in str(exc.__cause__ or ""):
                    raise
                time.sleep(0.2 * attempt)

    flush.Command.handle = retrying
