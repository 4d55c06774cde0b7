"""Dashboard fixtures: logged-in page clients for the personas, held requests, and for the
browser tests a real ASGI server and one headless Chromium (Debian's, driven by Playwright)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from tests.conftest import Persona, intercept, open_session, register_standard_tools
from tests.processes import asgi_server

ORIGIN = (b"origin", b"http://127.0.0.1")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--mute-audio"]
SCREENSHOTS = Path(settings.VAR_DIR)


def page_client(persona: Persona, role: str = "reviewer") -> Client:
    """A browser-like client (session cookie, CSRF) logged in as the persona's `role` person."""
    client = Client()
    client.force_login(getattr(persona, role).user)
    session = client.session
    session["org"] = persona.org.slug  # as the first page would; keeps that write out of counts
    session.save()
    return client


def hold(persona: Persona, args: dict | None = None, step: int = 2, reasoning: str = "Inactive for a year.\n"
         "The owner asked for deletion.", session: str | None = None) -> dict:
    """An irreversible call waiting for a reviewer (after one committed compensable call): the 202 body."""
    if session is None:
        register_standard_tools(persona)
        session = open_session(persona)
        sent = intercept(persona, session, "send_email", {"to": "owner@example.com", "subject": "bye"}, 1,
                         reasoning="Tell the owner first.")
        effect = sent.json()["effect"]["id"]
        persona.api.post(f"/api/v1/effects/{effect}/commit", {"result": {"message_id": "m-1"}}, format="json")
    response = intercept(persona, session, "delete_account", args or {"account_id": "acct-101"}, step,
                         reasoning=reasoning)
    assert response.status_code == 202, response.content
    return {**response.json(), "session": session}



@pytest.fixture(scope="session")
def server(django_db_setup) -> Iterator[str]:
    """The real ASGI app (HTTP and websockets) under uvicorn for the whole run; its base URL."""
    with asgi_server() as base:
        yield base


@pytest.fixture(scope="module")
def browser(server):
    """One headless Chromium per module. Started after the server, which must not inherit
    DJANGO_ALLOW_ASYNC_UNSAFE: Playwright's sync API keeps an event loop running in this
    thread, and the test's own ORM calls need Django's leave to run beside it."""
    from playwright.sync_api import sync_playwright

    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def new_page(browser, server):
    """Open a fresh browser context (its own cookies) per person; closed after the test."""
    contexts = []

    def open_page(viewport: dict | None = None):
        context = browser.new_context(base_url=server, viewport=viewport or {"width": 1440, "height": 900})
        context.set_default_timeout(10_000)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()


def log_in(page, user) -> None:
    """Log in through the login form. The server process hashes with the production hashers, not
    the tests' fast MD5, so the password is stored as a (cheap, 1000-round) PBKDF2 hash first."""
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    hasher = PBKDF2PasswordHasher()
    password = f"pw-{user.get_username()}"
    user.password = hasher.encode(password, hasher.salt(), iterations=1000)
    user.save(update_fields=["password"])
    page.goto("/accounts/login/")
    page.fill("#id_username", user.get_username())
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_selector("#live-status[data-state=live]")


# ---------------------------------------------------------------- websockets


@pytest.fixture
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
                 origin: tuple | None = ORIGIN) -> WebsocketCommunicator:
    """The dashboard's websocket through the real ASGI stack (origin check, cookies, session, auth)."""
    from undolog_site.asgi import application

    headers = [origin] if origin else []
    if cookie is not None:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, path, headers=headers)


async def connected(cookie: bytes, path: str = "/ws/dashboard/") -> WebsocketCommunicator:
    """A socket that was accepted and said hello."""
    socket = communicator(cookie, path)
    ok, _ = await socket.connect()
    assert ok
    hello = await socket.receive_json_from(timeout=2)
    assert hello["type"] == "hello"
    return socket
