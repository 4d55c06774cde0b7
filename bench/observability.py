"""What observability costs the intercept, as deployed (gunicorn sync workers, production
settings, PostgreSQL), each measured beside its baseline in the same run:

1. Traces: compensable intercepts/s with tracing off, then on (the OTLP/HTTP exporter sending
   every span to a local collector stub: a real HTTP server in this process), then off again
   (how noisy the machine is). Metrics are on in all three (they are always on).
2. The audit chain: intercepts that each record an audit-worthy event (an observe-mode budget
   refusal: the call goes through and `permission_denied` is recorded) with no sealer, then
   with a sealer process sealing the org's chain as the beat does (every UNDOLOG_AUDIT_SEAL_S,
   2 s), and how many records it sealed meanwhile.

    python -m bench.observability [--seconds 6] [--workers 4] [--clients 16]
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import subprocess
import sys

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/undolog_bench_obs")

from bench.common import BASE_DIR, Server, bench_org, load, setup_django

KIND = "gunicorn (sync)"
SEAL_LOOP = """
import time, django, sys
django.setup()
from ops import audit
from django.conf import settings
org, stop = sys.argv[1], time.monotonic() + float(sys.argv[2])
sealed = 0
while time.monotonic() < stop:
    sealed += audit.seal(org)
    time.sleep(settings.UNDOLOG_AUDIT_SEAL_S)
print(sealed)
"""


def intercepts(agent: str):
    counter = itertools.count()

    def make(client, n: int):
        session: dict = {}

        async def op() -> bool:
            if "id" not in session:
                session["id"] = (await client.post("/api/v1/sessions", json={"agent": agent})).json()["id"]
            step = next(counter)
            answer = await client.post(f"/api/v1/sessions/{session['id']}/intercept", json={
                "tool": "send_email", "step_index": step, "args": {"to": f"user{step}@example.com"}})
            return answer.status_code == 201

        return op

    return make


def measure(agent: str, key: str, args, **env: str):
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        server = Server(KIND, args.workers)
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
    try:
        headers = {"Authorization": f"Bearer {key}"}
        load(intercepts(agent), clients=args.clients, seconds=1, base=server.base, headers=headers)  # warm up
        return load(intercepts(agent), clients=args.clients, seconds=args.seconds, base=server.base, headers=headers)
    finally:
        server.stop()


def line(label: str, result, baseline=None, of: str = "off") -> str:
    ratio = f" | x{result.rate / baseline.rate:4.2f} of {of}" if baseline else ""
    return (f"  {label:34} {result.rate:7.1f}/s p50 {result.p50:6.1f} ms p99 {result.pct(99):6.1f} ms "
            f"errors {result.errors}{ratio}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args(argv)
    setup_django()
    from budgets.models import BudgetPolicy
    from tests.otlp import Collector

    plain = bench_org("bench-obs")
    audited = bench_org("bench-audit")
    BudgetPolicy.objects.create(org=audited.org, agent=audited.agent, max_tool_calls_per_run=0, mode="observe")
    print(f"observability · {KIND}, {args.workers} workers · {args.clients} clients · {args.seconds:g} s each")

    off = measure(plain.agent.name, plain.key, args)
    print(line("tracing off", off))
    with Collector() as collector:
        on = measure(plain.agent.name, plain.key, args, OTEL_EXPORTER_OTLP_ENDPOINT=collector.url,
                     OTEL_BSP_SCHEDULE_DELAY="200")
    print(line("tracing on (OTLP to a local stub)", on, off))
    again = measure(plain.agent.name, plain.key, args)
    print(line("tracing off again", again, off))
    print(f"    the stub received {len(collector.spans)} spans in {collector.requests} exports")

    no_seal = measure(audited.agent.name, audited.key, args)
    print(line("audited calls, no sealer", no_seal))
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings"}
    sealer = subprocess.Popen([sys.executable, "-c", SEAL_LOOP, str(audited.org.id), str(args.seconds + 8)],
                              cwd=BASE_DIR, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        sealing = measure(audited.agent.name, audited.key, args)
        out, _ = sealer.communicate(timeout=60)  # it stops by itself, a little after the load
    finally:
        if sealer.poll() is None:
            os.killpg(sealer.pid, signal.SIGTERM)
    print(line("audited calls, sealer as the beat", sealing, no_seal, of="no sealer"))
    print(f"    the sealer sealed {out.strip() or '?'} records while it ran")
    from ops import audit
    from ops.models import AuditChain

    audit.seal(audited.org.id)
    chain = AuditChain.objects.get(org=audited.org)
    broken = audit.verify(audited.org)
    print(f"    chain: {chain.seq} records, verify {'ok' if broken is None else broken}")
    return {"off": off, "on": on, "again": again, "no_seal": no_seal, "sealing": sealing}


if __name__ == "__main__":
    main()
