"""Static files under ASGI stream from an async iterator (no "StreamingHttpResponse must consume
synchronous iterators" warning, no whole file buffered first), under WSGI as WhiteNoise serves
them; and /favicon.ico answers instead of a 404 on every page."""

from __future__ import annotations

import warnings

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import AsyncClient, Client

pytestmark = pytest.mark.django_db

CSS = settings.BASE_DIR / "static" / "undolog" / "dashboard.css"


def test_under_asgi_a_static_file_streams_asynchronously_and_whole_without_a_warning():
    async def fetch():
        response = await AsyncClient().get("/static/undolog/dashboard.css")
        return response, b"".join([chunk async for chunk in response])

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Django's warning about a synchronous iterator fails the test
        response, body = async_to_sync(fetch)()

    assert response.status_code == 200 and response.is_async
    assert body == CSS.read_bytes()
    assert response["Content-Length"] == str(len(body))


def test_under_wsgi_whitenoise_serves_it_as_before():
    response = Client().get("/static/undolog/dashboard.css")

    assert response.status_code == 200 and not response.is_async
    assert b"".join(response.streaming_content) == CSS.read_bytes()


def test_the_favicon_answers():
    client = Client()
    redirect = client.get("/favicon.ico")
    assert redirect.status_code == 301

    icon = client.get(redirect["Location"])

    assert icon.status_code == 200 and icon["Content-Type"].startswith("image/svg+xml")
    assert b"<svg" in b"".join(icon.streaming_content)
