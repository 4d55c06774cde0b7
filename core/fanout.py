"""The event fan-out, for every app: one message to an org's Channels group (`publish`), and
the coalesced `session.updated` nudges a run's changes send to open dashboards
(`session_changed`, called by effects' models after commit).

Every event recorded with `Event.record` reaches the org's group `org.<org id>` as
`{"type": "<event kind>", "payload": <EventPayload>}` (approvals/notify.py builds the
payloads; approval events carry the request); a websocket consumer handles it in the method
named after the kind (`approval.requested` → `approval_requested`).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, NotRequired, TypedDict

from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone

log = logging.getLogger(__name__)


class EventPayload(TypedDict):
    """Every event: what happened, in which run, when, and the event's own data."""

    id: str
    kind: str
    org: str
    agent: str | None
    session: str | None
    created: str
    data: dict[str, Any]


# One state change inside a run ("from" is a keyword, hence the functional form).
SessionChange = TypedDict("SessionChange", {
    "what": str,  # "session" | "effect" | "undo_entry"
    "id": str,
    "step_index": "int | None",
    "name": str,  # the tool (effect), the compensation function (undo entry), "" (session)
    "from": "str | None",  # None: just created
    "to": str,
})


class SessionUpdatedPayload(TypedDict):
    """session.updated: a run, one of its effects or undo entries changed state. Not an `Event` row
    (no query, no webhook): a nudge to open dashboards, coalesced over `UNDOLOG_SESSION_UPDATE_WINDOW_MS`."""

    kind: str  # "session.updated"
    org: str
    session: str
    state: str | None  # the session's state after its last move in this batch; None: only effects or entries moved
    step_index: int | None  # the highest step the batch's changes name
    changes: list[SessionChange]  # in order, at most MAX_SESSION_CHANGES
    more: int  # changes left out of `changes` (a long burst)
    created: str


class Message(TypedDict):
    type: str
    payload: EventPayload | SessionUpdatedPayload
    text: NotRequired[str]


# The group message carrying one window's `session.updated` payloads of one org: a consumer sends
# each to its page as its own `session.updated`. Internal to the server (never a page's kind): one
# group send per org per window instead of one per session, each two Redis round trips even when
# no page is open (~0.15 ms of a worker's CPU per intercept under load, measured).
SESSION_UPDATES = "session.updates"


class SessionUpdatesMessage(TypedDict):
    type: str  # SESSION_UPDATES
    payloads: list[SessionUpdatedPayload]


# The group message carrying several events of one org at once (`publish_many`): a consumer sends
# each to its page as the message it is. Internal to the server, like SESSION_UPDATES.
EVENT_BATCH = "event.batch"


class EventBatchMessage(TypedDict):
    type: str  # EVENT_BATCH
    messages: list[Message]


def group_name(org_id: Any) -> str:
    return f"org.{org_id}"


# A message the layer has not taken by then is given up (and logged): a stuck Redis must not hold
# the request that published it. Pages re-read what they missed when they reconnect.
PUBLISH_TIMEOUT_S = 5.0


class LayerLoop:
    """One event loop per process, on a daemon thread, that every message to the channel layer is
    sent from.

    channels_redis keeps a connection pool per event loop, and `async_to_sync` runs each call on a
    new loop: each message opened and closed a Redis connection of its own (~2.2 ms of CPU and
    2.3-4 ms of wall time per publish, measured; every approval event paid it in its request).
    On one long-lived loop the pool's connection is kept from one message to the next."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a forked worker's loop thread did not survive the fork

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout_s: float = PUBLISH_TIMEOUT_S) -> Any:
        """Run `coroutine` on the loop and wait for its result (TimeoutError past `timeout_s`)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._running())
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="channel-layer", daemon=True).start()
                self._loop = loop
            return self._loop


layer_loop = LayerLoop()


def publish(org_id: Any, kind: str, payload: EventPayload | SessionUpdatedPayload) -> bool:
    """Send one message to the org's group. The layer may drop it (clients re-fetch on
    reconnect), so a failure is logged, never raised into the request that caused it."""
    return _group_send(org_id, Message(type=kind, payload=payload), kind)


