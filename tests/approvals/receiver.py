"""A real local HTTP receiver for webhooks: a thread serving on 127.0.0.1 that records every
request and answers from a script of status codes (the last one repeats)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self):
        return json.loads(self.body)


@dataclass
class Receiver:
    statuses: list[int] = field(default_factory=lambda: [200])
    answer: dict = field(default_factory=lambda: {"ok": True})
    delay_s: float = 0.0
    requests: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with owner._lock:
                    owner.requests.append(Received(self.path, dict(self.headers), body, time.monotonic()))
                    status = owner.statuses[min(len(owner.requests), len(owner.statuses)) - 1]
                if owner.delay_s:
                    time.sleep(owner.delay_s)
                payload = json.dumps(owner.answer if status < 300 else {"error": "boom"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def wait_for(self, count: int, timeout: float = 10) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.requests) >= count:
                    return list(self.requests)
            time.sleep(0.02)
        raise AssertionError(f"expected {count} requests, got {len(self.requests)}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
