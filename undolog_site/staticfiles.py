"""Static files the way each server wants them: WhiteNoise, with an async body under ASGI.

WhiteNoise answers with a `FileResponse` whose body is a synchronous file iterator. Under ASGI
(`make run`'s uvicorn) Django then warns, for every large file (the API docs' bundle), that a
StreamingHttpResponse must consume synchronous iterators, and buffers the whole file in memory
before sending it. Here, under ASGI, the same file is streamed by an async iterator whose reads
run in a thread; under WSGI (gunicorn) WhiteNoise's response is left as it is.
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


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    def serve(self, static_file, request):  # a static method on WhiteNoise; called on the instance
        response = WhiteNoiseMiddleware.serve(static_file, request)
        file = getattr(response, "file_to_stream", None)
        if isinstance(request, ASGIRequest) and file is not None:
            response.file_to_stream = None
            response.streaming_content = _chunks(file, BLOCK)
        return response
