"""The nemesis's webhook receiver (tests/faults/nemesis.py's RECEIVER), run as the nemesis runs it:
what it logs about deliveries of one key that overlap, read at each arrival from the kernel (is
the earlier delivery's sender still waiting, its connection open?) and not from its own clock.

The rule `one delivery in flight per key` rests on this: two senders waiting at once is a
violation; a sender that gave up (timed out, hung up) and sent again is not, however late the
receiver answers the first."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import eventually
from tests.faults.nemesis import RECEIVER

TIMEOUT_S = 0.5  # the sender's timeout the receiver stalls past (a stall lasts TIMEOUT_S + 0.3)


@pytest.fixture
def receiver(tmp_path: Path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "receiver.jsonl"
    process = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port), str(log), "1", str(TIMEOUT_S)])
    url = f"http://127.0.0.1:{port}/undo"
    try:
        eventually(lambda: _up(url), timeout=15)
        yield url, log
    finally:
        process.kill()
        process.wait(timeout=10)


def _up(url: str) -> bool:
    try:
        httpx.get(url, timeout=1)
    except httpx.HTTPError:
        return False
    return True  # answered (501: it serves POST only)


def deliver(url: str, key: str, outcome: str, *, timeout: float = 10, attempt: int = 1) -> int | None:
    """One delivery with the outcome forced; its status, or None when the sender gave up."""
    try:
        return httpx.post(url, json={"attempt": attempt}, timeout=timeout,
                          headers={"Idempotency-Key": key, "X-Nemesis-Outcome": outcome}).status_code
    except httpx.HTTPError:
        return None


def logged(log: Path, count: int) -> list[dict]:
    def lines():
        found = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return sorted(found, key=lambda d: d["n"]) if len(found) >= count else None
    return eventually(lines, timeout=15)


def test_a_delivery_sent_while_another_of_its_key_waits_for_its_answer_is_logged_in_flight(receiver):
    url, log = receiver
    first = threading.Thread(target=deliver, args=(url, "k1", "stall"))
    first.start()
    time.sleep(0.2)  # the first is in (it stalls 0.8 s), its sender waiting

    assert deliver(url, "k1", "ok", attempt=2) == 200
    first.join()

    one, two = logged(log, 2)
    assert one["in_flight_with"] == [] and one["gave_up_on"] == []
    assert [d["n"] for d in two["in_flight_with"]] == [1] and two["gave_up_on"] == []
    assert (one["attempt"], two["attempt"]) == (1, 2)


def test_a_resend_after_the_sender_gave_up_is_not_in_flight_though_the_first_is_unanswered(receiver):
    url, log = receiver
    assert deliver(url, "k2", "stall", timeout=0.2) is None  # timed out: the sender hung up

    assert deliver(url, "k2", "ok", attempt=2) == 200  # while the receiver still holds the first

    one, two = logged(log, 2)
    assert two["arrived"] < one["ended"]  # by the receiver's clock the two overlap
    assert two["in_flight_with"] == [] and two["gave_up_on"] == [1]


def test_a_resend_after_an_answer_finds_nothing_in_flight(receiver):
    url, log = receiver
    assert deliver(url, "k3", "5xx") == 503

    assert deliver(url, "k3", "ok", attempt=2) == 200

    one, two = logged(log, 2)
    assert two["in_flight_with"] == [] and two["gave_up_on"] == []
    assert two["arrived"] > one["ended"]


def test_deliveries_of_other_keys_never_overlap_one_another(receiver):
    url, log = receiver
    threads = [threading.Thread(target=deliver, args=(url, key, "stall")) for key in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert all(d["in_flight_with"] == [] for d in logged(log, 2))


def test_a_request_whose_sender_hung_up_before_its_answer_is_logged_abandoned(receiver):
    url, log = receiver
    port = int(url.split(":")[2].split("/")[0])
    body = b'{"attempt": 1}'
    with socket.create_connection(("127.0.0.1", port)) as ghost:  # sent, then given up at once
        ghost.sendall(b"POST /undo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k5\r\nX-Nemesis-Outcome: ok\r\n"
                      b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        ghost.shutdown(socket.SHUT_WR)
    assert deliver(url, "k6", "ok") == 200

    ghost_logged, waited = sorted(logged(log, 2), key=lambda d: d["key"])
    assert ghost_logged["abandoned"] is True and waited["abandoned"] is False
