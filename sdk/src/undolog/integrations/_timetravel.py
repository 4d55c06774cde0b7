"""LangGraph's time travel takes the world with it (issue 41).

A thread resumed from a checkpoint earlier than its latest (``invoke(None, snapshot.config)``
with a snapshot of ``get_state_history``, a fork by ``update_state`` then ``invoke``, new input
on an old checkpoint) goes on from that checkpoint's memory. ``thread_session`` rewinds the
run to the step that checkpoint had reached before the graph goes on, so the world matches.

Two things make that possible:

1. **Each checkpoint carries the run's step.** LangGraph writes a checkpoint after every
   superstep, in the background (the next superstep's tools may already run), so the step is
   not read from the session when the checkpoint is written: every call of the run remembers
   the root checkpoint its task started from (``checkpoint_map[""]`` in the task's config, set
   for nested graphs too), and the checkpoint that a superstep writes is stamped with the
   highest step of the calls that started from its parent (or its parent's stamp).
   ``StampingSaver`` wraps the graph's checkpointer for the block (lent through the run's
   config, the way LangGraph lends a parent's checkpointer to a subgraph) and adds
   ``undolog_step`` and ``undolog_epoch`` (the run's rewinds so far) to the metadata of every
   root checkpoint it writes. Checkpoints written by ``update_state`` carry no stamp: they
   stand for their parent's world.
2. **Where the graph resumes from** (``where``): the checkpoint the config addresses (or the
   thread's latest), or the nearest stamped checkpoint above it. If that is the thread's newest
   stamped checkpoint, the graph just goes on (a pause, a crash: its calls replay, nothing is
   rewound); otherwise it is time travel: the later runs of the thread (a conversation's later
   turns) are taken back whole, and the run goes back to the stamp.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

STEP = "undolog_step"
EPOCH = "undolog_epoch"
SESSION = "undolog_session"


class Stamps:
    """The run's step at each root checkpoint the graph writes during one ``thread_session``
    block, from the calls made meanwhile (``saw_step``, the session's step hook)."""

    def __init__(self, baseline: int, epoch: int) -> None:
        self.baseline, self.epoch = baseline, epoch
        self._lock = threading.Lock()  # parallel tool calls of one superstep report at once
        # The root checkpoint a call's task started from → the highest step of its calls.
        self._calls: dict[str | None, int] = {}
        self._stamps: dict[str | None, int] = {}

    def saw_step(self, step: int) -> None:
        parent = _root_checkpoint()
        if parent is None:
            return  # not inside a graph's task
        with self._lock:
            self._calls[parent] = max(self._calls.get(parent, step), step)

    def metadata(self, config: Mapping[str, Any], checkpoint: Mapping[str, Any],
                 metadata: Mapping[str, Any]) -> Mapping[str, Any]:
        """``metadata`` with the step reached by the checkpoint being written (root ones only;
        not an ``update_state``'s, which stands for its parent)."""
        configurable = config.get("configurable") or {}
        if configurable.get("checkpoint_ns") or metadata.get("source") == "update":
            return metadata
        parent = configurable.get("checkpoint_id")  # put() is given the parent's config
        with self._lock:
            step = max(self._stamps.get(parent, self.baseline),
                       self._calls.get(parent, self.baseline))
            self._stamps[checkpoint["id"]] = step
        return {**metadata, STEP: step, EPOCH: self.epoch}


def _root_checkpoint() -> str | None:
    try:
        from langgraph.config import get_config

        configurable = get_config().get("configurable") or {}
    except RuntimeError:
        return None
    return (configurable.get("checkpoint_map") or {}).get("")


class StampingSaver(BaseCheckpointSaver):
    """The graph's checkpointer, stamping what it writes (``Stamps.metadata``); every other
    method is the wrapped saver's."""

    def __init__(self, inner: BaseCheckpointSaver, stamps: Stamps) -> None:
        # Not BaseCheckpointSaver.__init__: the serializer is the wrapped saver's own.
        self.inner, self.stamps, self.serde = inner, stamps, inner.serde

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        stamped = self.stamps.metadata(config, checkpoint, metadata)
        return self.inner.put(config, checkpoint, stamped, new_versions)

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        stamped = self.stamps.metadata(config, checkpoint, metadata)
        return await self.inner.aput(config, checkpoint, stamped, new_versions)

    def with_allowlist(self, allowlist: Any) -> StampingSaver:
        return StampingSaver(self.inner.with_allowlist(allowlist), self.stamps)

    @property
    def config_specs(self) -> list:
        return self.inner.config_specs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _delegate(name: str) -> Any:
    def method(self: StampingSaver, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    method.__name__ = name
    return method


# The base class's own methods would shadow __getattr__ (most raise NotImplementedError): each
# one, present and future, goes to the wrapped saver.
for _name, _ in inspect.getmembers(BaseCheckpointSaver, inspect.isfunction):
    if not _name.startswith("_") and _name not in StampingSaver.__dict__:
        setattr(StampingSaver, _name, _delegate(_name))


@dataclass(frozen=True)
class Travel:
    """The stamped checkpoint a thread resumes from: the run that wrote it, the step it had
    reached and the run's rewinds then; ``back``: the thread had gone on from it (time travel),
    and ``later``: the other runs that wrote checkpoints since, newest first (later turns of a
    conversation: their calls came after it)."""

    checkpoint: str
    session: str
    step: int
    epoch: int
    back: bool
    later: tuple[str, ...] = ()


#: What ``where`` asks of the checkpointer: ("get", config, None) → a CheckpointTuple or None;
#: ("newer", thread config, checkpoint id) → the thread's stamped CheckpointTuples newer than
#: that checkpoint, newest first.
Ask = tuple[str, Mapping[str, Any], str | None]


def where(config: Mapping[str, Any]) -> Generator[Ask, Any, Travel | None]:
    """Where the graph resumes from, as the checkpoints say; None when no stamped checkpoint
    is found (a new thread, or one written before the stamps)."""
    configurable = config.get("configurable") or {}
    if configurable.get("thread_id") is None:
        return None
    thread = {"configurable": {"thread_id": configurable["thread_id"],
                               "checkpoint_ns": configurable.get("checkpoint_ns", "")}}
    found = yield ("get", config if configurable.get("checkpoint_id") else thread, None)
    # update_state's checkpoints carry no stamp: they stand for their parent's world.
    while found is not None and not stamped(found):
        found = (yield ("get", found.parent_config, None)) if found.parent_config else None
    if found is None:
        return None
    newer = yield ("newer", thread, found.checkpoint["id"])
    metadata = found.metadata
    session = str(metadata[SESSION])
    later = tuple(dict.fromkeys(str(t.metadata[SESSION]) for t in newer
                                if str(t.metadata[SESSION]) != session))
    return Travel(checkpoint=found.checkpoint["id"], session=session, step=int(metadata[STEP]),
                  epoch=int(metadata.get(EPOCH, 0)), back=bool(newer), later=later)


def stamped(found: Any) -> bool:
    metadata = found.metadata or {}
    return isinstance(metadata.get(STEP), int) and bool(metadata.get(SESSION))


def ask(saver: BaseCheckpointSaver, question: Ask) -> Any:
    kind, config, after = question
    if kind == "get":
        return saver.get_tuple(config)
    newer = []
    for found in saver.list(config):  # newest first; checkpoint ids sort by time
        if found.checkpoint["id"] <= after:
            break
        if stamped(found):
            newer.append(found)
    return newer


async def aask(saver: BaseCheckpointSaver, question: Ask) -> Any:
    kind, config, after = question
    if kind == "get":
        return await saver.aget_tuple(config)
    newer = []
    async for found in saver.alist(config):
        if found.checkpoint["id"] <= after:
            break
        if stamped(found):
            newer.append(found)
    return newer


def resolve(saver: BaseCheckpointSaver, config: Mapping[str, Any]) -> Travel | None:
    flow = where(config)
    answer: Any = None
    while True:
        try:
            question = flow.send(answer)
        except StopIteration as stop:
            return stop.value
        answer = ask(saver, question)


async def aresolve(saver: BaseCheckpointSaver, config: Mapping[str, Any]) -> Travel | None:
    flow = where(config)
    answer: Any = None
    while True:
        try:
            question = flow.send(answer)
        except StopIteration as stop:
            return stop.value
        answer = await aask(saver, question)
