"""Benchmark: a fleet rollback of 500 runs x 4 entries against a local keep-alive receiver, on two
Celery workers (one process each) against PostgreSQL and Redis.

    python -m bench.rollback [--runs 500] [--entries 4] [--workers 2]

Builds an agent with `--runs` runs of `--entries` committed compensable calls each (a fifth of them
still running, the rest completed a moment ago), every undo a signed webhook to `tests.receiver`
in a process of its own (it verifies signatures, dedupes by Idempotency-Key and keeps its
connections alive), and times, with the same workers in the same run:

- today's way: one `Session.undo()` per run (what `POST /sessions/{id}/undo` does), each run's
  walk a task of its own;
- the fleet rollback: one `rollback.rollback()` (what `POST /agents/{name}/rollback` does), its
  runs walked side by side in chunks.

Each from the first call until every run is `compensated`; then checks, from what the receiver
saw, that each compensation was applied once and each run's went newest first. Prints
compensations per second of both and their ratio. The machine may be shared: compare ratios.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

from bench.common import BASE_DIR, setup_django


def build(runs: int, entries: int, target: str, label: str):
    """An org and agent with `runs` runs (a fifth running, the rest completed) of `entries` committed
    compensable calls each, their undo entries pushed."""
    from django.db import connection
    from django.utils import timezone

    from effects.models import CompensationFunction, Effect, Session, Tool, UndoEntry
    from orgs.models import Agent, Organization

    org = Organization.objects.create(slug=f"bench-rollback-{label}-{uuid.uuid4().hex[:6]}", name="bench rollback")
    agent = Agent.objects.create(org=org, name="fleet")
    fn = CompensationFunction.objects.create(org=org, fn_name="undo_send_email", fn_version="1.0.0",
                                             handler="webhook", target=target, timeout_ms=5000)
    tool = Tool.objects.create(org=org, name="send_email", tier="compensable", compensation_fn=fn,
                               compensation_args={"to": "{to}"}, max_retries=3, retry_backoff_ms=10)
    now = timezone.now()
    sessions = Session.objects.bulk_create(
        Session(org=org, agent=agent, step_index=entries,
                state=Session.State.RUNNING if n % 5 == 0 else Session.State.COMPLETED,
                ended_at=None if n % 5 == 0 else now, tool_calls=entries) for n in range(runs))
    effects = Effect.objects.bulk_create(
        Effect(org=org, session=session, tool=tool, tool_name=tool.name, tier=tool.tier, step_index=step,
               call_signature=f"{step:064x}", args={"to": f"user{step}@x.io"}, args_digest="-",
               state=Effect.State.COMMITTED, result={"id": step})
        for session in sessions for step in range(1, entries + 1))
    UndoEntry.objects.bulk_create(
        UndoEntry(session_id=effect.session_id, effect=effect, step_index=effect.step_index, fn=fn,
                  fn_name=fn.fn_name, fn_version=fn.fn_version, args={"to": effect.args["to"]}, max_retries=3,
                  retry_backoff_ms=10)
        for effect in effects)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE effects_undoentry, effects_effect, effects_session")
    return org, agent, now - timedelta(seconds=1)


class Workers:
    """`count` Celery workers, one process each (prefork, concurrency 1), on the bench's settings."""

    def __init__(self, count: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="bench-rollback-"))
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "PYTHONUNBUFFERED": "1",
               "LOG_LEVEL": "WARNING"}
        self.logs = [self.dir / f"worker-{n}.log" for n in range(count)]
        self.processes = []
        for n, log in enumerate(self.logs):
            with open(log, "ab") as out:
                self.processes.append(subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "undolog_site", "worker", "--concurrency", "1",
                     "--pool", "prefork", "--without-gossip", "--without-mingle", "--without-heartbeat",
                     "--hostname", f"bench-rollback-{n}-{os.getpid()}@%h", "--loglevel", "INFO"],
                    cwd=BASE_DIR, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 60
        for log, process in zip(self.logs, self.processes, strict=True):
            while "ready" not in log.read_text(errors="replace"):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"a worker did not start: {log.read_text()[-2000:]}")
                time.sleep(0.1)

    def stop(self) -> None:
        import signal

        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


class CpuMeter:
    """CPU seconds spent, while it runs, by each group of processes: the workers (each with its
    pool child), the receiver, this database's PostgreSQL backends, and this process. Sampled
    every 250 ms, so a backend that comes and goes between samples is missed (the workers' pooled
    connections stay)."""

    def __init__(self, groups: dict[str, list[int]], database: str) -> None:
        import threading

        import psutil

        self.psutil, self.groups, self.database = psutil, groups, database
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.owner: dict[int, str] = {}
        self.stopping = threading.Event()
        self._sample()
        self.first = dict(self.last)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _processes(self):
        for name, pids in self.groups.items():
            for pid in pids:
                try:
                    process = self.psutil.Process(pid)
                    yield name, process
                    for child in process.children(recursive=True) if pid != os.getpid() else ():
                        yield name, child
                except self.psutil.NoSuchProcess:
                    pass
        for process in self.psutil.process_iter(["name", "cmdline"]):
            if process.info["name"] == "postgres" and any(f" {self.database} " in f" {part} "
                                                          for part in process.info["cmdline"] or []):
                yield "postgres", process

    def _sample(self) -> None:
        for name, process in self._processes():
            try:
                times = process.cpu_times()
            except self.psutil.NoSuchProcess:
                continue
            self.last[process.pid] = times.user + times.system
            self.owner[process.pid] = name

    def _loop(self) -> None:
        while not self.stopping.wait(0.25):
            self._sample()

    def stop(self) -> dict[str, float]:
        self.stopping.set()
        self.thread.join()
        self._sample()
        spent: dict[str, float] = defaultdict(float)
        for pid, seconds in self.last.items():
            spent[self.owner[pid]] += seconds - self.first.get(pid, 0.0)
        return dict(spent)


