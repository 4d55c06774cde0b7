"""Compensable intercept + commit pairs against the server as deployed, on PostgreSQL.

For each server (gunicorn/WSGI and uvicorn/ASGI, same worker count) it measures, in the
same run: the pair (POST intercept, POST commit) and a baseline request that does one
INSERT. It prints pairs/s, p50/p99 per pair, the ratio to the baseline, and the peak RSS
of the server and of a Celery worker. Machines here are noisy: read the ratios.

Then the irreversible intercept (the calls approval rules decide) in an org with 50 rules
against one with none, on gunicorn: each request is a call of a fresh run that goes on to
wait for a person (no rule matches, so both orgs do the same writes), so the difference is
finding and evaluating the rules. Rounds alternate between the two orgs; the goal is 50
rules within 5 % of none (approvals/rules.py: cached per org, evaluated in ~0.5 µs each).

    python -m bench.intercept [--clients 16] [--seconds 8] [--workers 2] [--rules-only]
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import subprocess
import sys

from bench.common import BASE_DIR, Server, bench_org, load, peak_rss_mb, setup_django


def prepare() -> tuple[str, str]:
    """The bench org, agent, key and tools (fresh each run) and the baseline table."""
    bench = bench_org("bench")
    return bench.agent.name, bench.key


def pair_op(agent: str):
    counter = itertools.count()

    def make(client, n: int):
        session: dict = {}

        async def op() -> bool:
            if "id" not in session:
                response = await client.post("/api/v1/sessions", json={"agent": agent})
                session["id"] = response.json()["id"]
            step = next(counter)
            answer = await client.post(f"/api/v1/sessions/{session['id']}/intercept",
                                       json={"tool": "send_email", "step_index": step,
                                             "args": {"to": f"user{step}@example.com", "subject": "hi"}})
            if answer.status_code != 201:
                return False
            effect = answer.json()["effect"]["id"]
            committed = await client.post(f"/api/v1/effects/{effect}/commit", json={"result": {"sent": True}})
            return committed.status_code == 200

        return op

    return make


RULES = 50
ROUNDS = 3


def rules_org(slug: str, rules: int) -> tuple[str, list[str]]:
    """An org with an irreversible `refund`, `rules` rules that all concern it and none of which
    matches the bench's calls, and enough fresh runs (one call each) for every round."""
    from approvals.rules import Rule
    from effects.models import Session, Tool

    bench = bench_org(slug)
    Tool.objects.create(org=bench.org, name="refund", tier="irreversible", approval_reason="Money leaves",
                        risk_tags=["payments"])
    for n in range(rules):
        Rule.add(bench.org, {"name": f"rule-{n}", "position": n, "outcome": ("approve", "deny", "require")[n % 3],
                             "approvals_required": 2, "mode": "enforce" if n % 5 else "observe",
                             "condition": f'tool.name == "refund" && args.amount == {100_000 + n} && '
                                          f'"payments" in tool.risk_tags && now.hour >= 0'}, actor="bench")
    sessions = Session.objects.bulk_create(Session(org=bench.org, agent=bench.agent) for _ in range(40_000))
    return bench.key, [str(s.id) for s in sessions]


def refund_op(sessions: list[str]):
    ids = iter(sessions)

    def make(client, n: int):
        async def op() -> bool:
            answer = await client.post(f"/api/v1/sessions/{next(ids)}/intercept",
                                       json={"tool": "refund", "step_index": 1, "args": {"amount": 42}})
            return answer.status_code == 202 and answer.json()["effect"]["state"] == "pending"

        return op

    return make


