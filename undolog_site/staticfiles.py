"""Static files the way each server wants them: WhiteNoise, with an async body under ASGI.

WhiteNoise answers with a `FileResponse` whose body is a synchronous file iterator. Under ASGI
(`make run`'s uvicorn) Django then warns, for every large file (the API docs' bundle), that a
StreamingHttpResponse must consume synchronous iterators, and buffers the whole file in memory
before sending it; its bodiless answers (a 304 Not Modified, a HEAD) drew the same warning. Here,
under ASGI, the same file is streamed by an async iterator whose reads run in a thread, and a
bodiless answer has an empty async body; under WSGI (gunicorn) WhiteNoise's response is left as it is.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from whitenoise.middleware import WhiteNoiseMiddleware

BLOCK = 64 * 1024


async def _chunks(file: Any, block_size: int):
    read, close = sync_to_async(file.read, thread_sensitive=False), sync_to_async(file.close, thread_sensitive=False)
    try:
        while chunk := await read(block_size):
            yield chunk
    finally:
        await close()


async def _nothing():
    return
    yield  # an async generator with no items


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    def serve(self, static_file, request):  # a static method on WhiteNoise; called on the instance
        response = WhiteNoiseMiddleware.serve(static_file, request)
        if not isinstance(request, ASGIRequest):
            return response
        file = getattr(response, "file_to_stream", None)
        response.file_to_stream = None
        # A body without a file (a 304 to a page re-validating its CSS, a HEAD) is an empty
        # synchronous iterator to WhiteNoise: the same warning, once per static file per page view.
        response.streaming_content = _chunks(file, BLOCK) if file is not None else _nothing()
        return response
