"""Event payloads (typed) and the one notifier that publishes them to an org's Channels group.

Every event recorded with `Event.record` reaches the org's group `org.<org id>` as
`{"type": "<event kind>", "payload": <one of the TypedDicts below>}`; a websocket consumer
handles it in the method named after the kind (`approval.requested` → `approval_requested`).
Webhooks get the same `{"type", "payload"}` body (or a Slack rendering of it).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import time
from typing import Any, NotRequired, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone

from orgs.models import Event

log = logging.getLogger(__name__)

APPROVAL_KINDS = frozenset({"approval.requested", "approval.decided", "approval.expired", "approval.extended"})


class CallInContext(TypedDict):
    step_index: int
    tool: str
    tier: str
    args: dict[str, Any]
    state: str
    result: str | None
    error: str | None


class ReasoningStep(TypedDict):
    step_index: int
    text: str


class AgentContext(TypedDict):
    calls: list[CallInContext]
    reasoning: list[ReasoningStep]


class ApprovalPayload(TypedDict):
    """An approval request as a reviewer sees it, full context included."""

    id: str
    state: str
    decision: str | None
    tool: str
    agent: str
    session: str
    effect: str
    step_index: int
    reason: str
    risk_tags: list[str]
    estimated_impact: str
    proposed_args: dict[str, Any]
    args_digest: str
    agent_context: AgentContext
    timeout_at: str
    auto_approve_on_timeout: bool
    executor: bool
    created: str
    decided_by: str | None
    decided_at: str | None
    decision_reason: str | None
    rollback: bool


class EventPayload(TypedDict):
    """Every event: what happened, in which run, when, and the event's own data."""

    id: str
    kind: str
    org: str
    agent: str | None
    session: str | None
    created: str
    data: dict[str, Any]


class ApprovalEventPayload(EventPayload):
    """approval.requested / .decided / .expired / .extended: the request as it is now."""

    approval: ApprovalPayload


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


def group_name(org_id: Any) -> str:
    return f"org.{org_id}"


def approval_payload(approval) -> ApprovalPayload:
    """`approval` with `effect`, `session__agent` and `effect__tool` loaded (one query)."""
    effect = approval.effect
    return ApprovalPayload(
        id=str(approval.id), state=approval.state, decision=approval.decision, tool=approval.tool_name,
        agent=approval.session.agent.name, session=str(approval.session_id), effect=str(approval.effect_id),
        step_index=effect.step_index, reason=approval.reason, risk_tags=approval.risk_tags,
        estimated_impact=approval.estimated_impact, proposed_args=approval.proposed_args,
        args_digest=approval.args_digest, agent_context=approval.agent_context,
        timeout_at=approval.timeout_at.isoformat(), auto_approve_on_timeout=approval.auto_approve_on_timeout,
        executor=bool(effect.tool_id and effect.tool and effect.tool.executor_url),
        created=approval.created.isoformat(), decided_by=approval.decided_by_label or None,
        decided_at=approval.decided_at.isoformat() if approval.decided_at else None,
        decision_reason=approval.decision_reason or None, rollback=approval.rollback,
    )


def payload_for(event: Event) -> EventPayload | ApprovalEventPayload:
    base = EventPayload(
        id=str(event.id), kind=event.kind, org=str(event.org_id),
        agent=event.agent.name if event.agent_id and event.agent else None,
        session=str(event.session_id) if event.session_id else None,
        created=event.created.isoformat(), data=event.data,
    )
    approval_id = (event.data.get("approval") or {}).get("id") if event.kind in APPROVAL_KINDS else None
    if approval_id:
        from approvals.models import ApprovalRequest

        approval = (ApprovalRequest.objects.select_related("effect__tool", "session__agent")
                    .filter(pk=approval_id, org_id=event.org_id).first())
        if approval is not None:
            return ApprovalEventPayload(**base, approval=approval_payload(approval))
    return base


def publish(org_id: Any, kind: str, payload: EventPayload | SessionUpdatedPayload) -> bool:
    """Send one message to the org's group. The layer may drop it (clients re-fetch on
    reconnect), so a failure is logged, never raised into the request that caused it."""
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        async_to_sync(layer.group_send)(group_name(org_id), Message(type=kind, payload=payload))
    except Exception:  # Redis down must not fail a committed decision
        log.exception("could not publish %s to the org's channel group", kind)
        return False
    return True