def rules_section(args) -> dict:
    """Irreversible intercepts/s with 50 rules and with none, alternating rounds on one server."""
    orgs = {"none": rules_org("bench-norules", 0), f"{RULES} rules": rules_org("bench-rules", RULES)}
    print(f"irreversible intercept, {RULES} rules vs none · {args.clients} clients · {ROUNDS} rounds of "
          f"{args.seconds / 2:g} s each · gunicorn (WSGI), {args.workers} workers")
    server = Server("gunicorn (WSGI)", args.workers)
    runs: dict[str, list] = {name: [] for name in orgs}
    try:
        for key, sessions in orgs.values():  # warm both: keys remembered, rules loaded
            load(refund_op(sessions[:200]), clients=2, seconds=0.5, base=server.base,
                 headers={"Authorization": f"Bearer {key}"})
        offset = 200
        for _ in range(ROUNDS):
            for name, (key, sessions) in orgs.items():
                result = load(refund_op(sessions[offset:]), clients=args.clients, seconds=args.seconds / 2,
                              base=server.base, headers={"Authorization": f"Bearer {key}"})
                runs[name].append(result)
            offset += 6000
    finally:
        server.stop()
    summary = {}
    for name, results in runs.items():
        best = max(results, key=lambda r: r.rate)
        summary[name] = best
        print(f"  {name:9} best of {ROUNDS}: {best.rate:7.1f}/s p50 {best.p50:6.1f} ms p99 {best.pct(99):6.1f} ms "
              f"errors {sum(r.errors for r in results)} · rounds {', '.join(f'{r.rate:.0f}' for r in results)}/s")
    none, many = summary["none"], summary[f"{RULES} rules"]
    slower = (none.rate / many.rate - 1) * 100
    print(f"  {RULES} rules cost {slower:+.1f} % of throughput, p50 {many.p50 - none.p50:+.2f} ms "
          f"(goal: within 5 %) -> {'ok' if slower <= 5 else 'over the goal'}")
    return {"none": none, "rules": many, "slower_pct": slower}


def baseline_op(client, n: int):
    async def op() -> bool:
        return (await client.post("/bench/baseline")).status_code == 201

    return op


def start_worker() -> subprocess.Popen:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings"}
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "undolog_site", "worker", "--loglevel",
                             "WARNING", "--concurrency", "2"], cwd=BASE_DIR, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rules-only", action="store_true", help="only the 50 rules vs none comparison")
    args = parser.parse_args(argv)
    setup_django()
    if args.rules_only:
        return {"rules": rules_section(args)}
    agent, key = prepare()
    worker = start_worker()
    headers = {"Authorization": f"Bearer {key}"}
    results = {}
    print(f"intercept+commit pairs vs a one-INSERT baseline · {args.clients} clients · {args.seconds:g} s each "
          f"· {args.workers} server workers · PostgreSQL")
    try:
        for kind in ("gunicorn (WSGI)", "uvicorn (ASGI)"):
            server = Server(kind, args.workers)
            try:
                load(baseline_op, clients=args.clients, seconds=1, base=server.base)  # warm up
                base = load(baseline_op, clients=args.clients, seconds=args.seconds, base=server.base)
                pair = load(pair_op(agent), clients=args.clients, seconds=args.seconds, base=server.base,
                            headers=headers)
                rss = server.peak_rss_mb()
            finally:
                server.stop()
            results[kind] = (pair, base, rss)
            print(f"  {kind:16} pairs {pair.rate:7.1f}/s p50 {pair.p50:6.1f} ms p99 {pair.pct(99):6.1f} ms "
                  f"errors {pair.errors} | baseline {base.rate:7.1f}/s p50 {base.p50:5.1f} ms p99 "
                  f"{base.pct(99):5.1f} ms | pair/baseline time x{base.rate / pair.rate:4.2f} "
                  f"| server peak RSS {rss:5.0f} MB")
    finally:
        worker_rss = peak_rss_mb(worker.pid)
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=20)
    print(f"  celery worker peak RSS {worker_rss:.0f} MB")
    wsgi, asgi = results["gunicorn (WSGI)"][0], results["uvicorn (ASGI)"][0]
    winner = "gunicorn (WSGI)" if wsgi.rate >= asgi.rate else "uvicorn (ASGI)"
    print(f"  WSGI/ASGI pair throughput ratio {wsgi.rate / asgi.rate:4.2f} -> serve /api/ from {winner}")
    rules = rules_section(args)
    return {"results": results, "winner": winner, "worker_rss_mb": worker_rss, "rules": rules}


if __name__ == "__main__":
    main()
