"""The Channels layer (settings' `CHANNEL_LAYERS`): channels-redis' `RedisChannelLayer`, whose
receive also stops when its task was asked to stop and the request was lost on the way.

Why: on Python 3.11 `asyncio.wait_for` drops a cancellation that arrives after the awaited
future finished but before `wait_for` resumed (https://github.com/python/cpython/issues/86296,
fixed in 3.12, where `wait_for` is built on `asyncio.timeout`). redis-py's asyncio connection
sends every command through `wait_for` when it has a `socket_timeout`
(`AbstractConnection.send_packed_command`), and on a unix socket a send finishes within one
loop step, so a consumer's receive task cancelled at that step (its socket closed, or the
tests' `async_to_sync` closing its loop) went on running. channels-redis' `receive_single`
then asks for the next message for ever: `BZPOPMIN` answers nothing every `brpop_timeout`
(5 s), and the read timeout of 15 s (settings.channel_layer_host) never ends the loop. With
the old 5 s read timeout the read lost its race with `BZPOPMIN` and the error ended the loop:
the bug was there, hidden. Seen as `tests/dashboard/test_consumer.py` hanging in its loop's
close after the 60 s quiet-dashboard browser test (embedded Redis); a leaked task per closed
socket, polling Redis every 5 s, in a server. Same family: redis/redis-py#2028.

A cancellation that was asked for is still counted by the task (`Task.cancelling()`: asyncio's
contract is that code which swallows one on purpose calls `uncancel()`), so the receive checks
it around each blocking round and ends as it should have: at most one round (5 s) late."""

from __future__ import annotations

import asyncio

from channels_redis.core import RedisChannelLayer as _RedisChannelLayer


def _raise_if_cancel_was_lost() -> None:
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError("a cancellation lost in asyncio.wait_for (cpython#86296)")


class RedisChannelLayer(_RedisChannelLayer):
    """channels-redis' layer; a receive asked to stop stops, even when asyncio lost the request."""

    async def _brpop_with_clean(self, index, channel, timeout):
        # Before a round and after it: a message popped meanwhile stays in channels-redis' backup
        # queue, and the next receive on the channel puts it back (a closed socket has none).
        _raise_if_cancel_was_lost()
        member = await super()._brpop_with_clean(index, channel, timeout)
        _raise_if_cancel_was_lost()
        return member
