"""Benchmark: what a pre-image costs a compensable call (issue 42).

    python -m bench.preimage [--rounds 5] [--calls 200] [--kib 10]

At the server: in this process through the whole Django stack (middleware, authentication, rate
limits, the fast path or the views; no network), each round runs `--calls` compensable calls
without a pre-image (intercept + commit: the baseline) and as many with a pre-image of `--kib`
KiB (intercept + `POST /effects/{id}/pre-image` + commit), alternating, each request timed inside
the test client's handler (so the client's own encoding is not counted). Every round prints the
p50 of each, the p50 the pre-image adds, and the pre-image request's own wall and CPU time; then
the median and spread over the rounds. The issue's bound: at most 1 ms added at p50 for 10 KiB.

Upstream: how many SAFE round trips each gateway preset tool adds to a call (its before read,
and a read after the call when no after-image could be worked out before it), counted by running
the preset's runtime on realistic args against a counting upstream. The bound: one.

Uses DATABASE_URL and REDIS_URL when set (migrating that database); otherwise a SQLite file
var/bench.sqlite3 and an embedded Redis, so it never touches the `make run` database.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid


def setup() -> object | None:
    from bench.undo import _setup_django

    redis = _setup_django()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return redis


def prepare():
    from rest_framework.test import APIClient
    from undolog.gateway.preimages import FILESYSTEM

    from effects.models import CompensationFunction, Tool
    from orgs.models import Agent, AgentKey, Organization

    org = Organization.objects.create(slug=f"bench-pre-{uuid.uuid4().hex[:8]}", name="bench pre-images",
                                      rate_limit_per_key=10**9, rate_limit_per_org=10**9)
    agent = Agent.objects.create(org=org, name="bench")
    _, key = AgentKey.issue(agent)
    fn = CompensationFunction.objects.create(org=org, fn_name="restore", fn_version="1.0.0", handler="agent")
    Tool.objects.create(org=org, name="plain_write", tier="compensable", compensation_fn=fn, compensation_args={})
    Tool.objects.create(org=org, name="write_file", tier="compensable", compensation_fn=fn, compensation_args={},
                        pre_image=FILESYSTEM["write_file"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    session = client.post("/api/v1/sessions", {"agent": agent.name}, format="json").json()["id"]
    return client, session


def _database_cpu() -> tuple[int | None, int]:
    """(PostgreSQL backend pid, its CPU time in ns so far) of this thread's connection: the
    database's share of a request's cost, read from /proc (the database runs on this machine).
    SQLite's share is this process's own CPU already."""
    from django.db import connection

    raw = connection.connection
    if connection.vendor != "postgresql" or raw is None:
        return None, 0
    pid = raw.info.backend_pid
    try:
        with open(f"/proc/{pid}/schedstat") as stat:
            return pid, int(stat.read().split()[0])
    except OSError:
        return None, 0


class Timed:
    """The test client's handler (the whole Django stack: middleware, the fast path or the view),
    timed: for the last request, its wall time, and the server's CPU time (this thread's plus the
    PostgreSQL backend's), without the client's own work (encoding the body, reading the answer)."""

    def __init__(self, handler) -> None:
        self.handler, self.wall, self.cpu = handler, 0.0, 0.0

    def __call__(self, environ):
        pid, database = _database_cpu()
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return self.handler(environ)
        finally:
            self.cpu, self.wall = (time.thread_time() - cpu) * 1000, (time.perf_counter() - wall) * 1000
            after_pid, after = _database_cpu()
            if pid is not None and pid == after_pid:
                self.cpu += (after - database) / 1e6


class Call:
    """One compensable call's server time (wall and CPU, in ms), and its pre-image request's."""

    def __init__(self) -> None:
        self.wall = self.cpu = self.pre_wall = self.pre_cpu = 0.0

    def add(self, handler: Timed) -> None:
        self.wall += handler.wall
        self.cpu += handler.cpu


def one_call(client, session: str, step: int, tool: str, pre_image: bytes | None) -> Call:
    """A call (intercept, the pre-image if any, commit), each request timed inside the handler."""
    timed = Call()
    answer = client.post(f"/api/v1/sessions/{session}/intercept",
                         {"tool": tool, "step_index": step, "args": {"path": f"/w/{step}.txt", "content": "new"}},
                         format="json")
    assert answer.status_code == 201, answer.content
    timed.add(client.handler)
    effect = answer.json()["effect"]["id"]
    if pre_image is not None:
        kept = client.post(f"/api/v1/effects/{effect}/pre-image", pre_image, content_type="application/json")
        assert kept.status_code == 201, kept.content
        timed.add(client.handler)
        timed.pre_wall, timed.pre_cpu = client.handler.wall, client.handler.cpu
    committed = client.post(f"/api/v1/effects/{effect}/commit", {"result": {"content": "ok"}}, format="json")
    assert committed.status_code == 200, committed.content
    timed.add(client.handler)
    return timed


def server_cost(rounds: int, calls: int, kib: int) -> list[dict[str, float]]:
    """Per round: `calls` compensable calls without a pre-image (the baseline) and as many with one,
    alternating, in one run; the p50 of each, in wall and in server CPU time."""
    import json

    from undolog.preimages import digest

    client, session = prepare()
    client.handler = Timed(client.handler)
    content = ("0123456789abcdef" * 64 * kib)[: kib * 1024 - len('{"content":""}')]
    body = json.dumps({"value": {"content": content}, "absent": False,
                       "after_digest": digest({"content": "new"})}).encode()
    for warm in range(30):  # connections, caches, prepared statements
        one_call(client, session, 2 * warm, "plain_write", None)
        one_call(client, session, 2 * warm + 1, "write_file", body)
    p50, results, step = statistics.median, [], 1000
    for _ in range(rounds):
        plain, with_pre = [], []
        for _ in range(calls):
            plain.append(one_call(client, session, step, "plain_write", None))
            with_pre.append(one_call(client, session, step + 1, "write_file", body))
            step += 2
        row = {}
        for unit in ("wall", "cpu"):
            base, more = p50(getattr(c, unit) for c in plain), p50(getattr(c, unit) for c in with_pre)
            row.update({f"baseline_{unit}": base, f"with_{unit}": more, f"added_{unit}": more - base,
                        f"request_{unit}": p50(getattr(c, f"pre_{unit}") for c in with_pre)})
        results.append(row)
    return results


def upstream_round_trips() -> dict[str, int]:
    """SAFE upstream calls each preset tool's pre-image adds to one call (before read, read after)."""
    from undolog.gateway.preimages import PRESETS, build

    class Result:
        is_error = False
        content: list = []

        def __init__(self, structured: dict) -> None:
            self.structured_content = structured

    answers = {"filesystem": {"content": "line one\nold text\n"},
               "memory": {"entities": [{"name": "A", "entityType": "person", "observations": ["x"]}],
                          "relations": [{"from": "A", "to": "B", "relationType": "knows"}]}}
    args = {"path": "/w/a", "content": "x", "source": "/w/a", "destination": "/w/b",
            "edits": [{"oldText": "old text", "newText": "new text"}],
            "entities": [{"name": "A", "entityType": "person", "observations": []}],
            "observations": [{"entityName": "A", "contents": ["y"]}],
            "deletions": [{"entityName": "A", "observations": ["x"]}], "entityNames": ["A"],
            "relations": [{"from": "A", "to": "B", "relationType": "knows"}]}
    counts = {}
    for preset, tools in PRESETS.items():
        for name, declaration in tools.items():
            made: list[str] = []

            async def call(tool: str, call_args: dict, made: list[str] = made, preset: str = preset) -> Result:
                made.append(tool)
                return Result(answers[preset])

            async def roots() -> list[str]:
                return ["/"]

            pre = build(declaration, call, roots)

            async def keep(pre=pre) -> None:
                body = pre.body(args, await pre.read(args))
                if pre.reads_after(body):  # read again after the call
                    await (pre.check or pre.read)(args)

            asyncio.run(keep())
            counts[f"{preset}.{name}"] = len(made)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--kib", type=int, default=10)
    options = parser.parse_args()
    redis = setup()
    try:
        rounds = server_cost(options.rounds, options.calls, options.kib)
    finally:
        if redis is not None:
            redis.terminate()
    from django.db import connection

    print(f"server ({connection.vendor}, in-process: each request timed inside the test client's handler; CPU is "
          f"this process's plus the PostgreSQL backend's; {options.rounds} rounds of {options.calls} calls each "
          f"way, pre-image {options.kib} KiB), p50 in ms:")
    print("  round  unit  baseline (intercept+commit)  with its pre-image  added  the pre-image request")
    for n, r in enumerate(rounds, 1):
        for unit in ("wall", "cpu"):
            print(f"  {n:5}  {unit:4}  {r[f'baseline_{unit}']:27.3f}  {r[f'with_{unit}']:18.3f}  "
                  f"{r[f'added_{unit}']:5.3f}  {r[f'request_{unit}']:21.3f}")
    for unit in ("wall", "cpu"):
        for name, label in (("added", "added at p50 (bound: 1 ms)"), ("request", "the pre-image request alone")):
            values = sorted(r[f"{name}_{unit}"] for r in rounds)
            print(f"  {unit:4} {label:28} median of rounds {statistics.median(values):.3f} ms, "
                  f"spread {values[0]:.3f} to {values[-1]:.3f}")
    print("upstream SAFE round trips a preset tool adds to one call (bound: 1):")
    for name, count in upstream_round_trips().items():
        print(f"  {name:36} {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
