"""Benchmark: what a pre-image costs a compensable call (issue 42).

    python -m bench.preimage [--calls 300] [--kib 10]

At the server: each round runs, in this process through the whole Django stack (middleware,
authentication, rate limits, the views; no network), one compensable call without a pre-image
(intercept + commit: the baseline) and one with a pre-image of `--kib` KiB (intercept +
`POST /effects/{id}/pre-image` + commit), alternating, and prints the p50 of each, the p50 the
pre-image adds, and the ratio. The issue's bound: at most 1 ms at p50 for 10 KiB.

Upstream: how many SAFE round trips each gateway preset tool adds to a call (its before read,
and a read after the call when its args do not say what it leaves), counted by running the
preset's runtime against a counting upstream. The bound: at most one, except where the issue's
"no after-image in the args" forces a second (edit_file and the memory graph: printed).

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


CPU: list[float] = []  # the pre-image requests' CPU time in this process (parse, seal, digests, answer)


def one_call(client, session: str, step: int, tool: str, pre_image: dict | None) -> tuple[float, float]:
    """(the call's server time, the pre-image request's), in ms."""
    started = time.perf_counter()
    answer = client.post(f"/api/v1/sessions/{session}/intercept",
                         {"tool": tool, "step_index": step, "args": {"path": f"/w/{step}.txt", "content": "new"}},
                         format="json")
    assert answer.status_code == 201, answer.content
    effect = answer.json()["effect"]["id"]
    kept_ms = 0.0
    if pre_image is not None:
        before, cpu = time.perf_counter(), time.process_time()
        kept = client.post(f"/api/v1/effects/{effect}/pre-image", pre_image, format="json")
        assert kept.status_code == 201, kept.content
        kept_ms = (time.perf_counter() - before) * 1000
        CPU.append((time.process_time() - cpu) * 1000)
    committed = client.post(f"/api/v1/effects/{effect}/commit", {"result": {"content": "ok"}}, format="json")
    assert committed.status_code == 200, committed.content
    return (time.perf_counter() - started) * 1000, kept_ms


def server_cost(calls: int, kib: int) -> dict[str, float]:
    from undolog.preimages import digest

    client, session = prepare()
    content = ("0123456789abcdef" * 64 * kib)[: kib * 1024 - len('{"content":""}')]
    body = {"value": {"content": content}, "absent": False, "after_digest": digest({"content": "new"})}
    plain, with_pre, kept = [], [], []
    for warm in range(20):  # connections, caches, prepared statements
        one_call(client, session, 2 * warm, "plain_write", None)
        one_call(client, session, 2 * warm + 1, "write_file", body)
    for n in range(calls):
        step = 1000 + 2 * n
        plain.append(one_call(client, session, step, "plain_write", None)[0])
        total, pre = one_call(client, session, step + 1, "write_file", body)
        with_pre.append(total)
        kept.append(pre)
    p50 = statistics.median
    return {"baseline_p50_ms": p50(plain), "with_pre_image_p50_ms": p50(with_pre),
            "pre_image_request_p50_ms": p50(kept), "added_p50_ms": p50(with_pre) - p50(plain),
            "ratio": p50(with_pre) / p50(plain), "cpu_p50_ms": p50(CPU[20:])}


def upstream_round_trips() -> dict[str, int]:
    """SAFE upstream calls each preset tool's pre-image adds to one call (before read, read after)."""
    from undolog.gateway.preimages import PRESETS, build
    from undolog.preimages import ABSENT

    class Result:
        is_error = False
        structured_content = {"content": "x", "entities": [], "relations": []}
        content = []

    counts = {}
    for preset, tools in PRESETS.items():
        for name, declaration in tools.items():
            made: list[str] = []

            async def call(tool: str, args: dict, made: list[str] = made) -> Result:
                made.append(tool)
                return Result()

            async def roots() -> list[str]:
                return ["/"]

            pre = build(declaration, call, roots)
            args = {"path": "/w/a", "content": "x", "source": "/w/a", "destination": "/w/b", "edits": [],
                    "entities": [{"name": "A"}], "observations": [{"entityName": "A"}],
                    "deletions": [{"entityName": "A"}], "entityNames": ["A"], "relations": [{"from": "A"}]}

            async def keep(pre=pre, args=args) -> None:
                state = await pre.read(args)
                pre.body(args, state if state is not ABSENT else ABSENT)
                if pre.after is None:  # read again after the call
                    await (pre.check or pre.read)(args)

            asyncio.run(keep())
            counts[f"{preset}.{name}"] = len(made)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--kib", type=int, default=10)
    options = parser.parse_args()
    redis = setup()
    try:
        cost = server_cost(options.calls, options.kib)
    finally:
        if redis is not None:
            redis.terminate()
    from django.db import connection

    print(f"server ({connection.vendor}, {options.calls} calls each, pre-image {options.kib} KiB, in-process):")
    print(f"  compensable call, no pre-image (baseline)  p50 {cost['baseline_p50_ms']:.2f} ms")
    print(f"  compensable call with its pre-image        p50 {cost['with_pre_image_p50_ms']:.2f} ms "
          f"(x{cost['ratio']:.2f} the baseline)")
    print(f"  the pre-image request alone                p50 {cost['pre_image_request_p50_ms']:.2f} ms "
          f"(CPU in this process {cost['cpu_p50_ms']:.2f} ms; the rest waits on the database)")
    print(f"  added at p50                               {cost['added_p50_ms']:.2f} ms (bound: 1 ms)")
    print("upstream SAFE round trips a preset tool adds to one call (bound: 1; 2 where the args cannot say "
          "what the call leaves):")
    for name, count in upstream_round_trips().items():
        print(f"  {name:36} {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