def until_compensated(org, timeout: float = 300) -> None:
    from django.db import connection

    from effects.models import Session

    deadline = time.monotonic() + timeout
    # Written out and every 20 ms: the ORM's exists() every 10 ms cost this process ~1 ms of CPU per
    # compensation, a share of the two cores the workers were measured on.
    sql = "SELECT EXISTS (SELECT 1 FROM effects_session WHERE org_id = %s AND state <> 'compensated')"
    while True:
        with connection.cursor() as cursor:
            cursor.execute(sql, [org.pk])
            if not cursor.fetchone()[0]:
                return
        if time.monotonic() > deadline:
            states = list(Session.objects.filter(org=org).values_list("state", flat=True).distinct())
            raise RuntimeError(f"the rollback did not finish in {timeout} s: sessions still {states}")
        time.sleep(0.02)


def check(org, seen: dict, expected: int) -> None:
    """Each compensation applied once, each run's newest first (as the receiver saw them)."""
    from effects.models import UndoEntry

    assert len(seen["order"]) == expected, f"{len(seen['order'])} of {expected} compensations applied"
    assert not seen["duplicates"] and not seen["unverified"]
    position = {key: n for n, key in enumerate(seen["order"])}
    runs: dict = defaultdict(list)
    for pk, session in UndoEntry.objects.filter(session__org=org).lifo().values_list("pk", "session_id"):
        runs[session].append(position[str(pk)])
    assert all(order == sorted(order) for order in runs.values()), "a run was not walked newest first"


def run(runs: int, entries: int, workers: int) -> dict:
    from django.db import connection

    from bench.undo import ReceiverProcess
    from effects.models import CompensationFunction, Session
    from lifecycle import rollback

    results = {}
    pool = Workers(workers)
    try:
        for label in ("per-run", "fleet"):
            org, agent, since = build(runs, entries, "http://127.0.0.1:9/undo", label)
            receiver = ReceiverProcess(org.webhook_secret, 0.0)
            CompensationFunction.objects.filter(org=org).update(target=receiver.url)
            groups = {f"worker {n}": [process.pid] for n, process in enumerate(pool.processes)}
            groups |= {"receiver": [receiver.process.pid], "bench": [os.getpid()]}
            meter = CpuMeter(groups, connection.settings_dict["NAME"])
            try:
                started = time.perf_counter()
                if label == "fleet":
                    rollback.rollback(agent, since, "bench", "bench")
                else:
                    for session in Session.objects.filter(org=org).order_by("created"):
                        if session.state == Session.State.RUNNING:
                            session.fail("bench", actor="bench")
                        else:
                            session.undo(actor="bench")
                requested = time.perf_counter()
                until_compensated(org)
                elapsed = time.perf_counter() - started
            finally:
                cpu = meter.stop()
                seen = receiver.finish()
            check(org, seen, runs * entries)
            results[label] = {"seconds": elapsed, "request_s": requested - started,
                              "per_second": runs * entries / elapsed,
                              "cpu": cpu, "uptime": _uptime()}
    finally:
        pool.stop()
    return results


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _cpu_line(result: dict, compensations: int) -> str:
    cpu = result["cpu"]
    parts = ", ".join(f"{name} {seconds:.2f}" for name, seconds in sorted(cpu.items()))
    total = sum(cpu.values())
    return (f"      CPU s: {parts}; total {total:.2f} s of {2 * result['seconds']:.2f} core-s "
            f"({total * 1000 / compensations:.2f} ms per compensation)")


def report(results: dict, runs: int, entries: int, workers: int) -> str:
    fleet, per_run = results["fleet"], results["per-run"]
    return "\n".join([
        f"fleet rollback: {runs} runs x {entries} entries, {workers} workers, a local keep-alive receiver (postgresql)",
        f"  today (one undo per run)   {per_run['per_second']:8.0f} compensations/s  "
        f"({per_run['seconds']:.2f} s; the {runs} requests {per_run['request_s'] * 1000:.0f} ms)",
        _cpu_line(per_run, runs * entries), f"      {per_run['uptime']}",
        f"  fleet rollback             {fleet['per_second']:8.0f} compensations/s  "
        f"({fleet['seconds']:.2f} s; its request {fleet['request_s'] * 1000:.0f} ms)   goal >= 1,000",
        _cpu_line(fleet, runs * entries), f"      {fleet['uptime']}",
        f"  ratio                      {fleet['per_second'] / per_run['per_second']:8.2f}x  "
        "(each compensation applied once, each run newest first: checked)",
    ])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.rollback", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--entries", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    setup_django()
    results = run(args.runs, args.entries, args.workers)
    print(report(results, args.runs, args.entries, args.workers))
    return results


if __name__ == "__main__":
    main()
