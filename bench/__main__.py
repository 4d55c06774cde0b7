"""`make bench`: every benchmark in turn. Each prints ratios against a baseline of its own run."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = ["bench.intercept", "bench.undo", "bench.dashboard", "bench.sdk_safe"]


def main() -> int:
    for name in BENCHMARKS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # not written yet
            raise
        print(f"\n== {name}")
        module.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main())
