"""A session: one run of an agent, and what happens to each tool call inside it.

The tier paths are written once, as generators ("flows") that yield the I/O they
need (``Call``, ``Sleep``, ``RUN``) and receive its outcome. A sync driver performs
them for sync tools and ``with`` blocks, an async driver for async tools and
``async with`` blocks, so both flavours share every rule.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Generator, Mapping
from contextvars import Token
from dataclasses import dataclass
from typing import Any

from ._context import CURRENT
from ._http import Call, Http, unwrap_result, wrap_result
from .decorator import DeclaredTool
from .errors import (
    ApprovalExpired,
    ApprovalRejected,
    ApprovalWaitTimeout,
    EffectFailed,
    EffectInFlight,
    EffectUndone,
    InvalidRequest,
    RewindRefused,
    SessionNotRunning,
    UndoLogConnectionError,
    UndoLogError,
    UndoLogTimeout,
)

__all__ = ["Session", "WaitInfo"]

log = logging.getLogger("undolog")


@dataclass(frozen=True)
class _Run:
    """Flow instruction: run the tool now and send back its result. ``args``: a reviewer
    edited the call before approving it; run it with these instead of the caller's."""

    args: dict[str, Any] | None = None


RUN = _Run()


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Local:
    """Flow instruction: call ``fn(*args)`` here (a pre-image's before read) and send back what
    it returned (awaited, under the async driver, when it returns an awaitable)."""

    fn: Any
    args: tuple[Any, ...] = ()


Op = Call | Sleep | _Run | Local
Flow = Generator[Op, Any, Any]

_UNDONE = frozenset({"compensating", "compensated", "compensation_failed"})
_COMPENSATION_OVER = frozenset({"compensated", "compensation_failed"})
_NOTHING_TO_UNDO = frozenset({"completed", "halted"})
_RUNS = frozenset({"running", "awaiting_approval"})  # a rewind is over: the run goes on
MAX_SAFE_REPORT = 1000  # the server's limit on safe_calls per request
_NO_OUTPUT = object()
_JSON = (str, int, float, bool, type(None), list, dict)


@dataclass(frozen=True)
class WaitInfo:
    """Handed to ``on_wait`` while an irreversible call waits for a reviewer."""

    tool: str
    effect_id: str
    state: str
    waited_s: float
    timeout_at: str | None
    url: str | None = None  # the approval's page on the dashboard, where a reviewer decides


