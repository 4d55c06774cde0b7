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


@pytest.mark.parametrize("how", ["revalidated", "head"])
def test_under_asgi_a_bodiless_answer_is_async_too_and_warns_nothing(how):
    """A page re-validates its CSS on every view (max-age=0 under DEBUG): WhiteNoise's 304 drew
    "StreamingHttpResponse must consume synchronous iterators" each time. Straight through the ASGI
    application, as uvicorn calls it: Django's test client empties a 304's body itself."""
    from asgiref.testing import ApplicationCommunicator

    from undolog_site.asgi import application

    async def call(method: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict, bytes]:
        scope = {"type": "http", "http_version": "1.1", "method": method, "path": "/static/undolog/dashboard.css",
                 "query_string": b"", "headers": headers}
        app = ApplicationCommunicator(application, scope)
        await app.send_input({"type": "http.request", "body": b""})
        start, body = await app.receive_output(2), b""
        while (part := await app.receive_output(2))["type"] == "http.response.body":
            body += part.get("body", b"")
            if not part.get("more_body"):
                break
        return start["status"], {k.lower(): v for k, v in start["headers"]}, body

    async def fetch():
        _, headers, _ = await call("GET", [])
        if how == "head":
            return await call("HEAD", [])
        return await call("GET", [(b"if-none-match", headers[b"etag"]),
                                  (b"if-modified-since", headers[b"last-modified"])])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status, _, body = async_to_sync(fetch)()

    assert status == (304 if how == "revalidated" else 200)
    assert body == b""
    assert not [w for w in caught if "StreamingHttpResponse" in str(w.message)], [str(w.message) for w in caught]


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
