"""How long a held irreversible call takes to reach the reviewers' dashboards (issue 26's "the
reviewer's push still lands within the dashboard's current latency"), with the fast approval
path's fan-out gathered over its window (`UNDOLOG_FANOUT_WINDOW_MS`, 50 ms) beside the same
server fanning each event out alone (window 0, as before the window), in the same run.

A listener joins the org's group on the real Redis channel layer (what each dashboard socket
hears); an agent sends held calls to gunicorn (sync workers, production settings, PostgreSQL),
one every `--pace-ms` (an agent's pace) and, in a second pass, back to back. Each call's latency
runs from sending it until its `approval.requested` message (alone or inside an `event.batch`)
reaches the listener.

    python -m bench.push [--calls 200] [--pace-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/undolog_bench_push")

from bench.common import Server, bench_org, setup_django


def measure(base: str, key: str, group: str, sessions: list[str], pace_s: float) -> list[float]:
    """Each call's milliseconds from its request to its message on the group."""
    import httpx
    from channels.layers import get_channel_layer

    async def scenario() -> list[float]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
        sent: dict[str, float] = {}
        arrived: dict[str, float] = {}

        async def listen() -> None:
            while len(arrived) < len(sessions):
                message = await layer.receive(channel)
                now = time.perf_counter()
                batch = message.get("messages") if message["type"] == "event.batch" else [message]
                for one in batch or []:
                    if one["type"] == "approval.requested":
                        arrived.setdefault(one["payload"]["session"], now)

        listener = asyncio.create_task(listen())
        async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {key}"}) as agent:
            for n, session in enumerate(sessions):
                sent[session] = time.perf_counter()
                answer = await agent.post(f"/api/v1/sessions/{session}/intercept", json={
                    "tool": "delete_account", "step_index": 1, "args": {"account_id": f"a{n}"}})
                assert answer.status_code == 202, answer.text
                await asyncio.sleep(pace_s)
        await asyncio.wait_for(listener, timeout=30)
        await layer.group_discard(group, channel)
        return [(arrived[s] - sent[s]) * 1000 for s in sessions]

    return asyncio.run(scenario())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--pace-ms", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    setup_django()
    from effects.models import Session

    bench = bench_org("bench-push", all_tiers=True)
    group = f"org.{bench.org.id}"
    results = {}
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} · gunicorn {args.workers} sync workers · "
          f"{args.calls} held calls per run · ms from the request to its message on the org's group")
    for window in ("0", "50"):
        os.environ["UNDOLOG_FANOUT_WINDOW_MS"] = window
        server = Server("gunicorn (sync)", args.workers)
        try:
            for pace_ms in (args.pace_ms, 0):
                fresh = [str(s.pk) for s in Session.objects.bulk_create(
                    Session(org=bench.org, agent=bench.agent) for _ in range(args.calls + 20))]
                measure(server.base, bench.key, group, fresh[:20], pace_ms / 1000)  # warm every worker
                found = sorted(measure(server.base, bench.key, group, fresh[20:], pace_ms / 1000))
                how = f"one call per {pace_ms} ms" if pace_ms else "back to back"
                p50, p99 = statistics.median(found), found[int(0.99 * (len(found) - 1))]
                results[(window, pace_ms)] = {"p50": p50, "p99": p99}
                print(f"  window {window:>2} ms, {how:18}: p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
                      f"max {found[-1]:6.1f} ms")
        finally:
            server.stop()
    os.environ.pop("UNDOLOG_FANOUT_WINDOW_MS")
    return results


if __name__ == "__main__":
    main()