def publish_many(org_id: Any, messages: list[Message]) -> bool:
    """`publish` for several events of one org: one group message (two Redis round trips and the
    asyncio client's work, whatever their number), or the message itself when there is one."""
    if len(messages) == 1:
        return publish(org_id, messages[0]["type"], messages[0]["payload"])
    return _group_send(org_id, EventBatchMessage(type=EVENT_BATCH, messages=messages), f"{len(messages)} events")


def _group_send(org_id: Any, message: Message | EventBatchMessage, what: str) -> bool:
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        layer_loop.run(layer.group_send(group_name(org_id), message))
    except Exception:  # Redis down must not fail a committed decision
        log.exception("could not publish %s to the org's channel group", what)
        return False
    return True


# ---------------------------------------------------------------- session.updated

MAX_SESSION_CHANGES = 20


class SessionUpdates:
    """Coalesces run changes into at most one `session.updated` per session per window, and
    publishes them from a background thread, one group message per org.

    `add()` is what a committed transaction calls (through `effects.models.announce`): it only
    updates a dict under a lock, with no query and no network, so the intercept and commit
    paths do not get slower. The thread waits `window_s` after the first change of a burst,
    then sends one message per org whose runs moved, on the process's `layer_loop` (so its Redis
    connection is reused from one batch to the next).
    A message the layer drops is not lost for good: pages re-read on every (re)connect.
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a forked worker starts its own thread
        # A short-lived process (a command, a task run) sends what it has when its main thread
        # ends. threading's hook runs before concurrent.futures refuses new work at interpreter
        # shutdown (which plain atexit runs after, so its flush could only fail).
        getattr(threading, "_register_atexit", atexit.register)(self.flush)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pending: dict[tuple[str, str], SessionUpdatedPayload] = {}
        self._thread: threading.Thread | None = None

    def add(self, org_id: Any, session_id: Any, change: SessionChange, *, state: str | None = None,
            step_index: int | None = None) -> None:
        key = (str(org_id), str(session_id))
        with self._lock:
            batch = self._pending.get(key)
            if batch is None:
                batch = self._pending[key] = SessionUpdatedPayload(
                    kind="session.updated", org=key[0], session=key[1], state=None, step_index=None,
                    changes=[], more=0, created="")
            if state is not None:
                batch["state"] = state
            steps = [s for s in (batch["step_index"], step_index, change["step_index"]) if s is not None]
            batch["step_index"] = max(steps) if steps else None
            if len(batch["changes"]) < MAX_SESSION_CHANGES:
                batch["changes"].append(change)
            else:
                batch["more"] += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="session-updates", daemon=True)
                self._thread.start()
        self._wake.set()

    def take(self) -> list[SessionUpdatedPayload]:
        with self._lock:
            batch, self._pending = list(self._pending.values()), {}
        now = timezone.now().isoformat()
        for payload in batch:
            payload["created"] = now
        return batch

    async def send(self, batch: list[SessionUpdatedPayload]) -> int:
        """Publish the payloads, one group message per org; the number of payloads sent. Never raises."""
        layer = get_channel_layer()
        if layer is None:
            return 0
        by_org: dict[str, list[SessionUpdatedPayload]] = {}
        for payload in batch:
            by_org.setdefault(payload["org"], []).append(payload)
        sent = 0
        for org, payloads in by_org.items():
            try:
                await layer.group_send(group_name(org), SessionUpdatesMessage(type=SESSION_UPDATES, payloads=payloads))
                sent += len(payloads)
            except Exception:  # Redis down: the pages catch up when they reconnect
                log.exception("could not publish session.updated for %d runs of org %s", len(payloads), org)
        return sent

    def flush(self) -> int:
        """Send what is waiting now, from the caller's thread (tests, and at exit)."""
        batch = self.take()
        if not batch:
            return 0
        try:
            return layer_loop.run(self.send(batch))
        except Exception:
            log.exception("could not flush %d session.updated messages", len(batch))
            return 0

    def _run(self) -> None:
        while True:
            self._wake.wait()
            # Let the burst finish: one message for all of it.
            time.sleep(settings.UNDOLOG_SESSION_UPDATE_WINDOW_MS / 1000)
            self._wake.clear()  # before take(): a change added after take() wakes us again
            batch = self.take()
            if batch:
                try:
                    layer_loop.run(self.send(batch))
                except Exception:  # keep the thread alive for the next batch
                    log.exception("could not publish %d session.updated messages", len(batch))


