"""The dashboard websocket, through the real ASGI stack (origin check, cookies, session, auth)
and the real Redis channel layer: who may connect, which group it hears, what it forwards."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from orgs.models import Membership
from undolog_site.asgi import application

ORIGIN = (b"origin", b"http://127.0.0.1")


@pytest.fixture(autouse=True)
def fresh_channel_layer():
    """A layer instance per test: each test runs in its own event loop (async_to_sync), and a Redis
    layer keeps per-loop state (pools, the receive lock) from whichever loop used it first."""
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


def cookie_of(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


def communicator(cookie: bytes | None = None, path: str = "/ws/dashboard/",
                 origin: tuple = ORIGIN) -> WebsocketCommunicator:
    headers = [origin] if origin else []
    if cookie is not None:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, path, headers=headers)


def run(scenario) -> None:
    async_to_sync(scenario)()


async def publish(org, kind: str, payload: dict) -> None:
    await get_channel_layer().group_send(f"org.{org.id}", {"type": kind, "payload": payload})


async def connected(cookie: bytes, path: str = "/ws/dashboard/") -> WebsocketCommunicator:
    socket = communicator(cookie, path)
    ok, _ = await socket.connect()
    assert ok
    hello = await socket.receive_json_from(timeout=2)
    assert hello["type"] == "hello"
    return socket


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
