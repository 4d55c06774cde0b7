"""A small round-robin HTTP proxy, the test's own load balancer: each request goes to the next
backend in turn (no stickiness), streamed both ways (SSE answers included). A backend that
refuses the connection is skipped, as a load balancer's health check would. It records which
backend served each JSON-RPC method, so a test can see one run's calls really alternate.

    python -m tests.gateway.proxy PORT BACKEND_URL [BACKEND_URL ...]
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import httpx
import uvicorn

HOP = {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"content-length"}


def app_for(backends: list[str], log: Path | None):
    turn = itertools.cycle(range(len(backends)))
    client = httpx.AsyncClient(timeout=httpx.Timeout(120, connect=2))

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP]
        path = scope["path"] + (("?" + scope["query_string"].decode()) if scope["query_string"] else "")
        for _ in range(len(backends)):
            index = next(turn)
            request = client.build_request(scope["method"], backends[index] + path, headers=headers,
                                           content=body)
            try:
                response = await client.send(request, stream=True)
            except httpx.ConnectError:
                continue  # that replica is down: the next one
            if log is not None and body:
                try:
                    method = json.loads(body).get("method")
                except (ValueError, AttributeError):
                    method = None
                with log.open("a") as out:
                    out.write(json.dumps([index, method]) + "\n")
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k, v) for k, v in response.headers.raw if k.lower() not in HOP]})
            try:
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx.HTTPError:
                pass  # the replica died mid-answer: the client sees the answer cut off
            finally:
                await response.aclose()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await send({"type": "http.response.start", "status": 502, "headers": []})
        await send({"type": "http.response.body", "body": b"no backend is up"})

    return app


def main() -> None:
    port, backends = int(sys.argv[1]), sys.argv[2:]
    log = Path(backends.pop()) if backends and not backends[-1].startswith("http") else None
    uvicorn.run(app_for(backends, log), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
