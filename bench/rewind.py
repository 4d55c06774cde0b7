"""Benchmark: rewind a 100-step run to its start against a local keep-alive webhook receiver.

    python -m bench.rewind [--steps 100]

Builds a running session with N committed compensable effects (webhook undos on a receiver
process, `tests.receiver`, keep-alive, verifying signatures and deduping by Idempotency-Key),
then times the preview (`lifecycle.rewind.preview`, the API's GET), the rewind's transaction
(`lifecycle.rewind.rewind`) and its walk (`lifecycle.undo.walk`, in this process: the code a
worker runs, without the broker hop), until the run is `running` again at step 0, counting each
one's SQL statements. `--completed`: the run had completed, and the rewind reopens it. Same
database choice as `bench.undo`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from bench.undo import ReceiverProcess, _setup_django, build


def _statements(queries) -> int:
    return len([q for q in queries.captured_queries
                if not q["sql"].startswith(("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT"))])


def run(steps: int = 100, completed: bool = False) -> dict[str, float]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from effects.models import CompensationFunction, Session, UndoEntry
    from lifecycle import rewind, tasks, undo

    org, session = build(steps, "http://127.0.0.1:9/undo")
    Session.objects.filter(pk=session.pk).update(state=Session.State.COMPLETED if completed
                                                 else Session.State.RUNNING)
    receiver = ReceiverProcess(org.webhook_secret, 0.0)
    enqueue = tasks.enqueue_walk
    tasks.enqueue_walk = lambda *args, **kwargs: None  # the walk runs below, in this process
    try:
        CompensationFunction.objects.filter(org=org).update(target=receiver.url)
        started_preview = time.perf_counter()
        with CaptureQueriesContext(connection) as previewed:
            rewind.preview(Session.objects.get(pk=session.pk), to_step=0)
        started = time.perf_counter()
        with CaptureQueriesContext(connection) as queries:
            plan, _ = rewind.rewind(Session.objects.filter(org=org), session.pk, to_step=0, reason="bench",
                                    actor="bench")
        started_walk = time.perf_counter()
        with CaptureQueriesContext(connection) as walked:
            undo.walk(session.pk, budget_s=3600)
        finished = time.perf_counter()
        seen = receiver.finish()
        assert Session.objects.get(pk=session.pk).state == Session.State.RUNNING
        order = [str(pk) for pk in UndoEntry.objects.filter(session=session).lifo().values_list("pk", flat=True)]
        assert seen["order"] == order and not seen["duplicates"] and len(plan.undo) == steps
    finally:
        tasks.enqueue_walk = enqueue
        if receiver.process.poll() is None:
            receiver.process.kill()
        org.delete()
    return {"steps": steps, "completed": completed, "preview_statements": _statements(previewed),
            "preview_ms": (started - started_preview) * 1000, "statements": _statements(queries),
            "walk_statements": _statements(walked), "start_ms": (started_walk - started) * 1000,
            "walk_s": finished - started_walk, "total_s": finished - started}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m bench.rewind", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--completed", action="store_true", help="rewind a completed run (it is reopened)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    redis_process = _setup_django()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0, interactive=False)
        result = run(args.steps, args.completed)
        which = "a completed run, reopened" if args.completed else "a running run"
        print(f"rewind of {result['steps']} steps to step 0 ({which}; {connection.vendor}, keep-alive receiver):\n"
              f"  the preview (GET)          {result['preview_statements']} statements, "
              f"{result['preview_ms']:.1f} ms\n"
              f"  the rewind's transaction   {result['statements']} statements, {result['start_ms']:.1f} ms\n"
              f"  its walk                   {result['walk_statements']} statements, "
              f"{result['walk_s'] * 1000:.0f} ms ({result['walk_s'] * 1000 / result['steps']:.2f} ms a compensation)\n"
              f"  until the run runs again   {result['total_s'] * 1000:.0f} ms")
        return result
    finally:
        if redis_process is not None:
            from undolog_site import embedded_redis

            embedded_redis.stop(redis_process)


if __name__ == "__main__":
    main()
