"""The hot path's throughput and latency as deployed: gunicorn (production settings) on
PostgreSQL, driven by wrk (a C load generator, so the client does not take the server's CPU), each
kind beside a bare Django view doing one INSERT, in the same round.

Kinds: the baseline INSERT; a compensable intercept (a new call each time, over 16 sessions);
the same with one SAFE call reported; a replay; a commit; an irreversible intercept (a fresh
session each, since it holds its session for a reviewer). Each kind under both of gunicorn's
worker classes: sync workers (`--connections`, 8 by default) and `gthread` as the README deploys
it (`--threads` 8 a worker, with workers x threads connections, so that every thread has one to
serve). Every round is printed (its rate, the baseline's and their ratio), then the median and the
spread (lowest-highest) of the ratios. Then one client alone, for p50/p99, against the sync workers
and against gthread with keep-alive; last, the compensable intercept under uvicorn (ASGI) with the
same workers, beside its own baseline.

    python -m bench.throughput [--seconds 5] [--workers 4] [--connections 8] [--rounds 5]
                               [--servers sync,gthread]
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/undolog_bench_tp")

from bench.common import BASE_DIR, GTHREADS, Server, bench_org, setup_django

_RUNS = itertools.count()  # each wrk run makes new calls: a repeated one would be a replay

LUA = """
local items, n, kind = {}, 0, "%(kind)s"
local token = "%(token)s"
for line in io.lines("%(items)s") do items[#items + 1] = line end
threads_seen = 0
function setup(thread) threads_seen = threads_seen + 1; thread:set("offset", threads_seen) end
function init(args) n = offset * 10000000 + %(round)d * 1000000 end  -- no two runs repeat a call
function request()
  n = n + 1
  local headers = {["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json"}
  -- Each thread calls its own share of the sessions in turn: a run's calls come one after
  -- another, as an agent makes them, not two at once from two clients.
  local share = math.max(1, math.floor(#items / %(threads)d))
  local item = items[((offset - 1) * share) %% #items + (n %% share) + 1]
  if kind == "baseline" then return wrk.format("POST", "/bench/baseline", headers, "") end
  if kind == "intercept" then
    return wrk.format("POST", "/api/v1/sessions/" .. item .. "/intercept", headers,
      '{"tool":"send_email","step_index":' .. n .. ',"args":{"to":"u' .. n .. '@x.io","subject":"hi"}}')
  end
  if kind == "intercept+safe" then
    return wrk.format("POST", "/api/v1/sessions/" .. item .. "/intercept", headers,
      '{"tool":"send_email","step_index":' .. (2 * n + 1) .. ',"args":{"to":"s' .. n .. '@x.io"},' ..
      '"safe_calls":[{"tool":"list_accounts","step_index":' .. (2 * n) .. ',"args":{}}]}')
  end
  if kind == "replay" then
    return wrk.format("POST", "/api/v1/sessions/" .. item .. "/intercept", headers,
      '{"tool":"send_email","step_index":1,"args":{"to":"replayed@x.io","subject":"hi"}}')
  end
  if kind == "commit" then
    item = items[n - offset * 10000000 - %(round)d * 1000000 + (offset - 1) * math.floor(#items / %(threads)d)]
    return wrk.format("POST", "/api/v1/effects/" .. item .. "/commit", headers, '{"result":{"sent":true}}')
  end
  if kind == "irreversible" then
    item = items[n - offset * 10000000 - %(round)d * 1000000 + (offset - 1) * math.floor(#items / %(threads)d)]
    return wrk.format("POST", "/api/v1/sessions/" .. item .. "/intercept", headers,
      '{"tool":"delete_account","step_index":1,"args":{"account_id":"' .. n .. '"}}')
  end
  if kind == "rule" or kind == "grant" then
    item = items[n - offset * 10000000 - %(round)d * 1000000 + (offset - 1) * math.floor(#items / %(threads)d)]
    local call = kind == "rule" and '{"tool":"refund","step_index":1,"args":{"amount":10,"order":"' .. n .. '"}}'
      or '{"tool":"archive_account","step_index":1,"args":{"account_id":"' .. n .. '"}}'
    return wrk.format("POST", "/api/v1/sessions/" .. item .. "/intercept", headers, call)
  end
end
%(pace)s
"""
# One client as an agent calls: one call, then its model thinks (here 20 ms) before the next. A
# back-to-back client leaves the worker no time between calls for the fast approval path's
# fan-out (off the request thread, in the same process: it shares the interpreter's lock).
PACE = "function delay() return %d end"


# One client alone, each kind (the irreversible ones on fresh sessions, a slice of them per run).
ALONE = [("compensable intercept", "intercept"), ("irreversible by rule", "rule"),
         ("irreversible by grant", "grant"), ("irreversible held", "irreversible")]
ITEMS = {"rule": "rule", "grant": "grant", "irreversible": "fresh"}
ALONE_RUNS = 4  # one-client runs of each irreversible kind: sync, keep-alive warm-up, back-to-back, paced


def prepare(commits: int, irreversible: int, alone: int = 0) -> dict:
    """The org, its key, tools, 16 running sessions, executing effects to commit, fresh sessions
    (and `alone` more of each irreversible kind for the one-client runs)."""
    from django.db import connection
    from django.utils import timezone

    from effects.models import Effect, SafeCall, Session, UndoEntry

    bench = bench_org("bench-tp", all_tiers=True)
    org, agent, key, send = bench.org, bench.agent, bench.key, bench.send
    fn = send.compensation_fn
    running = Session.objects.bulk_create(Session(org=org, agent=agent) for _ in range(16))
    held = Session.objects.bulk_create(Session(org=org, agent=agent) for _ in range(commits // 500 + 1))
    now = timezone.now()
    effects = Effect.objects.bulk_create(
        Effect(org=org, session=held[n % len(held)], tool=send, tool_name=send.name, tier=send.tier, step_index=n,
               call_signature=uuid.uuid4().hex * 2, args={"to": f"c{n}@x.io"}, args_digest="-",
               state=Effect.State.EXECUTING, created=now, updated=now) for n in range(commits))
    UndoEntry.objects.bulk_create(
        UndoEntry(session_id=e.session_id, effect=e, step_index=e.step_index, fn=fn, fn_name=fn.fn_name,
                  fn_version=fn.fn_version, args={"to": e.args["to"]}) for e in effects)
    fresh = Session.objects.bulk_create(Session(org=org, agent=agent) for _ in range(irreversible))
    # Irreversible calls an approve rule or a grant decides at once (issue 26): a fresh session
    # each too, so that every kind of irreversible call meets the same run.
    by_rule = Session.objects.bulk_create(Session(org=org, agent=agent) for _ in range(irreversible))
    by_grant = Session.objects.bulk_create(Session(org=org, agent=agent) for _ in range(irreversible))
    # SAFE calls of earlier runs, as a deployment has: analyzed empty, effects_safecall would give
    # the fast path's prepared statements a plan made for no rows, which then scans the rows the
    # bench adds (autovacuum, off on some machines, would have re-analyzed it by now).
    SafeCall.objects.bulk_create(SafeCall(session=held[n % len(held)], tool_name="list_inactive_accounts",
                                          step_index=n, args={"n": n}) for n in range(commits))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    spare = {f"alone {kind}": [str(s.id) for s in Session.objects.bulk_create(
        Session(org=org, agent=agent) for _ in range(alone))] for kind in ITEMS.values()}
    return {"key": key, "running": [str(s.id) for s in running], "effects": [str(e.id) for e in effects],
            "fresh": [str(s.id) for s in fresh], "rule": [str(s.id) for s in by_rule],
            "grant": [str(s.id) for s in by_grant], **spare}


def wrk(base: str, kind: str, items: list[str], token: str, *, seconds: float, connections: int,
        threads: int = 2, offset: int = 0, slices: int = 1, pace_ms: int = 0) -> dict:
    """One wrk run. Kinds that use each item once (commit, irreversible) take the `offset`-th
    slice of the items, so rounds never reuse one."""
    var = Path(os.environ.get("UNDOLOG_VAR_DIR", BASE_DIR / "var"))
    var.mkdir(exist_ok=True)
    items_file, script = var / f"bench-wrk-{kind}.txt", var / f"bench-wrk-{kind}.lua"
    if kind in ("commit", "irreversible", "rule", "grant"):
        share = len(items) // slices
        items = items[offset * share:(offset + 1) * share]
    items_file.write_text("\n".join(items) + "\n")
    script.write_text(LUA % {"kind": kind, "token": token, "items": items_file, "threads": threads,
                             "round": next(_RUNS), "pace": PACE % pace_ms if pace_ms else ""})
    command = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{max(1, round(seconds))}s", "--latency",
               "-s", str(script), base]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rate": rate, "p50": _ms(out, "50%"), "p99": _ms(out, "99%"), "errors": int(errors.group(1)) if errors
            else 0, "raw": out}


def _ms(out: str, label: str) -> float:
    value, unit = re.search(rf"{re.escape(label)}\s+([\d.]+)(us|ms|s)", out).groups()
    return float(value) * {"us": 0.001, "ms": 1, "s": 1000}[unit]


def ensure_wrk() -> None:
    if shutil.which("wrk"):
        return
    print("installing Debian's wrk for the throughput benchmark", flush=True)
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "wrk"], check=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--servers", default="sync,gthread", help="gunicorn worker classes, in turn")
    args = parser.parse_args(argv)
    servers = [name.strip() for name in args.servers.split(",") if name.strip()]
    if not servers or set(servers) - set(CLASSES):
        parser.error(f"--servers takes {', '.join(CLASSES)}")
    ensure_wrk()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    setup_django()
    # Each (server, round) takes a slice of the commit and irreversible items of its own, and one
    # more slice of the irreversible ones is kept for one client alone.
    slices = args.rounds * len(servers)
    data = prepare(commits=int(3000 * args.seconds * slices),
                   irreversible=int(1200 * args.seconds * (slices + 1)),
                   alone=int(500 * args.seconds * ALONE_RUNS))
    # The replay's call, committed once before the clock starts.
    import httpx

    replayed = data["running"][0]
    plan = [("compensable intercept", "intercept", data["running"]),
            ("intercept + 1 SAFE", "intercept+safe", data["running"]), ("replay", "replay", [replayed]),
            ("commit", "commit", data["effects"]), ("irreversible intercept", "irreversible", data["fresh"]),
            ("irreversible by rule", "rule", data["rule"]), ("irreversible by grant", "grant", data["grant"])]
    results: dict = {}
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (a shared machine: compare ratios)")
    for index, worker_class in enumerate(servers):
        kind_of, connections = CLASSES[worker_class](args)
        server = Server(kind_of, args.workers)
        try:
            if index == 0:  # the replay's call, committed once before the clock starts
                httpx.post(f"{server.base}/api/v1/sessions/{replayed}/intercept",
                           headers={"Authorization": f"Bearer {data['key']}"},
                           json={"tool": "send_email", "step_index": 1,
                                 "args": {"to": "replayed@x.io", "subject": "hi"}}).raise_for_status()
            print(f"gunicorn {args.workers} {worker_class} workers{THREADS[worker_class]} · wrk {connections} "
                  f"connections · {args.rounds} rounds of {args.seconds:g} s each, every round beside its own "
                  "baseline · PostgreSQL · production settings")
            measured = rounds_of(server, data, plan, args, connections, first_slice=index * args.rounds,
                                 slices=slices)
        finally:
            server.stop()
        results.update(measured if index == 0 else {f"{name} ({worker_class})": r for name, r in measured.items()})
    results.update(one_client(data, args))
    results.update(asgi_beside(data, args, results["compensable intercept"]["rate"]))
    return results


# gunicorn's worker classes: the server, and the connections that keep every worker (or thread) busy.
CLASSES = {"sync": lambda args: ("gunicorn (sync)", args.connections),
           "gthread": lambda args: ("gunicorn (WSGI)", args.workers * GTHREADS)}
THREADS = {"sync": "", "gthread": f" x {GTHREADS} threads"}


def rounds_of(server: Server, data: dict, plan: list, args: argparse.Namespace, connections: int, *,
              first_slice: int, slices: int) -> dict:
    """Every kind, `args.rounds` rounds each, each round the baseline then the kind; every round
    printed, then the median ratio and the spread."""
    wrk(server.base, "baseline", data["running"], data["key"], seconds=1, connections=connections)  # warm
    wrk(server.base, "intercept", data["running"], data["key"], seconds=1, connections=connections)
    results = {}
    for name, kind, items in plan:
        # Rounds alternate baseline and kind, and the ratio is taken per round: this machine's
        # load drifts, and a drift between two long runs would read as a ratio.
        rounds = []
        for n in range(args.rounds):
            base = wrk(server.base, "baseline", data["running"], data["key"], seconds=args.seconds,
                       connections=connections)
            # Irreversible kinds: one more slice is kept for one client alone.
            r = wrk(server.base, kind, items, data["key"], seconds=args.seconds, connections=connections,
                    offset=first_slice + n, slices=slices + (kind != "commit"))
            rounds.append((r["rate"] / base["rate"], r, base))
            print(f"    {name:24} round {n + 1}: {r['rate']:8.1f} req/s, baseline {base['rate']:8.1f} req/s, "
                  f"x{r['rate'] / base['rate']:4.2f}  p50 {r['p50']:6.2f} ms  p99 {r['p99']:6.2f} ms  "
                  f"non-2xx {r['errors']}", flush=True)
        ratios = sorted(x[0] for x in rounds)
        ratio, r, base = sorted(rounds, key=lambda x: x[0])[len(rounds) // 2]
        results[name] = {**r, "ratio": ratio, "baseline": base["rate"], "ratios": ratios,
                         "rates": [x[1]["rate"] for x in rounds]}
        print(f"  {name:24} {r['rate']:8.1f} req/s  x{ratio:4.2f} of the baseline (median of {args.rounds}; "
              f"spread x{ratios[0]:4.2f}-x{ratios[-1]:4.2f}; rates {min(results[name]['rates']):.0f}-"
              f"{max(results[name]['rates']):.0f} req/s)  p50 {r['p50']:6.2f} ms  p99 {r['p99']:6.2f} ms", flush=True)
    return results


def one_client(data: dict, args: argparse.Namespace) -> dict:
    """One client alone, for p50/p99: against the sync workers (a connection per call), then
    against gthread with keep-alive, back-to-back and paced as an agent calls."""
    results = {}
    server = Server("gunicorn (sync)", args.workers)
    try:
        for kind in ("baseline", "intercept"):  # a fresh server: every worker's first calls warm it
            wrk(server.base, kind, data["running"], data["key"], seconds=1, connections=args.connections)
        alone = wrk(server.base, "intercept", data["running"], data["key"], seconds=args.seconds, connections=1,
                    threads=1)
        results["one client"] = alone
        print(f"  one client, compensable intercept: p50 {alone['p50']:.2f} ms  p99 {alone['p99']:.2f} ms "
              f"({alone['rate']:.0f} req/s)")
        slots = {kind: iter(range(ALONE_RUNS)) for kind in ITEMS}  # a fresh slice of sessions each run

        def fresh(kind: str) -> dict:
            return {"offset": next(slots[kind]), "slices": ALONE_RUNS}

        for name, kind in ALONE[1:]:
            alone = wrk(server.base, kind, data[f"alone {ITEMS[kind]}"], data["key"], seconds=args.seconds,
                        connections=1, threads=1, **fresh(kind))
            results[f"one client, {name}"] = alone
            print(f"  one client, {name}: p50 {alone['p50']:.2f} ms  p99 {alone['p99']:.2f} ms "
                  f"({alone['rate']:.0f} req/s)  load {os.getloadavg()[0]:.2f}")
    finally:
        server.stop()
    # A sync worker closes the connection after each answer, so the one client above pays a TCP
    # connect per call. As the README deploys it (gthread, keep-alive) an agent's client keeps it.
    kept = Server("gunicorn (WSGI)", args.workers)
    try:
        # Warm every thread first, as the sync server was above: each worker thread opens its own
        # database connection and prepares its statements on its first call, and a worker loads
        # its caches on its first intercept. Unwarmed, those first calls (tens of ms each) were the p99.
        for kind in ("baseline", "intercept"):
            wrk(kept.base, kind, data["running"], data["key"], seconds=2, connections=args.workers * GTHREADS)
        wrk(kept.base, "rule", data["alone rule"], data["key"], seconds=1, connections=args.workers * GTHREADS,
            **fresh("rule"))
        next(slots["grant"]), next(slots["irreversible"])  # the same slices for every kind
        for pace in (0, 20):
            for name, kind in (("baseline", "baseline"), *ALONE):
                items, where = (data[f"alone {ITEMS[kind]}"], fresh(kind)) if kind in ITEMS else (data["running"], {})
                alone = wrk(kept.base, kind, items, data["key"], seconds=args.seconds, connections=1, threads=1,
                            pace_ms=pace, **where)
                results[f"one client kept alive{f', paced {pace} ms' if pace else ''}, {name}"] = alone
                how = f"one call per {pace} ms + its answer" if pace else "back-to-back"
                print(f"  one client, keep-alive (gthread, as deployed), {how}, {name:22}: p50 {alone['p50']:.2f} ms  "
                      f"p99 {alone['p99']:.2f} ms ({alone['rate']:.0f} req/s)  load {os.getloadavg()[0]:.2f}")
    finally:
        kept.stop()
    return results


def asgi_beside(data: dict, args: argparse.Namespace, wsgi_rate: float) -> dict:
    """The compensable intercept under uvicorn (ASGI), the same worker count and load: whether
    /api/ should be served by gunicorn or by the ASGI server that serves the websockets."""
    server = Server("uvicorn (ASGI)", args.workers)
    try:
        for kind in ("baseline", "intercept"):
            wrk(server.base, kind, data["running"], data["key"], seconds=1, connections=args.connections)
        base = wrk(server.base, "baseline", data["running"], data["key"], seconds=args.seconds,
                   connections=args.connections)
        r = wrk(server.base, "intercept", data["running"], data["key"], seconds=args.seconds,
                connections=args.connections)
    finally:
        server.stop()
    ratio = r["rate"] / base["rate"]
    print(f"  uvicorn {args.workers} workers, compensable intercept {r['rate']:8.1f} req/s  x{ratio:4.2f}"
          f" of its own baseline ({base['rate']:.0f} req/s)  p50 {r['p50']:6.2f} ms  p99 {r['p99']:6.2f} ms  "
          f"x{r['rate'] / wsgi_rate:4.2f} of gunicorn sync's intercept rate above")
    return {"uvicorn intercept": {**r, "ratio": ratio, "baseline": base["rate"]}}


if __name__ == "__main__":
    main()
