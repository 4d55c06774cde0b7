"""`make bench`: every benchmark in turn, each in its own process (each sets Django up with its
own settings and database). Each prints ratios against a baseline measured in its own run."""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = ["bench.hotpath", "bench.throughput", "bench.push", "bench.intercept", "bench.run_aware", "bench.undo",
              "bench.rollback",
              "bench.dashboard", "bench.size", "bench.sdk_safe", "bench.agentdojo", "bench.gateway",
              "bench.observability", "bench.preimage", "bench.soak"]


def main() -> int:
    failed = []
    for name in BENCHMARKS:
        print(f"\n== {name}", flush=True)
        if subprocess.run([sys.executable, "-m", name]).returncode != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