# ---------------------------------------------------------------- session.updated

MAX_SESSION_CHANGES = 20


class SessionUpdates:
    """Coalesces run changes into at most one `session.updated` per session per window, and
    publishes them from a background thread.

    `add()` is what a committed transaction calls (through `effects.models.announce`): it only
    updates a dict under a lock, with no query and no network, so the intercept and commit
    paths do not get slower. The thread waits `window_s` after the first change of a burst,
    then sends one message per session that moved, on its own event loop (the Redis layer
    keeps a connection pool per loop, so the pool is reused from one batch to the next).
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
        """Publish each payload to its org's group; the number sent. Never raises."""
        layer = get_channel_layer()
        if layer is None:
            return 0
        sent = 0
        for payload in batch:
            try:
                await layer.group_send(group_name(payload["org"]), Message(type="session.updated", payload=payload))
                sent += 1
            except Exception:  # Redis down: the pages catch up when they reconnect
                log.exception("could not publish session.updated for session %s", payload["session"])
        return sent

    def flush(self) -> int:
        """Send what is waiting now, from the caller's thread (tests, and at exit)."""
        batch = self.take()
        if not batch:
            return 0
        try:
            return async_to_sync(self.send)(batch)
        except Exception:
            log.exception("could not flush %d session.updated messages", len(batch))
            return 0

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        while True:
            self._wake.wait()
            # Let the burst finish: one message for all of it.
            time.sleep(settings.UNDOLOG_SESSION_UPDATE_WINDOW_MS / 1000)
            self._wake.clear()  # before take(): a change added after take() wakes us again
            batch = self.take()
            if batch:
                try:
                    loop.run_until_complete(self.send(batch))
                except Exception:  # keep the thread alive for the next batch
                    log.exception("could not publish %d session.updated messages", len(batch))


session_updates = SessionUpdates()


def session_changed(org_id: Any, session_id: Any, change: SessionChange, *, state: str | None = None,
                    step_index: int | None = None) -> None:
    """A run changed (called after its transaction committed): queue a `session.updated`."""
    session_updates.add(org_id, session_id, change, state=state, step_index=step_index)


# ---------------------------------------------------------------- words for people


def describe(payload: EventPayload) -> str:
    """One line a person reads in Slack or an email subject."""
    kind, data = payload["kind"], payload["data"]
    approval = payload.get("approval")
    agent = payload["agent"] or "an agent"
    if approval is not None:
        tool = approval["tool"]
        if kind == "approval.requested":
            impact = f": {approval['estimated_impact']}" if approval["estimated_impact"] else ""
            return f"{agent} asks to run {tool}{impact} (decide by {approval['timeout_at'][:19]}Z)."
        if kind == "approval.decided":
            why = f": {approval['decision_reason']}" if approval["decision_reason"] else ""
            return f"{approval['decided_by']} {approval['decision']} {agent}'s call to {tool}{why}."
        if kind == "approval.expired":
            return f"{agent}'s call to {tool} expired without a decision; the run was halted."
        if kind == "approval.extended":
            return f"{data.get('extended_by')} extended the deadline for {agent}'s call to {tool}."
    if kind == "compensation.failed":
        return f"A compensation of {agent}'s run failed and needs a person: {data.get('error') or data}."
    if kind == "permission_denied":
        return f"{agent}'s call to {data.get('tool_name')} was refused ({data.get('kind')}): {data.get('reason')}."
    return f"{kind} ({agent}): {data}"


def slack_body(payload: EventPayload, link: str = "") -> dict[str, Any]:
    """A Slack incoming-webhook body: `text` (notifications, fallbacks) and `blocks`."""
    text = describe(payload)
    fields = [f"*Event*\n{payload['kind']}", f"*Agent*\n{payload['agent'] or '-'}"]
    approval = payload.get("approval")
    if approval is not None:
        fields += [f"*Tool*\n{approval['tool']}", f"*Risk*\n{', '.join(approval['risk_tags']) or '-'}"]
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": text}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in fields]},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": f"undolog · {payload['created'][:19]}Z"
                                          + (f" · <{link}|open>" if link else "")}]},
    ]
    return {"text": text, "blocks": blocks}
