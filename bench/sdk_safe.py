"""Benchmark: the SDK's overhead on a SAFE call inside a session, over the bare function.

    python -m bench.sdk_safe [--calls N]

A SAFE call never touches the network: the SDK binds its args, numbers the step and
queues the report. That must cost under 20 µs per call (issue 7). The session here
runs on an httpx transport that fails any request after the session is opened, so
a network call would also fail the benchmark.

A SAFE tool labelled `untrusted` also reports what it returned (issue 25: the server keeps
fingerprints of it for `tainted()`): for a 10 KiB output that must add under 50 µs, counted
with the output's share of encoding the report it rides in (the next intercept's body).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

try:
    import undolog  # noqa: F401  (installed: `pip install -e ./sdk`, as requirements.txt does)
except ImportError:  # a checkout without it: use the source
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sdk" / "src"))

from undolog import ToolTier, UndoLogClient, undolog_tool
from undolog._http import dumps

GOAL_US = 20.0
OUTPUT_GOAL_US = 50.0
# An inbox read: ten mails of ~1 KiB, addresses and links in their bodies (what tainted() looks for).
INBOX = [{"id": n, "sender": f"user{n}@example.com", "subject": f"Quarterly numbers, part {n}",
          "body": (f"Hi team, the figures are attached; reply to finance-{n}@example.com or see "
                   f"https://intranet.example.com/reports/{n} before Friday. ") * 8}
         for n in range(10)]
assert 10 * 1024 <= len(dumps(INBOX)) <= 11 * 1024, len(dumps(INBOX))


def search(query: str, limit: int = 10) -> int:
    return limit


async def asearch(query: str, limit: int = 10) -> int:
    return limit


def read_inbox(query: str, limit: int = 10) -> list:
    return INBOX


safe_search = undolog_tool(search, tier=ToolTier.SAFE)
safe_asearch = undolog_tool(asearch, tier=ToolTier.SAFE)
safe_read_inbox = undolog_tool(read_inbox, tier=ToolTier.SAFE, labels=["untrusted"])


def offline_client() -> UndoLogClient:
    state = {"opened": False}

    def handler(request: httpx.Request) -> httpx.Response:
        if state["opened"]:
            raise AssertionError(f"SAFE path made a request: {request.method} {request.url}")
        state["opened"] = True
        return httpx.Response(201, json={"id": "s-1", "agent": "bench", "state": "running",
                                         "step_index": 0})

    transport = httpx.MockTransport(handler)
    return UndoLogClient("http://bench.invalid", "bench-key", transport=transport)


def per_call_us(fn: Callable[..., Any], calls: int) -> float:
    best = float("inf")
    for _ in range(5):  # best of 5 rounds, to keep scheduler noise out
        start = time.perf_counter()
        for _ in range(calls):
            fn("undolog", limit=5)
        best = min(best, time.perf_counter() - start)
    return best / calls * 1e6


async def aper_call_us(fn: Callable[..., Any], calls: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            await fn("undolog", limit=5)
        best = min(best, time.perf_counter() - start)
    return best / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sdk_safe")
    parser.add_argument("--calls", type=int, default=20_000)
    calls = parser.parse_args(sys.argv[1:] if argv is None else argv).calls
    session = offline_client().session(agent="bench")
    session.__enter__()
    bare, wrapped = per_call_us(search, calls), per_call_us(safe_search, calls)
    abare = asyncio.run(aper_call_us(asearch, calls))
    # asyncio.run copies the current context, so its task runs in the session too.
    awrapped = asyncio.run(aper_call_us(safe_asearch, calls))
    # Proof that the wrapped calls really went through the session (5 rounds each).
    assert len(session._safe) == 2 * 5 * calls, len(session._safe)
    session._safe.clear()  # the reports would go to the (fake) server on exit
    # The untrusted read: the call in the session, then its report encoded as the intercept does.
    plain, reading = per_call_us(read_inbox, calls), per_call_us(safe_read_inbox, calls)
    reports = list(session._safe)
    assert len(reports) == 5 * calls and reports[0]["output"] is INBOX, reports[0].keys()
    session._safe.clear()
    body = {"tool": "send_email", "args": {"to": "a@example.com"}, "step_index": 1}
    with_report = {**body, "safe_calls": reports[:1]}
    encode = (min(_timed(lambda: _encode(with_report, 1000)) for _ in range(5))
              - min(_timed(lambda: _encode(body, 1000)) for _ in range(5))) / 1000 * 1e6
    added = reading - plain + encode
    session._deactivate()
    worst = max(wrapped - bare, awrapped - abare)
    for label, b, w in (("sync ", bare, wrapped), ("async", abare, awrapped)):
        print(f"{label}: bare {b:6.2f} µs  SAFE in session {w:6.2f} µs  "
              f"overhead {w - b:6.2f} µs  ratio {w / b:5.1f}x")
    verdict = "OK" if worst < GOAL_US else "TOO SLOW"
    print(f"SAFE overhead per call: {worst:.2f} µs (goal < {GOAL_US:g} µs): {verdict}")
    print(f"untrusted read of a {len(dumps(INBOX)) / 1024:.1f} KiB output: call {reading - plain:5.2f} µs "
          f"+ its report's encoding {encode:5.2f} µs = {added:.2f} µs added "
          f"(goal < {OUTPUT_GOAL_US:g} µs): {'OK' if added < OUTPUT_GOAL_US else 'TOO SLOW'}")
    return 0 if worst < GOAL_US and added < OUTPUT_GOAL_US else 1


def _encode(body: dict, times: int) -> None:
    for _ in range(times):  # each body encoded and dropped, as a sent request's is
        dumps(body)


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(main())
