"""Compensable intercept + commit pairs against the server as deployed, on PostgreSQL.

For each server (gunicorn/WSGI and uvicorn/ASGI, same worker count) it measures, in the
same run: the pair (POST intercept, POST commit) and a baseline request that does one
INSERT. It prints pairs/s, p50/p99 per pair, the ratio to the baseline, and the peak RSS
of the server and of a Celery worker. Machines here are noisy: read the ratios.

    python -m bench.intercept [--clients 16] [--seconds 8] [--workers 2]
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
    args = parser.parse_args(argv)
    setup_django()
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
    return {"results": results, "winner": winner, "worker_rss_mb": worker_rss}


if __name__ == "__main__":
    main()
