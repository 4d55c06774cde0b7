"""`core.outbound.post_many`, the fleet rollback's sender: many signed POSTs at once on kept
connections, each answered as `post` answers it, against real local receivers."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from core import outbound
from tests.receiver import Receiver

SECRET = "whsec_test_fleet_sends"


def request(url: str, n: int, timeout_s: float = 5) -> outbound.Request:
    return outbound.Request(url, {"n": n}, SECRET, timeout_s, {"Idempotency-Key": f"key-{n}"})


@pytest.fixture
def one_sender(monkeypatch):
    """One sender thread, so that consecutive batches go over the same kept connection."""
    pool = ThreadPoolExecutor(max_workers=1)
    monkeypatch.setattr(outbound, "_pool", (outbound.os.getpid(), pool))
    yield
    pool.shutdown()


def test_it_answers_each_request_in_order_over_a_few_kept_connections():
    statuses = {0: 503, 1: 404, 2: 429}
    with Receiver([SECRET], behaviour=lambda d: (statuses.get(d.body["n"] % 5, 200), 0.0), keep_alive=True) as rec:
        connections = []
        accept = rec.server.process_request
        rec.server.process_request = lambda sock, address: (connections.append(address), accept(sock, address))

        first = outbound.post_many([request(rec.url, n) for n in range(40)])
        second = outbound.post_many([request(rec.url, n) for n in range(40, 80)])

    answers = first + second
    assert [d.status_code for d in answers] == [statuses.get(n % 5, 200) for n in range(80)]
    assert [d.ok for d in answers] == [n % 5 > 2 for n in range(80)]
    assert [d.retryable for d in answers[:5]] == [True, False, True, False, False]
    assert answers[1].error.startswith("HTTP 404: ")
    assert sorted(rec.applied) == sorted(f"key-{n}" for n in range(80) if n % 5 > 2)  # verified, each once
    assert all(d.verified for d in rec.log)
    # Kept alive: the second batch went over the first one's connections.
    assert len(connections) <= outbound.SENDERS


def test_a_kept_connection_the_receiver_closed_is_not_sent_on(one_sender):
    """The receiver answers keep-alive, then closes the connection (its idle timeout): the next
    request goes over a new connection, sent once."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen = []

    def serve():
        for _ in range(2):
            conn, _ = listener.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                seen.append(data.split(b"\r\n", 1)[0])
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/undo"
    try:
        first = outbound.post_many([request(url, 1)])
        server.join(0.2)  # the server closed the first connection after answering
        second = outbound.post_many([request(url, 2)])
        server.join(5)
    finally:
        listener.close()

    assert [d.status_code for d in first + second] == [200, 200]
    assert seen == [b"POST /undo HTTP/1.1"] * 2


def test_a_slow_receiver_times_out_and_is_retryable():
    with Receiver([SECRET], behaviour=lambda d: (200, 1.0), keep_alive=True) as rec:
        [delivery] = outbound.post_many([request(rec.url, 1, timeout_s=0.2)])

    assert not delivery.ok and delivery.status_code is None and delivery.retryable
    assert delivery.error == "timed out after 0.2 s"


def test_a_refused_connection_is_retryable():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, never listening: the connection is refused

        [delivery] = outbound.post_many([request(f"http://127.0.0.1:{port}/undo", 1)])

    assert not delivery.ok and delivery.status_code is None and delivery.retryable
    assert "Connection refused" in delivery.error


def test_a_target_the_ssrf_rule_refuses_is_permanent_and_never_called(settings):
    settings.UNDOLOG_ALLOW_PRIVATE_WEBHOOKS = False
    with Receiver([SECRET], keep_alive=True) as rec:
        deliveries = outbound.post_many([request(rec.url, n) for n in range(3)])

    assert [(d.ok, d.status_code, d.retryable) for d in deliveries] == [(False, 400, False)] * 3
    assert "private or loopback" in deliveries[0].error
    assert not rec.log
