"""`session.updated`: a run's changes reach its org's open dashboards through the real Redis
channel layer and websocket, coalesced, after commit, and without a query on the hot path."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from approvals import events
from effects.models import Effect, Session
from tests.conftest import intercept, open_session
from tests.dashboard.conftest import connected, cookie_of
from tests.effects.conftest import build_stack
from tests.effects.test_query_counts import statements

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_channel_layer")]


def run(scenario):
    return async_to_sync(scenario)()


async def drain(socket, quiet_s: float = 0.4) -> list[dict]:
    """Everything the socket receives until it stays quiet for `quiet_s`."""
    received = []
    while not await socket.receive_nothing(timeout=quiet_s):
        received.append(await socket.receive_json_from())
    return received


def updates(messages: list[dict]) -> list[dict]:
    return [m["payload"] for m in messages if m["type"] == "session.updated"]


def commit(persona, effect_id: str, result: dict | None = None):
    return persona.api.post(f"/api/v1/effects/{effect_id}/commit", {"result": result or {"id": 1}}, format="json")


def test_an_agents_commit_reaches_an_open_dashboard_within_a_second(acme, tools, session_id):
    effect = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1).json()["effect"]["id"]
    cookie = cookie_of(acme.viewer.user)

    async def scenario():
        socket = await connected(cookie)
        await drain(socket)  # the intercept's own nudge, if it is still on its way
        started = time.monotonic()
        response = await sync_to_async(commit)(acme, effect)
        message = await socket.receive_json_from(timeout=1)
        elapsed = time.monotonic() - started
        await socket.disconnect()
        return response, message, elapsed

    response, message, elapsed = run(scenario)

    assert response.status_code == 200
    assert elapsed < 1.0, elapsed
    assert message["type"] == "session.updated"
    payload = message["payload"]
    assert (payload["kind"], payload["org"], payload["session"]) == ("session.updated", str(acme.org.id), session_id)
    assert payload["state"] is None  # only an effect moved; the page re-reads the run anyway
    assert payload["step_index"] == 1
    assert payload["changes"] == [{"what": "effect", "id": effect, "step_index": 1, "name": "send_email",
                                   "from": "executing", "to": "committed"}]
    assert payload["more"] == 0 and payload["created"]


def test_a_new_effect_is_announced_as_created(acme, tools, session_id):
    cookie = cookie_of(acme.viewer.user)

    async def scenario():
        socket = await connected(cookie)
        answer = await sync_to_async(intercept)(acme, session_id, "send_email", {"to": "a@x.io"}, 4)
        received = await drain(socket)
        await socket.disconnect()
        return answer.json()["effect"]["id"], received

    effect, received = run(scenario)

    [payload] = updates(received)
    assert payload["changes"] == [{"what": "effect", "id": effect, "step_index": 4, "name": "send_email",
                                   "from": None, "to": "executing"}]


def test_one_transactions_changes_are_one_message_with_the_sessions_new_state(acme, tools, session_id):
    effects = [intercept(acme, session_id, "send_email", {"to": f"u{n}@x.io"}, n).json()["effect"]["id"]
               for n in (1, 2)]
    cookie = cookie_of(acme.viewer.user)

    def finish_run() -> None:
        with transaction.atomic():
            for effect_id in effects:
                Effect.objects.get(pk=effect_id).commit({"ok": True}, actor="agent:cleanup")
            Session.objects.get(pk=session_id).complete(actor="agent:cleanup")

    async def scenario():
        socket = await connected(cookie)
        await drain(socket)
        await sync_to_async(finish_run)()
        received = await drain(socket)
        await socket.disconnect()
        return received

    [payload] = updates(run(scenario))

    assert payload["state"] == "completed"
    assert [(c["what"], c["from"], c["to"]) for c in payload["changes"]] == [
        ("effect", "executing", "committed"), ("effect", "executing", "committed"), ("session", "running", "completed")]


def test_a_burst_of_transitions_is_coalesced_not_one_message_each(acme, tools, session_id):
    cookie = cookie_of(acme.viewer.user)
    calls = 15

    def burst() -> float:
        started = time.monotonic()
        for step in range(1, calls + 1):
            effect = intercept(acme, session_id, "send_email", {"to": f"u{step}@x.io"}, step).json()["effect"]["id"]
            commit(acme, effect)
        return time.monotonic() - started

    async def scenario():
        socket = await connected(cookie)
        took = await sync_to_async(burst)()
        received = await drain(socket, quiet_s=0.6)
        await socket.disconnect()
        return took, updates(received)

    took, payloads = run(scenario)

    transitions = 2 * calls  # each call: created executing, then committed
    assert sum(len(p["changes"]) + p["more"] for p in payloads) == transitions
    window_s = events.settings.UNDOLOG_SESSION_UPDATE_WINDOW_MS / 1000
    assert len(payloads) <= took / window_s + 2, (len(payloads), took)
    assert len(payloads) < transitions


def test_runs_of_one_org_moving_in_one_window_are_one_group_message_and_a_frame_each(acme, tools, session_id):
    """The fan-out sends one group message per org per window (each group send is Redis round
    trips a worker pays even with no page open); the page still gets one session.updated per run."""
    other = open_session(acme)
    cookie = cookie_of(acme.viewer.user)
    group = events.group_name(acme.org.id)

    def move_both() -> None:
        with transaction.atomic():  # both announcements land together, after the commit
            for session in (session_id, other):
                intercept(acme, session, "send_email", {"to": "a@x.io"}, 1)
        events.session_updates.flush()  # the window closes now, in this thread

    async def scenario():
        layer = get_channel_layer()
        listener = await layer.new_channel()
        await layer.group_add(group, listener)
        socket = await connected(cookie)
        await drain(socket)
        await drain_group(layer, listener)  # the runs' creation
        await sync_to_async(move_both)()
        messages = await drain_group(layer, listener)
        received = await drain(socket)
        await socket.disconnect()
        await layer.group_discard(group, listener)
        return messages, received

    messages, received = run(scenario)

    assert [m["type"] for m in messages] == ["session.updates"]
    assert sorted(p["session"] for p in messages[0]["payloads"]) == sorted([session_id, other])
    assert {m["type"] for m in received} == {"session.updated"}
    assert sorted(p["session"] for p in updates(received)) == sorted([session_id, other])


async def drain_group(layer, channel: str, quiet_s: float = 0.4) -> list[dict]:
    """Every group message the channel receives until it stays quiet for `quiet_s`."""
    received = []
    while True:
        try:
            received.append(await asyncio.wait_for(layer.receive(channel), quiet_s))
        except TimeoutError:
            return received


def test_a_long_burst_lists_the_first_changes_and_counts_the_rest(acme, tools, session_id):
    effects = [intercept(acme, session_id, "send_email", {"to": f"u{n}@x.io"}, n).json()["effect"]["id"]
               for n in range(1, 31)]
    cookie = cookie_of(acme.viewer.user)

    def commit_all() -> None:
        with transaction.atomic():
            for effect_id in effects:
                Effect.objects.get(pk=effect_id).commit({}, actor="agent:cleanup")

    async def scenario():
        socket = await connected(cookie)
        await drain(socket)
        await sync_to_async(commit_all)()
        received = await drain(socket)
        await socket.disconnect()
        return received

    [payload] = updates(run(scenario))

    assert len(payload["changes"]) == events.MAX_SESSION_CHANGES
    assert payload["more"] == 30 - events.MAX_SESSION_CHANGES
    assert payload["step_index"] == 30


def test_nothing_is_announced_for_a_rolled_back_change(acme, tools, session_id):
    effect = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1).json()["effect"]["id"]
    cookie = cookie_of(acme.viewer.user)

    def commit_then_roll_back() -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            Effect.objects.get(pk=effect).commit({}, actor="agent:cleanup")
            raise RuntimeError("the request failed after the move")

    async def scenario():
        socket = await connected(cookie)
        await drain(socket)
        await sync_to_async(commit_then_roll_back)()
        received = await drain(socket)
        await socket.disconnect()
        return received

    assert updates(run(scenario)) == []
    assert Effect.objects.get(pk=effect).state == "executing"


def test_another_orgs_dashboard_hears_nothing_of_the_run(acme, outsider, tools, session_id):
    cookie = cookie_of(outsider.viewer.user)

    async def scenario():
        socket = await connected(cookie)
        effect = (await sync_to_async(intercept)(acme, session_id, "send_email", {"to": "a@x.io"}, 1)).json()
        await sync_to_async(commit)(acme, effect["effect"]["id"])
        received = await drain(socket, quiet_s=0.6)
        await socket.disconnect()
        return received

    assert run(scenario) == []


def test_the_undo_walk_announces_its_entries_and_the_sessions_end(acme, eager):
    stack = build_stack(acme, "tests.effects.undo_handlers.restore", 2, handler="python")
    cookie = cookie_of(acme.viewer.user)

    async def scenario():
        socket = await connected(cookie)
        await drain(socket)
        await sync_to_async(stack.fail)()  # the walk runs in the request (eager)
        received = await drain(socket)
        await socket.disconnect()
        return received

    payloads = updates(run(scenario))

    changes = [(c["what"], c["to"]) for p in payloads for c in p["changes"]]
    assert ("undo_entry", "running") in changes and ("undo_entry", "compensated") in changes
    assert ("effect", "compensated") in changes
    assert changes[-1] == ("session", "compensated")
    assert [p["state"] for p in payloads if p["state"]][-1] == "compensated"
    assert stack.session.state == "compensated"


def test_the_announcement_adds_no_query_to_intercept_or_commit_even_after_commit(acme, tools, session_id):
    intercept(acme, session_id, "send_email", {"to": "first@x.io"}, 1)  # stamps the key's last use

    with CaptureQueriesContext(connection) as intercepted:
        effect = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 2).json()["effect"]["id"]
    with CaptureQueriesContext(connection) as committed:
        commit(acme, effect)
    with CaptureQueriesContext(connection) as flushed:
        events.session_updates.flush()  # what the publishing thread does, here in this thread

    # Committed for real here (a transactional test): the on-commit announcements ran inside these.
    fast = connection.vendor == "postgresql"  # one statement each there (lifecycle/intercept/one_statement.py)
    assert len(statements(intercepted)) == (1 if fast else 8), statements(intercepted)
    assert len(statements(committed)) == (1 if fast else 4), statements(committed)
    assert flushed.captured_queries == []
