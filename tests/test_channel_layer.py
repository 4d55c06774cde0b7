"""The Channels layer as settings configure it, on the test Redis (the embedded one's unix socket,
or REDIS_URL's): a receive that is cancelled ends, whichever step of its Redis commands the
cancellation lands on (core/channel_layer.py says how Python 3.11 loses some of them)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

from channels.layers import channel_layers

ROUND_S = 0.5  # the layer's blocking round (BZPOPMIN), shortened from its 5 s for this test
STEPS = 40  # loop steps of a fresh receive: its connection's handshake and its first commands


def run_on_a_loop_of_its_own(coroutine, timeout_s: float):
    """Run `coroutine` on an event loop in a daemon thread: a receive that never ends (the bug)
    fails this test by its verdict instead of hanging the loop's close, as it hung test_consumer."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="cancelled-receives", daemon=True).start()
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout_s)


async def cancel_at(steps: int) -> tuple[bool, float]:
    """A fresh layer (a new connection, so the handshake's sends too), a receive on a quiet channel
    cancelled after `steps` loop steps: whether it ended cancelled within 3 s, and how long it took."""
    layer = channel_layers.make_backend("default")
    layer.brpop_timeout = ROUND_S
    receive = asyncio.ensure_future(layer.receive(await layer.new_channel()))
    for _ in range(steps):
        await asyncio.sleep(0)
    receive.cancel()
    started = time.monotonic()
    done, _ = await asyncio.wait([receive], timeout=3)
    took = time.monotonic() - started
    if done:
        await layer.close_pools()
    return bool(done) and receive.cancelled(), took


def test_a_receive_cancelled_at_any_step_ends_within_one_blocking_round():
    async def every_step() -> list[tuple[int, bool, float]]:
        return [(steps, *await cancel_at(steps)) for steps in range(STEPS)]

    outcomes = run_on_a_loop_of_its_own(every_step(), timeout_s=STEPS * 4 + 30)

    assert [steps for steps, ended, _ in outcomes if not ended] == [], outcomes
    assert max(took for _, _, took in outcomes) < ROUND_S + 1.5, outcomes
    if sys.version_info < (3, 12):
        # The race this guards is there: some cancellations were lost by asyncio.wait_for and the
        # layer ended those receives itself, one blocking round later (the others end at once).
        assert [steps for steps, _, took in outcomes if took >= ROUND_S * 0.8], outcomes
