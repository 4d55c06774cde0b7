"""A real webhook receiver for tests and benchmarks: an HTTP server on a thread on 127.0.0.1.

It behaves like a careful production receiver: it verifies `Undolog-Signature` with the
documented verifier (`approvals.webhooks.verify`) and dedupes by `Idempotency-Key`, so
`applied` holds each key whose undo took effect (once), `duplicates` the redeliveries it
acknowledged without undoing again, and `deliveries[key]` every request that arrived.
A `behaviour(delivery) -> (status, delay_s)` scripts failures, slowness and timeouts.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from approvals.webhooks import SIGNATURE_HEADER, verify


@dataclass
class Delivery:
    key: str
    n: int  # 1 for the first request with this key, 2 for the second…
    body: dict
    raw: bytes
    headers: dict[str, str]
    verified: bool
    at: float = field(default_factory=time.monotonic)


Behaviour = Callable[[Delivery], tuple[int, float]]


def always_ok(delivery: Delivery) -> tuple[int, float]:
    return 200, 0.0


class Receiver:
    def __init__(self, secrets: list[str] | None = None, behaviour: Behaviour = always_ok, *,
                 keep_alive: bool = False) -> None:
        self.secrets = secrets  # None: accept unsigned (tests that do not care about signatures)
        self.behaviour = behaviour
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.log: list[Delivery] = []
        self.deliveries: Counter[str] = Counter()
        self.applied: dict[str, Delivery] = {}  # key → the delivery whose undo took effect
        self.duplicates: Counter[str] = Counter()  # 2xx redeliveries of an applied key (deduped)
        self.order: list[str] = []  # keys in the order their undo took effect
        self.own_ms: list[float] = []  # the receiver's own time per request (read → response written)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class(keep_alive))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/undo"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, predicate: Callable[[Receiver], bool], timeout: float = 30) -> None:
        with self.arrived:
            if not self.arrived.wait_for(lambda: predicate(self), timeout=timeout):
                raise AssertionError(f"receiver: condition not met in {timeout} s; saw {self.deliveries}")

    def _accept(self, raw: bytes, headers: dict[str, str]) -> tuple[Delivery, int, float]:
        verified = self.secrets is None or verify(self.secrets, headers.get(SIGNATURE_HEADER, ""), raw)
        key = headers.get("Idempotency-Key", "")
        with self.arrived:
            self.deliveries[key] += 1
            delivery = Delivery(key, self.deliveries[key], json.loads(raw or b"{}"), raw, headers, verified)
            self.log.append(delivery)
            status, delay = (401, 0.0) if not verified else self.behaviour(delivery)
            if 200 <= status < 300:
                # Dedupe by Idempotency-Key: a redelivery is acknowledged but must not undo twice.
                if key in self.applied:
                    self.duplicates[key] += 1
                else:
                    self.applied[key] = delivery
                    self.order.append(key)
            self.arrived.notify_all()
        return delivery, status, delay

    def _handler_class(self, keep_alive: bool) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.1 keeps the connection open between requests, as a production receiver
            # (behind nginx, a load balancer) does; HTTP/1.0 closes it after each answer.
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"
            # Headers and body leave in separate writes: on a kept connection Nagle would hold
            # the body until the client's delayed ACK (~40 ms a request).
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                started = time.perf_counter()
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                _, status, delay = receiver._accept(raw, dict(self.headers.items()))
                if delay:
                    time.sleep(delay)
                body = b'{"ok": true}' if status < 300 else b'{"error": "scripted"}'
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the caller gave up (timeout) or died (SIGKILL)
                receiver.own_ms.append((time.perf_counter() - started) * 1000)

            def log_message(self, *args) -> None:
                pass

        return Handler


def scripted(*statuses: int, then: int = 200, delay: float = 0.0) -> Behaviour:
    """Answer the n-th delivery of each key with statuses[n-1], then `then`."""

    def behaviour(delivery: Delivery) -> tuple[int, float]:
        n = delivery.n
        return (statuses[n - 1] if n <= len(statuses) else then), delay

    return behaviour


class FastReceiver:
    """The receiver for benchmarks: the same checks as `Receiver` (signature verified with the
    documented verifier, deduped by Idempotency-Key, the order of first applications kept) on one
    asyncio loop in a process of its own, every connection kept alive. The threaded server's
    Python cost a request ~0.2 ms of CPU, on the two cores the walkers are measured on; this one
    ~a quarter of that. No scripted behaviours: every verified request is answered 200 after
    `delay_s`, an unverified one 401."""

    def __init__(self, secrets: list[str] | None, delay_s: float = 0.0) -> None:
        self.secrets, self.delay_s = secrets, delay_s
        self.deliveries: Counter[str] = Counter()
        self.order: list[str] = []
        self.applied: set[str] = set()
        self.duplicates = 0
        self.unverified = 0
        self.own_ms: list[float] = []

    def accept(self, headers: dict[str, str], raw: bytes) -> int:
        if self.secrets is not None and not verify(self.secrets, headers.get(SIGNATURE_HEADER.lower(), ""), raw):
            self.unverified += 1
            return 401
        json.loads(raw or b"{}")  # a careful receiver parses what it applies
        key = headers.get("idempotency-key", "")
        self.deliveries[key] += 1
        if key in self.applied:
            self.duplicates += 1  # acknowledged, not undone twice
        else:
            self.applied.add(key)
            self.order.append(key)
        return 200

    async def serve(self, reader, writer) -> None:
        import asyncio

        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                started = time.perf_counter()
                lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name:
                        headers[name.strip().lower()] = value.strip()
                raw = await reader.readexactly(int(headers.get("content-length") or 0))
                status = self.accept(headers, raw)
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                body = b'{"ok": true}' if status == 200 else b'{"error": "unverified"}'
                reason = b"OK" if status == 200 else b"Unauthorized"
                writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (status, reason, len(body), body))
                await writer.drain()
                self.own_ms.append((time.perf_counter() - started) * 1000)
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client closed its kept connection, or the receiver is stopping
        finally:
            writer.close()


def main() -> None:
    """`python -m tests.receiver PORT_FILE RESULT_FILE [SECRET] [DELAY_MS]`: the receiver in a
    process of its own (a benchmark's receiver must not share the walker's GIL). Writes its port
    to PORT_FILE once listening; on SIGTERM writes what it saw to RESULT_FILE and exits."""
    import asyncio
    import signal
    import sys
    from pathlib import Path

    port_file, result_file = Path(sys.argv[1]), Path(sys.argv[2])
    secrets = [sys.argv[3]] if len(sys.argv) > 3 and sys.argv[3] else None
    delay = float(sys.argv[4]) / 1000 if len(sys.argv) > 4 else 0.0
    receiver = FastReceiver(secrets, delay)

    async def serve() -> None:
        done = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, done.set)
        server = await asyncio.start_server(receiver.serve, "127.0.0.1", 0, backlog=512)
        port_file.write_text(str(server.sockets[0].getsockname()[1]))
        await done.wait()
        server.close()

    asyncio.run(serve())
    result_file.write_text(json.dumps({"order": receiver.order, "duplicates": receiver.duplicates,
                                       "unverified": receiver.unverified, "own_ms": receiver.own_ms}))


if __name__ == "__main__":
    main()
