"""The intercept's hot path in one process: time, CPU and SQL per request, against a baseline.

Calls the production WSGI stack in-process (Django's test client: every middleware, the view,
the real PostgreSQL through the pool) so the load generator does not share the two cores with
the server. Per request kind it prints the median and p99 wall time, the CPU time, and the SQL
statements (BEGIN/COMMIT not counted); each beside the one-INSERT baseline view measured in the
same run. `--profile` adds the top costs by own time (cProfile) of the compensable intercept.

    python -m bench.hotpath [--requests 2000] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import os
import pstats
import statistics
import time
from collections.abc import Callable

import orjson

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/undolog_bench_hot")

from bench.common import bench_org, setup_django


def prepare():
    from django.test import Client

    bench = bench_org("bench-hot", all_tiers=True)
    return Client(HTTP_AUTHORIZATION=f"Bearer {bench.key}", HTTP_HOST="127.0.0.1"), bench.agent.name


class Kinds:
    """Each request kind as a zero-argument callable returning the response's status."""

    def __init__(self, client, agent: str) -> None:
        self.client, self.agent = client, agent
        self.steps = itertools.count(1)
        self.session = self._session()
        self.committed: list[tuple[str, dict]] = []
        self.executing: list[str] = []

    def _post(self, path: str, body: dict):
        return self.client.post(path, body, content_type="application/json")

    def _session(self) -> str:
        return self._post("/api/v1/sessions", {"agent": self.agent}).json()["id"]

    def baseline(self) -> int:
        return self.client.post("/bench/baseline").status_code

    def intercept(self) -> int:
        step = next(self.steps)
        body = {"tool": "send_email", "step_index": step, "args": {"to": f"u{step}@x.io", "subject": "hi"}}
        answer = self._post(f"/api/v1/sessions/{self.session}/intercept", body)
        self.executing.append(orjson.loads(answer.content)["effect"]["id"])  # the client's share: kept small
        self.committed.append((self.session, body))
        return answer.status_code

    def intercept_with_safe(self) -> int:
        step = next(self.steps)
        body = {"tool": "send_email", "step_index": step + 1, "args": {"to": f"s{step}@x.io"},
                "safe_calls": [{"tool": "list_accounts", "step_index": step, "args": {}}]}
        next(self.steps)
        answer = self._post(f"/api/v1/sessions/{self.session}/intercept", body)
        self.executing.append(orjson.loads(answer.content)["effect"]["id"])
        return answer.status_code

    def commit(self) -> int:
        effect = self.executing.pop()
        return self._post(f"/api/v1/effects/{effect}/commit", {"result": {"sent": True}}).status_code

    def replay(self) -> int:
        session, body = self.committed[len(self.committed) // 2]
        return self._post(f"/api/v1/sessions/{session}/intercept", body).status_code

    def irreversible(self) -> int:
        # Each irreversible call holds its session, so each gets a session of its own.
        session = self._session()
        step = next(self.steps)
        return self._post(f"/api/v1/sessions/{session}/intercept",
                          {"tool": "delete_account", "step_index": step, "args": {"account_id": step}}).status_code


    def fresh_sessions(self, count: int) -> None:
        """Sessions made before the clock starts: a held call holds its session, so each irreversible
        call gets one of its own (the same for every kind), and making it is not the call's cost."""
        from effects.models import Session
        from orgs.models import Agent

        agent = Agent.objects.get(name=self.agent, org__slug="bench-hot")
        self.fresh = [str(s.pk) for s in Session.objects.bulk_create(
            Session(org_id=agent.org_id, agent=agent) for _ in range(count))]

    def _irreversible(self, tool: str, args: dict) -> int:
        session = self.fresh.pop()
        step = next(self.steps)
        return self._post(f"/api/v1/sessions/{session}/intercept",
                          {"tool": tool, "step_index": step, "args": args}).status_code

    def by_rule(self) -> int:
        return self._irreversible("refund", {"amount": 10, "order": next(self.steps)})

    def by_grant(self) -> int:
        return self._irreversible("archive_account", {"account_id": next(self.steps)})

    def held(self) -> int:
        return self._irreversible("refund", {"amount": 500, "order": next(self.steps)})

    @staticmethod
    def by_pipeline(op: Callable[[], int]) -> Callable[[], int]:
        """`op` with the fast approval path off (lifecycle/intercept/two_statements.py): the pipeline answers, as
        before issue 26, in the same run."""
        from lifecycle.intercept import two_statements

        def slow() -> int:
            fast, two_statements.intercept = two_statements.intercept, lambda *args: None
            try:
                return op()
            finally:
                two_statements.intercept = fast

        slow.__name__ = f"{op.__name__} (pipeline)"
        return slow


ROUNDS = 5


def statements_of(op: Callable[[], int], expect: int) -> list[str]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        status = op()
    assert status == expect, f"{op.__name__} answered {status}, expected {expect}"
    return [q["sql"] for q in queries.captured_queries
            if q["sql"].split(None, 1)[0].upper() not in ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")]


def timed(op: Callable[[], int], requests: int) -> tuple[list[float], float]:
    """Wall times (ms) of `requests` calls, and their CPU time (ms) in all."""
    walls, cpu_start = [], time.process_time()
    for _ in range(requests):
        started = time.perf_counter()
        op()
        walls.append((time.perf_counter() - started) * 1000)
    return walls, (time.process_time() - cpu_start) * 1000


def measure_all(plan: list, requests: int) -> dict[str, dict]:
    """Every kind in ROUNDS alternating rounds (the machine's drift, a neighbour's burst, falls
    on every kind alike instead of on whichever ran then), then p50, p99 and CPU per request."""
    results = {name: {"walls": [], "cpu": 0.0, "n": 0, "sql": statements_of(op, expect)}
               for name, op, expect, _ in plan}
    for _ in range(ROUNDS):
        for name, op, _, share in plan:
            n = max(1, int(requests * share) // ROUNDS)
            walls, cpu = timed(op, n)
            results[name]["walls"] += walls
            results[name]["cpu"] += cpu
            results[name]["n"] += n
    summary = {}
    for name, r in results.items():
        walls = sorted(r["walls"])
        summary[name] = {"p50": statistics.median(walls), "p99": walls[int(0.99 * (len(walls) - 1))],
                         "cpu": r["cpu"] / r["n"], "queries": len(r["sql"]), "sql": r["sql"]}
    return summary


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sql", action="store_true", help="print each kind's statements")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    setup_django()
    kinds = Kinds(*prepare())
    for _ in range(200):  # warm the pool, the caches and the planner
        kinds.baseline(), kinds.intercept(), kinds.commit(), kinds.replay()
    kinds.fresh_sessions(int(args.requests * 2.5) + 2000)
    for _ in range(30):
        kinds.by_rule(), kinds.by_grant(), kinds.held()
    # (name, request, its status, share of --requests): commits pop what intercepts pushed.
    plan = [("baseline INSERT", kinds.baseline, 201, 1), ("compensable intercept", kinds.intercept, 201, 1),
            ("commit", kinds.commit, 200, 1), ("replay", kinds.replay, 200, 1),
            ("intercept + 1 SAFE", kinds.intercept_with_safe, 201, 1),
            ("irreversible intercept", kinds.irreversible, 202, 0.2),
            ("irreversible by rule", kinds.by_rule, 202, 0.3), ("irreversible by grant", kinds.by_grant, 201, 0.3),
            ("irreversible held", kinds.held, 202, 0.3),
            ("by rule, pipeline", kinds.by_pipeline(kinds.by_rule), 202, 0.2),
            ("by grant, pipeline", kinds.by_pipeline(kinds.by_grant), 201, 0.2),
            ("held, pipeline", kinds.by_pipeline(kinds.held), 202, 0.2)]
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (a shared machine: compare ratios)")
    print(f"in-process WSGI stack, PostgreSQL, {args.requests} requests per kind in {ROUNDS} alternating rounds "
          "(wall ms, CPU ms, SQL)")
    results = measure_all(plan, args.requests)
    base = results["baseline INSERT"]
    for name, r in results.items():
        print(f"  {name:24} p50 {r['p50']:6.2f} p99 {r['p99']:6.2f} cpu {r['cpu']:5.2f} "
              f"sql {r['queries']:2} | time x{r['p50'] / base['p50']:4.2f} of baseline "
              f"(throughput ratio {base['cpu'] / r['cpu']:4.2f})")
        if args.sql:
            for sql in r["sql"]:
                print(f"      {sql[:160]}")
    if args.profile:
        for name, op, calls in (("the compensable intercept", kinds.intercept, 500),
                                ("the irreversible intercept an approve rule decides", kinds.by_rule, 300),
                                ("the same, by the pipeline", kinds.by_pipeline(kinds.by_rule), 300)):
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(calls):
                op()
            profiler.disable()
            print(f"  top costs of {name} (own time, {calls} calls):")
            stats = pstats.Stats(profiler)
            stats.sort_stats("tottime").print_stats(12)
            if op is kinds.intercept:
                stats.sort_stats("cumulative").print_stats(45)
    return results


if __name__ == "__main__":
    main()
