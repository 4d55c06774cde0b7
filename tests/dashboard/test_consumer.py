"""The dashboard websocket, through the real ASGI stack (origin check, cookies, session, auth)
and the real Redis channel layer: who may connect, which group it hears, what it forwards."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from orgs.models import Membership
from tests.dashboard.conftest import ORIGIN, communicator, connected, cookie_of
from undolog_site.asgi import application

pytestmark = pytest.mark.usefixtures("fresh_channel_layer")


def run(scenario):
    return async_to_sync(scenario)()


async def publish(org, kind: str, payload: dict) -> None:
    await get_channel_layer().group_send(f"org.{org.id}", {"type": kind, "payload": payload})


@pytest.mark.django_db(transaction=True)
def test_it_refuses_anonymous_users(acme):
    async def scenario():
        socket = communicator()
        ok, code = await socket.connect()
        assert not ok and code == 4401

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_it_refuses_a_foreign_origin(acme):
    acme_reviewer = cookie_of(acme.reviewer.user)

    async def scenario():
        socket = communicator(acme_reviewer, origin=(b"origin", b"https://evil.example.com"))
        ok, _ = await socket.connect()
        assert not ok

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_it_refuses_users_without_a_membership(acme):
    loner = get_user_model().objects.create_user("loner", password="pw")
    loner_cookie = cookie_of(loner)

    async def scenario():
        socket = communicator(loner_cookie)
        ok, code = await socket.connect()
        assert not ok and code == 4403

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_it_refuses_an_org_the_user_is_not_a_member_of(acme, outsider):
    acme_reviewer = cookie_of(acme.reviewer.user)

    async def scenario():
        socket = communicator(acme_reviewer, "/ws/dashboard/?org=globex")
        ok, code = await socket.connect()
        assert not ok and code == 4403

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_it_says_hello_with_the_org_and_role(acme):
    acme_viewer = cookie_of(acme.viewer.user)

    async def scenario():
        socket = communicator(acme_viewer)
        ok, _ = await socket.connect()
        hello = await socket.receive_json_from(timeout=2)
        await socket.disconnect()
        assert ok and hello == {"type": "hello", "payload": {"org": "acme", "role": "viewer"}}

    run(scenario)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", [
    "approval.requested", "approval.decided", "approval.expired", "approval.extended", "compensation.failed",
    "permission_denied", "budget.exceeded", "agent.suspended", "agent.resumed", "incident.changed",
    "session.updated",
])
def test_it_forwards_every_event_kind_of_its_org(acme, kind):
    acme_reviewer = cookie_of(acme.reviewer.user)

    async def scenario():
        socket = await connected(acme_reviewer)
        await publish(acme.org, kind, {"id": "e-1", "kind": kind, "data": {"n": 1}})
        message = await socket.receive_json_from(timeout=2)
        await socket.disconnect()
        assert message == {"type": kind, "payload": {"id": "e-1", "kind": kind, "data": {"n": 1}}}

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_a_quiet_socket_stays_open_past_several_blocking_receives_and_still_hears_the_next_event(acme, caplog):
    """The layer's receive blocks 5 s in BZPOPMIN: a read timeout at or under that closed every
    quiet socket with 1011 after ~5 s (redis-py 8's default). 12 s of silence spans two rounds."""
    acme_reviewer = cookie_of(acme.reviewer.user)

    async def scenario():
        socket = await connected(acme_reviewer)
        assert await socket.receive_nothing(timeout=12, interval=0.5)  # no close, nothing at all
        await publish(acme.org, "approval.requested", {"approval": {"id": "a-quiet"}})
        message = await socket.receive_json_from(timeout=2)
        await socket.disconnect()
        assert message["payload"] == {"approval": {"id": "a-quiet"}}

    with caplog.at_level("WARNING", logger="approvals.consumers"):
        run(scenario)
    assert not [r for r in caplog.records if r.name == "approvals.consumers"]


@pytest.mark.django_db(transaction=True)
def test_it_sends_no_message_across_orgs(acme, outsider):
    acme_reviewer = cookie_of(acme.reviewer.user)
    outsider_reviewer = cookie_of(outsider.reviewer.user)

    async def scenario():
        ours = await connected(acme_reviewer)
        theirs = await connected(outsider_reviewer)
        await publish(acme.org, "approval.requested", {"approval": {"id": "a-1"}})
        received = await ours.receive_json_from(timeout=2)
        assert await theirs.receive_nothing(timeout=0.5)
        await publish(outsider.org, "incident.changed", {"data": {"on": True}})
        assert (await theirs.receive_json_from(timeout=2))["type"] == "incident.changed"
        assert await ours.receive_nothing(timeout=0.5)
        await ours.disconnect()
        await theirs.disconnect()
        assert received["payload"] == {"approval": {"id": "a-1"}}

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_it_joins_the_org_chosen_by_a_member_of_several(acme, outsider):
    user = acme.reviewer.user
    Membership.objects.create(user=user, org=outsider.org, role="viewer")
    cookie = cookie_of(user)

    async def scenario():
        unchosen = communicator(cookie)
        ok, code = await unchosen.connect()
        assert not ok and code == 4403  # several orgs, none chosen
        socket = communicator(cookie, "/ws/dashboard/?org=globex")
        ok, _ = await socket.connect()
        hello = await socket.receive_json_from(timeout=2)
        await publish(acme.org, "approval.requested", {})
        assert await socket.receive_nothing(timeout=0.5)
        await publish(outsider.org, "approval.requested", {"id": "g"})
        message = await socket.receive_json_from(timeout=2)
        await socket.disconnect()
        assert ok and hello["payload"] == {"org": "globex", "role": "viewer"}
        assert message["payload"] == {"id": "g"}

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_it_uses_the_org_chosen_in_the_session(acme, outsider):
    user = acme.reviewer.user
    Membership.objects.create(user=user, org=outsider.org, role="admin")
    client = Client()
    client.force_login(user)
    client.post("/orgs/", {"org": "globex"})
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()

    async def scenario():
        socket = WebsocketCommunicator(application, "/ws/dashboard/", headers=[ORIGIN, (b"cookie", cookie)])
        ok, _ = await socket.connect()
        hello = await socket.receive_json_from(timeout=2)
        await socket.disconnect()
        assert ok and hello["payload"] == {"org": "globex", "role": "admin"}

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_it_ignores_unknown_event_kinds_and_stays_open(acme):
    acme_reviewer = cookie_of(acme.reviewer.user)

    async def scenario():
        socket = await connected(acme_reviewer)
        await publish(acme.org, "something.new", {"x": 1})
        await get_channel_layer().group_send(f"org.{acme.org.id}", {"type": "_private"})
        assert await socket.receive_nothing(timeout=0.5)
        await publish(acme.org, "approval.decided", {"id": "after"})
        message = await socket.receive_json_from(timeout=2)
        await socket.disconnect()
        assert message["payload"] == {"id": "after"}

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_it_sends_a_batch_of_events_as_one_frame_each_in_order_dropping_unknown_kinds(acme):
    """A window's events of the fast approval path reach the group as one `event.batch` message
    (core.fanout.publish_many); the page sees each as if it had come alone."""
    from core.fanout import publish_many

    acme_reviewer = cookie_of(acme.reviewer.user)
    messages = [{"type": "approval.requested", "payload": {"id": "a-1"}},
                {"type": "something.new", "payload": {"id": "x"}},
                {"type": "approval.decided", "payload": {"id": "a-2"}}]

    async def scenario():
        socket = await connected(acme_reviewer)
        assert await sync_to_async(publish_many)(acme.org.id, messages)
        first = await socket.receive_json_from(timeout=2)
        second = await socket.receive_json_from(timeout=2)
        assert await socket.receive_nothing(timeout=0.5)
        await socket.disconnect()
        return [first, second]

    assert run(scenario) == [messages[0], messages[2]]


@pytest.mark.django_db(transaction=True)
def test_it_answers_pings_and_ignores_other_browser_messages(acme):
    acme_reviewer = cookie_of(acme.reviewer.user)

    async def scenario():
        socket = await connected(acme_reviewer)
        await socket.send_json_to({"type": "approve", "id": str(uuid.uuid4())})
        await socket.send_to(text_data="not json at all")
        await asyncio.sleep(0.1)
        socket2 = await connected(acme_reviewer)
        await socket2.send_json_to({"type": "ping"})
        pong = await socket2.receive_json_from(timeout=2)
        await socket2.disconnect()
        assert pong == {"type": "pong", "payload": {}}

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_it_never_writes_to_the_database(acme):
    acme_reviewer = cookie_of(acme.reviewer.user)

    async def scenario():
        socket = await connected(acme_reviewer)
        await publish(acme.org, "approval.requested", {"id": "x"})
        await socket.receive_json_from(timeout=2)
        await socket.send_json_to({"type": "ping"})
        await socket.receive_json_from(timeout=2)
        await socket.disconnect()

    with CaptureQueriesContext(connection) as queries:
        run(scenario)

    statements = [q["sql"] for q in queries.captured_queries]
    assert statements, "the membership check reads the database"
    assert all(sql.lstrip().upper().startswith("SELECT") for sql in statements), statements


@pytest.mark.django_db(transaction=True)
def test_it_stops_hearing_the_group_after_disconnect(acme):
    acme_reviewer = cookie_of(acme.reviewer.user)

    async def scenario():
        socket = await connected(acme_reviewer)
        await socket.disconnect()
        layer = get_channel_layer()
        # The group no longer holds a channel for it: a send reaches no one and fails nothing.
        await layer.group_send(f"org.{acme.org.id}", {"type": "approval.requested", "payload": {}})

    run(scenario)


# ---------------------------------------------------------------- every kind the server publishes

APPS = ("approvals", "budgets", "effects", "lifecycle", "ops", "orgs")


def recorded_kinds() -> set[str]:
    """Every kind an `Event.record(org, "<kind>", ...)` call in the apps' code can write."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"Event\.record\(\s*[\w.]+\s*,\s*\"([a-z_.]+)\"")
    return {kind for app in APPS for path in (root / app).rglob("*.py") for kind in pattern.findall(path.read_text())}


def test_every_recorded_kind_and_session_updated_is_a_known_kind_with_a_handler():
    from approvals.consumers import EVENT_HANDLERS, DashboardConsumer
    from approvals.models import EVENT_KINDS

    kinds = recorded_kinds()

    assert {"approval.requested", "approval.extended", "compensation.failed", "permission_denied"} <= kinds
    assert kinds | {"session.updated"} == set(EVENT_KINDS), "a kind is recorded that webhooks and pages do not know"
    assert set(EVENT_HANDLERS) == set(EVENT_KINDS)
    for kind in EVENT_KINDS:
        assert callable(getattr(DashboardConsumer, kind.replace(".", "_"), None)), kind


@pytest.mark.django_db(transaction=True)
def test_every_recorded_kind_reaches_the_socket_through_the_notifier_and_it_stays_open(acme):
    from django.db import transaction

    from orgs.models import Event
    from tests.dashboard.conftest import hold

    held = hold(acme)
    approval = {"id": held["approval"]["id"]}
    cookie = cookie_of(acme.reviewer.user)
    kinds = sorted(recorded_kinds())

    def record_all() -> None:
        for kind in kinds:
            with transaction.atomic():  # each fanned out after its own commit, as in the app
                Event.record(acme.org, kind, agent=acme.agent, session_id=held["session"], approval=approval,
                             on=True, by="acme-admin", reason="budget", tool_name="delete_account")

    async def scenario():
        socket = await connected(cookie)
        while not await socket.receive_nothing(timeout=0.4):  # hold()'s own messages
            await socket.receive_json_from()
        await sync_to_async(record_all)()
        received = []
        while not await socket.receive_nothing(timeout=0.5):
            received.append(await socket.receive_json_from())
        await socket.send_json_to({"type": "ping"})
        pong = await socket.receive_json_from(timeout=2)
        await socket.disconnect()
        return received, pong

    received, pong = run(scenario)

    forwarded = [m for m in received if m["type"] != "session.updated"]
    assert [m["type"] for m in forwarded] == kinds
    for message in forwarded:
        assert (message["payload"]["kind"], message["payload"]["session"]) == (message["type"], held["session"])
        if message["type"].startswith("approval."):
            assert message["payload"]["approval"]["id"] == approval["id"]  # the request as it is now
    assert pong["type"] == "pong"


@pytest.mark.django_db(transaction=True)
def test_a_redis_outage_closes_the_socket_with_one_log_line_and_no_traceback(acme, settings, caplog):
    from tests.services import own_redis
    from undolog_site.settings import channel_layer_host

    reviewer = cookie_of(acme.reviewer.user)
    with own_redis() as redis_server:
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": settings.CHANNEL_LAYER_BACKEND,
                                               "CONFIG": {"hosts": [channel_layer_host(redis_server.url)],
                                                          "prefix": "undolog"}}}
        from channels.layers import channel_layers

        channel_layers.backends.clear()

        async def scenario():
            socket = await connected(reviewer)
            redis_server.stop()  # the layer's Redis goes away under an open socket
            closed = await socket.receive_output(timeout=10)
            assert closed == {"type": "websocket.close", "code": 1011}
            await socket.wait()

        with caplog.at_level("WARNING", logger="approvals.consumers"):
            run(scenario)

    lines = [r for r in caplog.records if r.name == "approvals.consumers"]
    assert len(lines) == 1 and "Redis is unreachable" in lines[0].getMessage() and lines[0].exc_info is None