session_updates = SessionUpdates()


def session_changed(org_id: Any, session_id: Any, change: SessionChange, *, state: str | None = None,
                    step_index: int | None = None) -> None:
    """A run changed (called after its transaction committed): queue a `session.updated`."""
    session_updates.add(org_id, session_id, change, state=state, step_index=step_index)


# ---------------------------------------------------------------- after the answer

# Work handed to `after_answer` that has not started by then is left to the outbox's sweeps (a
# burst past this is a backlog the sweep drains just as well, without growing this process).
MAX_WAITING = 10_000


class AfterAnswer:
    """Work a request hands off once its transaction committed, run on one daemon thread per
    process, so that the answer does not wait for it: the fast approval path's event fan-out (its
    claim, its channel-layer message, webhook and email rows, Slack's row).

    `add(fn, item)` queues `item` for `fn`, which takes a list: the thread waits
    `UNDOLOG_FANOUT_WINDOW_MS` after the first item of a burst, then hands `fn` every item queued
    for it by then, in order. An `urgent` item (a request a person now waits for) ends the wait at
    once: its push is as quick as before the window, and takes what waited with it. A busy process
    thus claims a window's events in one statement and sends one group message per org, not one of
    each per call: per call, the claim and the group message were the fast approval path's largest
    cost (~1.4 ms of CPU of a rule-decided call's ~2.6, measured), more than its own read and write.

    Only work whose loss the outbox already covers comes here: an event row is fanned out by the
    beat's sweep when the process dies (or this queue is full) first, a delivery row by its own
    sweep. The thread's database connection goes back to the pool whenever the queue is empty."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a forked worker starts its own thread
        getattr(threading, "_register_atexit", atexit.register)(self.drain)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._waiting = 0  # handed off and not yet done
        self._idle = threading.Event()
        self._idle.set()
        self._urgent = threading.Event()

    def add(self, fn: Callable[[list], Any], item: Any, *, urgent: bool = False) -> None:
        if not settings.UNDOLOG_FANOUT_AFTER_ANSWER:
            _run_batch(fn, [item])  # in the request, as the pipeline's own fan-out
            return
        if self._queue.qsize() >= MAX_WAITING:
            log.warning("after-answer queue full: %s left to the outbox's sweeps", getattr(fn, "__name__", fn))
            return
        with self._lock:
            self._waiting += 1
            self._idle.clear()
            self._queue.put((fn, item))
            if urgent:
                self._urgent.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="after-answer", daemon=True)
                self._thread.start()

    def drain(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything handed off so far ran (tests, and at exit); False on timeout."""
        return self._idle.wait(timeout_s) if self._thread is not None else True

    def _take(self, first: tuple) -> dict[Callable[[list], Any], list]:
        """`first` and everything queued behind it, by function, each in the order it came."""
        batches: dict[Callable[[list], Any], list] = {}
        work: tuple | None = first
        while work is not None:
            batches.setdefault(work[0], []).append(work[1])
            try:
                work = self._queue.get_nowait()
            except queue.Empty:
                work = None
        return batches

    def _run(self) -> None:
        from django.db import connection

        while True:
            first = self._queue.get()
            # Let the burst gather (one batch for it), unless something urgent is waiting.
            self._urgent.wait(settings.UNDOLOG_FANOUT_WINDOW_MS / 1000)
            self._urgent.clear()  # before _take(): an urgent item queued after it wakes the next wait
            batches = self._take(first)
            for fn, items in batches.items():
                _run_batch(fn, items)
            if self._queue.empty():
                connection.close()  # back to the pool (a broken one is discarded)
            with self._lock:
                self._waiting -= sum(len(items) for items in batches.values())
                if not self._waiting:
                    self._idle.set()


def _run_batch(fn: Callable[[list], Any], items: list) -> None:
    try:
        fn(items)
    except Exception:  # the work is the outbox's: its sweep retries what failed here
        log.exception("after-answer work %s failed for %d items", getattr(fn, "__name__", fn), len(items))


after_answer = AfterAnswer()
