"""The one backoff of every retried outbound call: deliveries (org webhooks' events, executors,
escalations, emails: `deliveries.Delivery.backoff`) and the undo walk's compensation attempts.

An exponential ceiling, base · 2^(attempt − 1), capped; the wait is drawn from the top
`spread` of it (AWS, "Exponential Backoff And Jitter"): spread 1 is full jitter (many walks
that failed together against one receiver come back spread out: the undo walk), 0 is the
ceiling itself (deliveries, whose doubling UNDOLOG_WEBHOOK_RETRY_BASE_MS documents)."""

from __future__ import annotations

import random
from typing import Protocol


class Draw(Protocol):
    def uniform(self, a: float, b: float) -> float: ...


def backoff_s(attempt: int, base_s: float, cap_s: float, *, spread: float = 1.0, rng: Draw = random) -> float:
    """Seconds to wait after the `attempt`-th failure (1-based)."""
    ceiling = min(base_s * 2 ** min(max(attempt, 1) - 1, 40), cap_s)
    return rng.uniform(ceiling * (1 - spread), ceiling) if spread else ceiling
