"""Events reach the org's Channels group through the real (Redis) channel layer, typed and with
the full context; another org's group hears nothing."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from approvals import events
from tests.approvals.conftest import hold
from tests.conftest import make_persona


def listen(groups: list[str], act, *, expect: int, quiet_s: float = 0.3,
           skip: frozenset[str] = frozenset({"session.updates"})) -> dict[str, list[dict]]:
    """Join `groups`, run `act()` (sync, in the test's thread), and collect messages per group
    until `expect` arrived and then `quiet_s` passed without another. Kinds in `skip` are left
    out (the runs' own `session.updated` nudges are tested in tests/dashboard)."""

    async def scenario() -> dict[str, list[dict]]:
        layer = get_channel_layer()
        channels = {group: await layer.new_channel() for group in groups}
        for group, channel in channels.items():
            await layer.group_add(group, channel)
        await sync_to_async(act)()
        received: dict[str, list[dict]] = {group: [] for group in groups}

        async def drain(group: str, channel: str) -> None:
            while True:
                message = await layer.receive(channel)
                if message["type"] not in skip:
                    received[group].append(message)

        tasks = [asyncio.ensure_future(drain(group, channel)) for group, channel in channels.items()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while sum(map(len, received.values())) < expect and loop.time() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(quiet_s)
        for task in tasks:
            task.cancel()
        for group, channel in channels.items():
            await layer.group_discard(group, channel)
        return received

    return async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
def test_a_new_request_reaches_the_orgs_group_with_its_full_context_and_nowhere_else():
    acme, globex = make_persona("acme"), make_persona("globex")
    held: dict = {}

    received = listen([events.group_name(acme.org.id), events.group_name(globex.org.id)],
                      lambda: held.update(hold(acme, reasoning="inactive for a year")), expect=1)

    assert received[events.group_name(globex.org.id)] == []
    [message] = received[events.group_name(acme.org.id)]
    assert message["type"] == "approval.requested"
    payload = message["payload"]
    assert (payload["kind"], payload["agent"], payload["session"]) == ("approval.requested", "cleanup",
                                                                        held["session"])
    approval = payload["approval"]
    assert approval["id"] == held["approval"]["id"]
    assert approval["agent_context"]["reasoning"][-1]["text"] == "inactive for a year"
    assert (approval["tool"], approval["risk_tags"], approval["state"]) == ("delete_account", ["data-loss"], "pending")
    assert approval["estimated_impact"] == "account acct-101 and its data"


@pytest.mark.django_db(transaction=True)
def test_a_decision_reaches_the_group_so_dashboards_drop_it_from_the_queue():
    acme = make_persona("acme")
    held = hold(acme)

    received = listen([events.group_name(acme.org.id)], lambda: acme.reviewer.post(
        f"/api/v1/approvals/{held['approval']['id']}/reject", {"reason": "open invoice"}, format="json"),
        expect=2)

    kinds = [message["type"] for message in received[events.group_name(acme.org.id)]]
    assert sorted(kinds) == ["approval.decided", "permission_denied"]
    decided = next(m for m in received[events.group_name(acme.org.id)] if m["type"] == "approval.decided")
    assert (decided["payload"]["approval"]["state"], decided["payload"]["approval"]["decided_by"],
            decided["payload"]["approval"]["decision_reason"]) == ("rejected", "acme-reviewer", "open invoice")


def test_the_notifier_publishes_one_typed_message_to_the_group():
    group = events.group_name("0f0f0f0f-0000-0000-0000-000000000000")
    payload = events.EventPayload(id="e1", kind="agent.suspended", org="o", agent="cleanup", session=None,
                                  created="2026-01-01T00:00:00+00:00", data={"reason": "budget"})

    received = listen([group], lambda: events.publish("0f0f0f0f-0000-0000-0000-000000000000",
                                                      "agent.suspended", payload), expect=1)

    assert received[group] == [{"type": "agent.suspended", "payload": payload}]


def test_a_burst_of_events_reaches_the_group_over_one_kept_redis_connection():
    """Each publish used to run on a new event loop, and channels_redis keeps its pool per loop: a
    connection opened and closed per message, in the request that recorded the event."""
    group = events.group_name("burst")
    stats = redis.Redis.from_url(settings.REDIS_URL)  # one connection of its own, opened below

    def connections_received() -> int:
        return stats.info("stats")["total_connections_received"]

    counted: list[int] = []

    def burst() -> None:
        events.publish("burst", "approval.requested", {"n": 0})  # the process's first: may connect
        counted.append(connections_received())
        for n in range(1, 20):
            assert events.publish("burst", "approval.requested", {"n": n})
        counted.append(connections_received())

    def from_a_plain_thread() -> None:
        # As a WSGI worker's request thread: no event loop of asgiref's to borrow.
        thread = threading.Thread(target=burst)
        thread.start()
        thread.join()

    try:
        received = listen([group], from_a_plain_thread, expect=20, quiet_s=0.1)
    finally:
        stats.close()

    assert [m["payload"]["n"] for m in received[group]] == list(range(20))
    assert counted[1] - counted[0] == 0, f"{counted[1] - counted[0]} new Redis connections for 19 messages"