class Session:
    """One run of an agent. Use it as ``with`` or ``async with``; tools called inside
    are intercepted through it. Made by ``UndoLogClient.session`` / ``resume_session``.
    """

    def __init__(self, http: Http, *, agent: str | None = None,
                 metadata: Mapping[str, Any] | None = None, session_id: str | None = None,
                 started_by: str | None = None, inputs: Any = None,
                 approval_timeout: float | None = None,
                 poll_wait: float = 30.0,
                 on_wait: Callable[[WaitInfo], None] | None = None) -> None:
        # No agent: the server takes the key's own agent (a key belongs to exactly one).
        self._http = http
        self.id: str | None = session_id
        self.agent = agent
        self.metadata = dict(metadata or {})
        # What the user asked (trusted: its values vouch in tainted(); rules read run.inputs).
        self.inputs = inputs
        # Who started this run (username or email): the server won't let them approve it.
        self.started_by = started_by
        self.state: str | None = None
        self.data: dict[str, Any] = {}
        self.approval_timeout = approval_timeout
        self.poll_wait = poll_wait
        self.on_wait = on_wait
        self._steps = itertools.count(0)
        self._safe: deque[dict[str, Any]] = deque()
        self._reasoning: str | None = None
        self._token: Token[Session | None] | None = None
        # Compensable effects this run started: what a failure rolls back.
        self._undoable: set[str] = set()
        # Told each step number as a call takes it (an adapter that maps its framework's
        # checkpoints to the run's steps: LangGraph's thread_session).
        self._step_seen: Callable[[int], None] | None = None

    def __repr__(self) -> str:
        return f"<Session {self.id} agent={self.agent!r} state={self.state!r}>"

    # -- entering and leaving -------------------------------------------------

    def __enter__(self) -> Session:
        self._open(self._http.send(self._open_call()))
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._deactivate()
        self._drive(self._close_flow(exc))

    async def __aenter__(self) -> Session:
        self._open(await self._http.asend(self._open_call()))
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._deactivate()
        await self._adrive(self._close_flow(exc))

    def _open_call(self) -> Call:
        if self.id is not None:
            return Call("GET", f"/api/v1/sessions/{self.id}")
        body: dict[str, Any] = {"metadata": self.metadata}
        if self.agent:
            body["agent"] = self.agent
        if self.started_by:
            body["started_by"] = self.started_by
        if self.inputs is not None:
            body["inputs"] = self.inputs
        return Call("POST", "/api/v1/sessions", body)

    def _open(self, answer: Mapping[str, Any]) -> None:
        self._apply(answer)
        # The server keeps the highest step index seen (0 for a new session: the run before any
        # call) and drops SAFE reports of a step it already has, so a run's calls are numbered
        # from past it: from 1 in a new run, so that a rewind to step 0 undoes every call.
        last = self.data.get("step_index")
        if isinstance(last, int):
            self._steps = itertools.count(last + 1)
        self._token = CURRENT.set(self)

    def _deactivate(self) -> None:
        token, self._token = self._token, None
        try:
            if token is not None:
                CURRENT.reset(token)
        except ValueError:
            # Exited in another context than entered (e.g. a fixture's teardown task).
            CURRENT.set(None)

    def _apply(self, answer: Mapping[str, Any]) -> None:
        data = answer.get("session", answer)
        if not isinstance(data, Mapping):
            return
        self.data = dict(data)
        self.id = str(data.get("id", self.id))
        self.state = data.get("state", self.state)
        self.agent = data.get("agent", self.agent)

    def _close_flow(self, exc: BaseException | None) -> Flow:
        """Complete on a normal exit, fail (starting the undo walk) on an exception.

        KeyboardInterrupt, SystemExit and cancellation leave the session running, as a
        crash would, so that ``resume_session`` can carry it on.
        """
        if exc is not None and not isinstance(exc, Exception):
            return
        try:
            if exc is None:
                answer = yield from self._finish("complete", {})
            else:
                answer = yield from self._finish("fail", {"error": describe(exc)})
                self._log_rollback(exc)
        except UndoLogError as err:
            if exc is None and not isinstance(err, SessionNotRunning):
                raise
            # Never mask the block's own exception, nor fail a normal exit because a
            # reviewer halted or rolled back the run meanwhile (that is expected).
            level = logging.INFO if isinstance(err, SessionNotRunning) else logging.WARNING
            log.log(level, "could not close session %s: %s", self.id, err)
            self.state = getattr(err, "state", None) or self.state
            return
        self._apply(answer)

    def _log_rollback(self, exc: BaseException) -> None:
        """Say that the failure rolls back, and how much: a silent rollback looks like nothing
        happened, or like everything was lost."""
        count = len(self._undoable)
        if count:
            log.warning("run %s failed (%s): rolling back %d call%s, newest first; follow it at %s",
                        self.id, describe(exc), count, "" if count == 1 else "s",
                        self._page("sessions", self.id))
        else:
            log.warning("run %s failed (%s): nothing to roll back", self.id, describe(exc))

    def _page(self, kind: str, pk: Any) -> str:
        return f"{self._http.base_url}/{kind}/{pk}/"

    def _finish(self, verb: str, body: dict[str, Any]) -> Flow:
        """POST complete/fail, reporting the last SAFE calls if the server takes them."""
        path = f"/api/v1/sessions/{self.id}/{verb}"
        safe = self._drain_safe()
        if safe:
            try:
                return (yield Call("POST", path, {**body, "safe_calls": safe}))
            except InvalidRequest as err:
                if "safe_calls" not in err.fields:
                    raise
                log.debug("%s does not take safe_calls; %d not reported", path, len(safe))
        return (yield Call("POST", path, body))

    # -- what code inside the block may use ------------------------------------

    def reasoning(self, text: str) -> None:
        """Attach the agent's reasoning to the next intercepted call (reviewers see it)."""
        self._reasoning = text

    def refresh(self) -> dict[str, Any]:
        self._apply(self._http.send(Call("GET", f"/api/v1/sessions/{self.id}")))
        return self.data

    async def arefresh(self) -> dict[str, Any]:
        self._apply(await self._http.asend(Call("GET", f"/api/v1/sessions/{self.id}")))
        return self.data

    def wait_compensated(self, timeout: float = 60.0, poll_interval: float = 0.5) -> dict[str, Any]:
        """Block until the undo walk ends: ``state`` is compensated or compensation_failed."""
        return self._drive(self._wait_compensated_flow(timeout, poll_interval))

    async def await_compensated(self, timeout: float = 60.0,
                                poll_interval: float = 0.5) -> dict[str, Any]:
        """Async twin of ``wait_compensated``."""
        return await self._adrive(self._wait_compensated_flow(timeout, poll_interval))

    def _wait_compensated_flow(self, timeout: float, poll_interval: float) -> Flow:
        deadline = time.monotonic() + timeout
        while True:
            self._apply((yield Call("GET", f"/api/v1/sessions/{self.id}")))
            if self.state in _COMPENSATION_OVER:
                return self.data
            if self.state in _NOTHING_TO_UNDO:
                raise UndoLogError(f"session {self.id} is {self.state}; no undo walk will run",
                                   code="not_compensating")
            if time.monotonic() >= deadline:
                raise UndoLogTimeout(f"session {self.id} still {self.state} after {timeout}s")
            yield Sleep(poll_interval)

    # -- savepoints and rewind (issue 41) ----------------------------------------

    def savepoint(self, name: str) -> dict[str, Any]:
        """Name the run's current step (its SAFE calls so far reported first), for
        ``rewind(to=name)``: ``{"name", "step_index"}``."""
        return self._drive(self._savepoint_flow(name))

    async def asavepoint(self, name: str) -> dict[str, Any]:
        """Async twin of ``savepoint``."""
        return await self._adrive(self._savepoint_flow(name))

    def rewind(self, to: int | str, *, reason: str = "", leave_irreversible: bool = False,
               timeout: float = 60.0, poll_interval: float = 0.2) -> dict[str, Any]:
        """Roll the run back to step ``to`` (or the savepoint named ``to``): the server undoes
        every effect after it, newest first; this returns once the run runs again at that step,
        and the next call is numbered after it. The answer says what was undone (``to_undo``),
        what was left done (``left_done``) and the step the run resumed at (``resumes_at``).
        Irreversible calls after the step raise ``RewindRefused`` naming them
        (``.irreversible``), unless ``leave_irreversible``."""
        return self._drive(self._rewind_flow(to, reason, leave_irreversible, timeout,
                                             poll_interval))

    async def arewind(self, to: int | str, *, reason: str = "", leave_irreversible: bool = False,
                      timeout: float = 60.0, poll_interval: float = 0.2) -> dict[str, Any]:
        """Async twin of ``rewind``."""
        return await self._adrive(self._rewind_flow(to, reason, leave_irreversible, timeout,
                                                    poll_interval))

    def _report_safe_flow(self) -> Flow:
        """Report the SAFE calls queued so far, so the server's step is the run's."""
        while self._safe:
            self._apply((yield Call("POST", f"/api/v1/sessions/{self.id}/safe-calls",
                                    {"safe_calls": self._drain_safe()})))

    def _savepoint_flow(self, name: str) -> Flow:
        yield from self._report_safe_flow()
        return (yield Call("POST", f"/api/v1/sessions/{self.id}/savepoints", {"name": name}))

    def _rewind_flow(self, to: int | str, reason: str, leave_irreversible: bool, timeout: float,
                     poll_interval: float) -> Flow:
        yield from self._report_safe_flow()
        body: dict[str, Any] = {"reason": reason, "leave_irreversible": leave_irreversible}
        body["to" if isinstance(to, str) else "to_step"] = to
        answer = yield Call("POST", f"/api/v1/sessions/{self.id}/rewind", body)
        step = int(answer["resumes_at"])
        self._steps = itertools.count(step + 1)  # the run goes on after the step it went back to
        self._undoable -= {item["effect"] for item in answer.get("to_undo", [])}
        deadline = time.monotonic() + timeout
        self._apply(answer)
        while self.state not in _RUNS:
            if self.state == "compensation_failed":
                raise RewindRefused(f"the rewind of run {self.id} stopped: a compensation "
                                    "failed and waits for a person (retry or resolve it on the "
                                    "run's page)", code="walk_stopped", body=self.data)
            if time.monotonic() >= deadline:
                raise UndoLogTimeout(f"run {self.id} still rewinding ({self.state}) after "
                                     f"{timeout}s")
            yield Sleep(poll_interval)
            self._apply((yield Call("GET", f"/api/v1/sessions/{self.id}")))
        return answer

    # -- tool calls (entered from the decorator's wrappers) ----------------------

    def call(self, tool: DeclaredTool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if tool.safe:
            if tool.spec.reports_output:
                bound = tool.bind(args, kwargs)
                result = tool.fn(*args, **kwargs)
                self._record_safe(tool.spec.name, bound, result)
                return result
            self._record_safe(tool.spec.name, tool.bind(args, kwargs))
            return tool.fn(*args, **kwargs)
        _warn_if_blocking_loop(tool)
        flow = self._effect_flow(tool, tool.bind(args, kwargs))
        return self._drive(flow, lambda edited=None: tool.fn(**edited) if edited is not None
                           else tool.fn(*args, **kwargs))

    async def acall(self, tool: DeclaredTool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if tool.safe:
            bound = tool.bind(args, kwargs)
            if tool.spec.reports_output:
                result = await tool.fn(*args, **kwargs)
                self._record_safe(tool.spec.name, bound, result)
                return result
            self._record_safe(tool.spec.name, bound)
            return await tool.fn(*args, **kwargs)
        flow = self._effect_flow(tool, tool.bind(args, kwargs))
        return await self._adrive(flow, lambda edited=None: tool.fn(**edited)
                                  if edited is not None else tool.fn(*args, **kwargs))

    def _record_safe(self, name: str, args: dict[str, Any], output: Any = _NO_OUTPUT) -> None:
        # next() on itertools.count and deque.append are atomic: no lock on the hot path.
        call = {"tool": name, "step_index": self._next_step(), "args": args}
        if output is not _NO_OUTPUT:
            # The server keeps its fingerprints for tainted() (run-aware rules), never the text.
            call["output"] = output if isinstance(output, _JSON) else str(output)
        self._safe.append(call)

    def _next_step(self) -> int:
        step = next(self._steps)
        if self._step_seen is not None:
            self._step_seen(step)
        return step

    def _drain_safe(self) -> list[dict[str, Any]]:
        # At most what the server takes in one request; the rest rides on the next one.
        drained = []
        while self._safe and len(drained) < MAX_SAFE_REPORT:
            drained.append(self._safe.popleft())
        return drained

    def _effect_flow(self, tool: DeclaredTool, args: dict[str, Any]) -> Flow:
        """A COMPENSABLE or IRREVERSIBLE call.

        1. Intercept, reporting the SAFE calls queued since the last request.
        2. ``execute``: run the tool, commit its result (or report the failure, re-raise).
        3. ``replay``/``await_approval``: settle the effect (below); a committed effect
           returns its stored result without running.
        4. An approved one is claimed (``/start``: approved → executing), then runs and
           commits; if another caller claimed it first, its outcome is returned instead.
        """
        answer = yield from self._intercept(tool, args)
        effect = answer.get("effect") or {}
        decision = answer.get("decision")
        if decision in ("rejected", "expired") and not effect.get("state"):
            effect = {**effect, "state": decision}  # a decision answered without an effect
        if decision == "execute":
            return (yield from self._run(effect, tool, args))
        effect = yield from self._settle(tool, answer, effect)
        if effect.get("state") == "approved" and not (yield from self._claim(effect)):
            # Another caller started it first: its outcome is this call's outcome.
            answer = yield Call("GET", f"/api/v1/effects/{effect.get('id')}")
            effect = yield from self._settle(tool, answer, answer.get("effect") or {},
                                             elsewhere=True)
        if effect.get("state") == "committed":
            return unwrap_result(effect.get("result"))
        return (yield from self._run(effect, tool, args))

    def _intercept(self, tool: DeclaredTool, args: dict[str, Any]) -> Flow:
        body: dict[str, Any] = {"tool": tool.name, "args": args, "step_index": self._next_step()}
        if self._reasoning is not None:
            body["reasoning"], self._reasoning = self._reasoning, None
        if tool.idempotency_key is not None:
            body["idempotency_key"] = tool.idempotency_key(args)
        safe = self._drain_safe()
        if safe:
            body["safe_calls"] = safe
        try:
            return (yield Call("POST", f"/api/v1/sessions/{self.id}/intercept", body))
        except UndoLogConnectionError:
            # The request may never have arrived; keep the SAFE calls for the next one.
            self._safe.extendleft(reversed(safe))
            raise
        except SessionNotRunning as err:
            self.state = err.state or self.state
            raise

    def _settle(self, tool: DeclaredTool, answer: Mapping[str, Any],
                effect: Mapping[str, Any], *, elsewhere: bool = False) -> Flow:
        """Wait until the effect is committed, or approved for this caller to run.

        ``elsewhere``: someone else (another caller, the worker) runs it; wait for that.
        """
        started = time.monotonic()
        approval = answer.get("approval") or {}
        timeout_at = approval.get("timeout_at")
        url = self._page("approvals", approval["id"]) if approval.get("id") else None
        while True:
            state = effect.get("state")
            server_runs = elsewhere or _server_runs(tool, effect)
            if state == "committed" or (state == "approved" and not server_runs):
                return effect
            if state == "pending" or (server_runs and state in ("approved", "executing")):
                answer = yield from self._poll(tool, effect, started, timeout_at, url)
                effect = answer.get("effect") or {}
                # It was pending or approved a moment ago: executing now means someone
                # else (another caller, the worker) started it. Wait for their outcome.
                elsewhere = elsewhere or effect.get("state") == "executing"
                continue
            raise self._unrunnable(tool, answer, effect)

    def _poll(self, tool: DeclaredTool, effect: Mapping[str, Any], started: float,
              timeout_at: str | None, url: str | None = None) -> Flow:
        """One long poll of the effect, bounded by ``approval_timeout``."""
        waited = time.monotonic() - started
        wait = self.poll_wait
        if self.approval_timeout is not None:
            remaining = self.approval_timeout - waited
            if remaining <= 0:
                what = "no decision" if effect.get("state") == "pending" else "no outcome"
                raise ApprovalWaitTimeout(
                    f"{tool.name}: {what} after {self.approval_timeout:g}s; effect "
                    f"{effect.get('id')} is still {effect.get('state')} on the server",
                    effect_id=effect.get("id"))
            wait = min(wait, remaining)
        self._notify(WaitInfo(tool.name, str(effect.get("id")), str(effect.get("state")),
                              waited, timeout_at, url))
        before = time.monotonic()
        answer = yield Call("GET", f"/api/v1/effects/{effect.get('id')}",
                            params={"wait": _wait_param(wait)}, timeout=wait + 15)
        unchanged = (answer.get("effect") or {}).get("state") == effect.get("state")
        if unchanged and time.monotonic() - before < 1.0:
            yield Sleep(1.0)  # the server ignored ?wait=; don't spin
        return answer

    def _notify(self, info: WaitInfo) -> None:
        if self.on_wait is not None:
            self.on_wait(info)
            return
        if info.state != "pending":
            log.info("%s waits for the call to finish elsewhere (effect %s, %s, %.0fs so far)",
                     info.tool, info.effect_id, info.state, info.waited_s)
            return
        deadline = f", deadline {info.timeout_at}" if info.timeout_at else ""
        where = info.url or f"effect {info.effect_id}"
        log.info("%s waits for a reviewer: %s (%.0fs so far%s)",
                 info.tool, where, info.waited_s, deadline)

    def _unrunnable(self, tool: DeclaredTool, answer: Mapping[str, Any],
                    effect: Mapping[str, Any]) -> UndoLogError:
        state = effect.get("state")
        body = dict(answer)
        if state == "rejected":
            self.state = "halted"
            reason, reviewer = _decision(answer, effect)
            return ApprovalRejected(reason=reason, reviewer=reviewer, body=body)
        if state == "expired":
            self.state = "halted"
            return ApprovalExpired(f"{tool.name}: the approval request expired before a "
                                   "decision; the call was not executed", body=body)
        if state == "executing":
            return EffectInFlight(f"{tool.name}: this call (effect {effect.get('id')}) is "
                                  "being executed elsewhere; not running it twice", body=body)
        if state == "failed":
            return EffectFailed(f"{tool.name}: this call (effect {effect.get('id')}) failed and "
                                f"is never run again: {effect.get('error')}", body=body)
        if state in _UNDONE:
            return EffectUndone(f"{tool.name}: this call was already undone ({state})", body=body)
        return UndoLogError(f"{tool.name}: unexpected effect state {state!r}",
                            code="unexpected_state", body=body)

    def _claim(self, effect: Mapping[str, Any]) -> Flow:
        """``POST /effects/{id}/start``: approved → executing, before the tool runs.

        Two callers may wait on one approval (a resumed run while the crashed one's
        process still lives, two workers replaying one session): the server lets only
        the first start it; the other gets 409 ``effect_state_conflict`` and returns False.
        """
        try:
            yield Call("POST", f"/api/v1/effects/{effect.get('id')}/start")
        except UndoLogError as err:
            if err.code != "effect_state_conflict":
                raise
            log.info("effect %s was started by another caller; waiting for its outcome",
                     effect.get("id"))
            return False
        return True

    def _run(self, effect: Mapping[str, Any], tool: DeclaredTool | None = None,
             args: dict[str, Any] | None = None) -> Flow:
        effect_id = effect.get("id")
        if effect.get("tier") == "compensable":
            self._undoable.add(str(effect_id))  # its undo entry is pushed before it runs
        pre = getattr(tool, "pre_image", None) if effect.get("tier") == "compensable" else None
        if pre is not None:
            # The before read, kept before the call runs (a hold waits for a person first).
            from .preimage_flow import after_image, keep

            effect, read_after = yield from keep(self, tool, pre, effect, args or {})
        try:
            result = yield _run_for(effect)
        except Exception as exc:
            yield from self._report_failure(effect_id, exc)
            raise
        yield from self._commit(effect_id, result)
        if pre is not None and read_after:
            yield from after_image(pre, effect_id, args or {})
        return result

    def _report_failure(self, effect_id: Any, exc: Exception) -> Flow:
        try:
            yield Call("POST", f"/api/v1/effects/{effect_id}/fail", {"error": describe(exc)})
        except UndoLogError as err:
            # The tool's own exception matters more; the effect stays executing and
            # the undo walk covers executing effects too.
            log.warning("could not report failure of effect %s: %s", effect_id, err)

    def _commit(self, effect_id: Any, result: Any) -> Flow:
        """Commit, retrying a broken connection: the side effect has already happened."""
        call = Call("POST", f"/api/v1/effects/{effect_id}/commit", {"result": wrap_result(result)})
        for attempt in range(3):
            try:
                yield call
                return
            except UndoLogConnectionError:
                if attempt == 2:
                    raise
                yield Sleep(0.25 * 2 ** attempt)
            except UndoLogError as err:
                # A 409 after a broken attempt: did that attempt land after all?
                if attempt == 0 or err.status != 409:
                    raise
                current = yield Call("GET", f"/api/v1/effects/{effect_id}")
                if (current.get("effect") or {}).get("state") == "committed":
                    return
                raise

    # -- drivers ------------------------------------------------------------------

    def _drive(self, flow: Flow, run: Callable[[], Any] | None = None) -> Any:
        value: Any = None
        error: Exception | None = None
        while True:
            try:
                op = flow.throw(error) if error is not None else flow.send(value)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            try:
                if isinstance(op, Call):
                    value = self._http.send(op)
                elif isinstance(op, Sleep):
                    time.sleep(op.seconds)
                elif isinstance(op, Local):
                    value = op.fn(*op.args)
                elif run is not None:
                    value = run() if op.args is None else run(op.args)
            except Exception as exc:
                error = exc

    async def _adrive(self, flow: Flow, run: Callable[[], Awaitable[Any]] | None = None) -> Any:
        value: Any = None
        error: Exception | None = None
        while True:
            try:
                op = flow.throw(error) if error is not None else flow.send(value)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            try:
                if isinstance(op, Call):
                    value = await self._http.asend(op)
                elif isinstance(op, Sleep):
                    await asyncio.sleep(op.seconds)
                elif isinstance(op, Local):
                    value = op.fn(*op.args)
                    if inspect.isawaitable(value):
                        value = await value
                elif run is not None:
                    value = await (run() if op.args is None else run(op.args))
            except Exception as exc:
                error = exc


def _run_for(effect: Mapping[str, Any]) -> _Run:
    """RUN, or RUN with the args a reviewer edited before approving (said in the log, so the
    person reading the agent's output knows the tool did not run with what the model asked).
    """
    edited = edited_args(effect)
    if edited is None:
        return RUN
    log.info("%s runs with the args a reviewer edited before approving (effect %s): "
             "%s instead of %s", effect.get("tool"), effect.get("id"), _short(edited),
             _short(effect.get("args")))
    return _Run(edited)


def edited_args(effect: Mapping[str, Any]) -> dict[str, Any] | None:
    """The args a reviewer edited before approving, which the call runs with (None: the
    caller's own args, approved as proposed or never edited)."""
    edited = effect.get("approved_args")
    if not isinstance(edited, dict) or edited == effect.get("args"):
        return None
    return edited


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _wait_param(seconds: float) -> int:
    return min(60, max(1, int(seconds)))  # the server takes 0..60 s per long poll


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


def _server_runs(tool: DeclaredTool, effect: Mapping[str, Any]) -> bool:
    """A tool with a server-side executor is run by the worker once approved, never here."""
    return bool(tool.spec.executor) or bool(effect.get("executor"))


def _decision(answer: Mapping[str, Any], effect: Mapping[str, Any]) -> tuple[str, str | None]:
    """A rejection's reason and reviewer, wherever this server version puts them."""
    places = [answer.get("approval"), effect.get("approval"), answer, effect]
    found = [p for p in places if isinstance(p, Mapping)]
    reason = _first(found, ("reason", "decision_reason", "rejection_reason")) or effect.get("error")
    reviewer = _first(found, ("decided_by", "reviewer"))
    if isinstance(reviewer, Mapping):  # a user object rather than a name
        reviewer = reviewer.get("username") or reviewer.get("name") or reviewer.get("id")
    return str(reason or ""), (str(reviewer) if reviewer else None)


def _first(places: list[Mapping[str, Any]], keys: tuple[str, ...]) -> Any:
    for place in places:
        for key in keys:
            if place.get(key):
                return place[key]
    return None


def _warn_if_blocking_loop(tool: DeclaredTool) -> None:
    """A sync tool that reaches the server blocks an event loop it runs on."""
    if tool._warned_sync:
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    tool._warned_sync = True
    log.warning("sync tool %s makes blocking HTTP calls inside an event loop; "
                "declare it `async def` in async code", tool.name)
