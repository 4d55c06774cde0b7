"""Test caps and approvals without a model: an agent that plays back a script.

Like the reference guide's ``ScriptedModel``::

    ACCOUNTS = ("acct-101", "acct-102", "acct-103")
    DELETE_ALL = [("delete_account", {"account_id": a}) for a in ACCOUNTS]
    agent = ScriptedAgent([DELETE_ALL, "Deleted what the budget allowed."], tools=[delete_account])
    async with client.session(agent="cleanup"):
        transcript = await agent.run()
    assert [c.refused for c in transcript.calls] == [False, False, True]

Each turn is a list of calls ``(tool, kwargs)`` or ``(tool, kwargs, reasoning)``,
where ``tool`` is a decorated function or its registered name, or a string: the
final answer, which ends the run. Calls of a turn run one after the other, as a
budget checks parallel calls one by one. A refused call (budget, rejection, expiry,
suspension, a halted run) becomes the text a model would read; any other exception
propagates, so the session fails and its undo stack is walked.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._context import current_session
from .decorator import spec_of
from .errors import Refused, refusal_as_tool_result

__all__ = ["ScriptedAgent", "ToolCall", "Transcript"]

ToolRef = Callable[..., Any] | str
Turn = str | Sequence[Sequence[Any]]


@dataclass
class ToolCall:
    """One played call. ``result`` is what the model reads (the refusal text if refused)."""

    turn: int
    tool: str
    args: dict[str, Any]
    result: Any = None
    refused: bool = False
    error: BaseException | None = None


@dataclass
class Transcript:
    calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None

    @property
    def refusals(self) -> list[ToolCall]:
        return [c for c in self.calls if c.refused]

    @property
    def executed(self) -> list[ToolCall]:
        return [c for c in self.calls if not c.refused]


class ScriptedAgent:
    """Plays a script of tool calls against decorated tools (in the current session, if any)."""

    def __init__(self, script: Sequence[Turn], tools: Iterable[Callable[..., Any]] = (), *,
                 refusals: tuple[type[BaseException], ...] = (Refused,)) -> None:
        self.script = list(script)
        self.refusals = refusals
        self._tools: dict[str, Callable[..., Any]] = {}
        for tool in tools:
            self._tools[spec_of(tool).name] = tool
            self._tools.setdefault(tool.__name__, tool)

    async def run(self) -> Transcript:
        """Play the script; async tools are awaited, sync tools called directly."""
        transcript = Transcript()
        for number, turn in enumerate(self.script):
            if isinstance(turn, str):
                transcript.answer = turn
                break
            for step in turn:
                fn, call = self._prepare(number, step)
                try:
                    value = fn(**call.args)
                    call.result = await value if inspect.isawaitable(value) else value
                except self.refusals as exc:
                    self._refused(call, exc)
                transcript.calls.append(call)
        return transcript

    def run_sync(self) -> Transcript:
        """Play the script from sync code (sync tools only)."""
        transcript = Transcript()
        for number, turn in enumerate(self.script):
            if isinstance(turn, str):
                transcript.answer = turn
                break
            for step in turn:
                fn, call = self._prepare(number, step)
                if inspect.iscoroutinefunction(fn):
                    raise TypeError(f"{call.tool} is async: use `await agent.run()`")
                try:
                    call.result = fn(**call.args)
                except self.refusals as exc:
                    self._refused(call, exc)
                transcript.calls.append(call)
        return transcript

    def _prepare(self, turn: int, step: Sequence[Any]) -> tuple[Callable[..., Any], ToolCall]:
        ref, kwargs, *rest = step
        fn = self._resolve(ref)
        if rest and (session := current_session()) is not None:
            session.reasoning(str(rest[0]))
        return fn, ToolCall(turn, spec_of(fn).name, dict(kwargs or {}))

    def _resolve(self, ref: ToolRef) -> Callable[..., Any]:
        if callable(ref):
            return ref
        try:
            return self._tools[ref]
        except KeyError:
            raise KeyError(f"the script calls {ref!r}, which is not among the agent's tools "
                           f"{sorted(self._tools)}") from None

    @staticmethod
    def _refused(call: ToolCall, exc: BaseException) -> None:
        call.refused, call.error = True, exc
        call.result = refusal_as_tool_result(exc)
