"""A real local HTTP receiver for webhooks: a thread serving on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def receiver(statuses: list[int] | None = None):
    """Yields (url, hits). Each hit is {"headers", "body", "raw"}; answers `statuses` in turn, then 200."""
    hits: list[dict] = []
    answers = list(statuses or [])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            hits.append({"headers": dict(self.headers), "raw": raw, "body": json.loads(raw or b"null")})
            self.send_response(answers.pop(0) if answers else 200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/escalate", hits
    finally:
        server.shutdown()
        server.server_close()
