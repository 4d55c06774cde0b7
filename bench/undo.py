"""Benchmark: walk a 1,000-entry undo stack back against a local webhook receiver.

    python -m bench.undo [--entries 1000] [--receiver-ms 0]

Builds a session with N committed compensable effects (their undo entries pointing at a
webhook on a receiver process on 127.0.0.1, `tests.receiver`, that verifies signatures and
dedupes by Idempotency-Key), then times `lifecycle.undo.walk()` in this process: the same code a Celery
worker runs, without the broker hop. Prints compensations per second and, per compensation,
the walk's wall time against the receiver's own time (request read to response written); the
difference is undolog's overhead, split into the HTTP client (each webhook's time in the
walker, signing included, minus the receiver's time) and the database bookkeeping (claim,
attempt row, transitions). The receiver keeps its connections alive, as one behind a proxy does.

Uses DATABASE_URL and REDIS_URL when set; otherwise a SQLite file var/bench.sqlite3 and an
embedded Redis on var/bench-redis.sock, so it never touches the `make run` database.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


def _setup_django() -> object | None:
    """Configure Django unless the caller (`python -m bench`) already did; returns an embedded
    Redis process to stop, if one was started."""
    from django.conf import settings

    redis_process = None
    if not settings.configured:
        var = Path(os.environ.get("UNDOLOG_VAR_DIR", BASE_DIR / "var"))
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "undolog_site.settings")
        os.environ.setdefault("DATABASE_URL", f"sqlite:///{var / 'bench.sqlite3'}")
        if "REDIS_URL" not in os.environ:
            from undolog_site import embedded_redis

            os.environ["REDIS_URL"] = f"unix://{var / 'bench-redis.sock'}"
            redis_process = embedded_redis.start(var / "bench-redis.sock")
    import django

    django.setup()
    return redis_process


def build(entries: int, target: str):
    """An org, a webhook compensation, and a `compensating` session with `entries` undo entries."""
    from effects.models import CompensationFunction, Effect, Session, Tool, UndoEntry
    from orgs.models import Agent, Organization

    org = Organization.objects.create(slug=f"bench-undo-{uuid.uuid4().hex[:8]}", name="bench undo")
    agent = Agent.objects.create(org=org, name="bench")
    fn = CompensationFunction.objects.create(org=org, fn_name="undo_send_email", fn_version="1.0.0",
                                             handler="webhook", target=target, timeout_ms=5000)
    tool = Tool.objects.create(org=org, name="send_email", tier="compensable", compensation_fn=fn,
                               compensation_args={"to": "{to}"}, max_retries=3, retry_backoff_ms=10)
    session = Session.objects.create(org=org, agent=agent, state=Session.State.COMPENSATING,
                                     step_index=entries)
    effects = Effect.objects.bulk_create(
        Effect(org=org, session=session, tool=tool, tool_name=tool.name, tier=tool.tier, step_index=step,
               call_signature=f"{step:064x}", args={"to": f"user{step}@x.io"}, args_digest="-",
               state=Effect.State.COMMITTED, result={"id": step})
        for step in range(1, entries + 1))
    UndoEntry.objects.bulk_create(
        UndoEntry(session=session, effect=effect, step_index=effect.step_index, fn=fn, fn_name=fn.fn_name,
                  fn_version=fn.fn_version, args={"to": effect.args["to"]}, max_retries=3, retry_backoff_ms=10)
        for effect in effects)
    from django.db import connection

    if connection.vendor == "postgresql":
        # Fresh bulk inserts leave the planner's statistics empty; production tables are analysed.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE effects_undoentry, effects_effect, effects_session")
    return org, session


class ReceiverProcess:
    """tests.receiver in a process of its own: a receiver on a thread of the walker's process
    would share its GIL, and every compensation would pay for the receiver's Python too."""

    def __init__(self, secret: str, receiver_ms: float) -> None:
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="bench-receiver-"))
        self.port_file, self.result_file = self.dir / "port", self.dir / "result.json"
        self.process = subprocess.Popen([sys.executable, "-m", "tests.receiver", str(self.port_file),
                                         str(self.result_file), secret, str(receiver_ms)], cwd=BASE_DIR)
        deadline = time.monotonic() + 20
        while not self.port_file.exists() or not self.port_file.read_text():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the receiver process did not start")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port_file.read_text()}/undo"

    def finish(self) -> dict:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=20)
        return json.loads(self.result_file.read_text())


def run(entries: int = 1000, receiver_ms: float = 0.0) -> dict[str, float]:
    from effects import handlers
    from effects.models import CompensationFunction, Session, UndoEntry
    from lifecycle import undo

    org, session = build(entries, "http://127.0.0.1:9/undo")
    receiver = ReceiverProcess(org.webhook_secret, receiver_ms)
    sent: list[float] = []  # each webhook's wall time in the walker (an attempt records whole ms only)
    run_handler = handlers.run

    def timed_handler(*args, **kwargs):
        began = time.perf_counter()
        try:
            return run_handler(*args, **kwargs)
        finally:
            sent.append((time.perf_counter() - began) * 1000)

    try:
        CompensationFunction.objects.filter(org=org).update(target=receiver.url)
        handlers.run = timed_handler
        started = time.perf_counter()
        undo.walk(session.pk, budget_s=3600)
        elapsed = time.perf_counter() - started
        seen = receiver.finish()
        assert Session.objects.get(pk=session.pk).state == Session.State.COMPENSATED
        assert len(seen["order"]) == entries and not seen["duplicates"] and not seen["unverified"]
        order = [str(pk) for pk in UndoEntry.objects.filter(session=session).lifo().values_list("pk", flat=True)]
        assert seen["order"] == order, "the walk did not go newest first"
        client_ms = statistics.mean(sent)
    finally:
        handlers.run = run_handler
        if receiver.process.poll() is None:
            receiver.process.kill()
        org.delete()
    per_ms = elapsed * 1000 / entries
    own_ms = statistics.mean(seen["own_ms"])
    return {"entries": entries, "seconds": elapsed, "per_second": entries / elapsed, "per_compensation_ms": per_ms,
            "receiver_ms": own_ms, "overhead_ms": per_ms - own_ms, "http_client_ms": max(0.0, client_ms - own_ms),
            "bookkeeping_ms": per_ms - client_ms}


def report(result: dict[str, float], database: str) -> str:
    return "\n".join([
        f"undo walk: {result['entries']:,} entries against a local webhook receiver ({database})",
        f"  compensations/s            {result['per_second']:10.1f}",
        f"  wall per compensation      {result['per_compensation_ms']:10.2f} ms",
        f"  receiver's own time        {result['receiver_ms']:10.2f} ms",
        f"  overhead per compensation  {result['overhead_ms']:10.2f} ms"
        f"  (HTTP client ~{result['http_client_ms']:.2f} ms, database bookkeeping ~{result['bookkeeping_ms']:.2f} ms)",
    ])


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m bench.undo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--receiver-ms", type=float, default=0.0, help="simulated work per request in the receiver")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    redis_process = _setup_django()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per webhook otherwise
    try:
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0, interactive=False)
        result = run(args.entries, args.receiver_ms)
        print(report(result, connection.vendor))
        return result
    finally:
        if redis_process is not None:
            from undolog_site import embedded_redis

            embedded_redis.stop(redis_process)


if __name__ == "__main__":
    main()
