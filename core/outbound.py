"""Outbound HTTP, for every app: the SSRF rule, the signature, and one signed POST. Org
webhooks and executors (approvals), escalations (budgets) and compensation webhooks
(effects) all go out through `post()`; every URL a person or an agent registers is checked
with `check_target()` first.

Signature header: `Undolog-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">`
with the org's webhook secret (during a rotation's overlap, a second `v1=` with the previous one).
See README "Verifying webhooks" for the receiver's side.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import http.client
import ipaddress
import json
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

import certifi
import httpx
from django.conf import settings

from core import tracing

SIGNATURE_HEADER = "Undolog-Signature"
TOLERANCE_S = 300


def check_target(url: str) -> str | None:
    """Why this URL may not be called, or None. http(s) only; no private ranges unless allowed."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "Must be an http(s) URL with a host."
    if settings.UNDOLOG_ALLOW_PRIVATE_WEBHOOKS:
        return None
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 443, proto=socket.IPPROTO_TCP)
    except socket.gaierror:
        return f"The host {parts.hostname} does not resolve."
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global:
            return (f"{parts.hostname} resolves to a private or loopback address ({address}); "
                    "set UNDOLOG_ALLOW_PRIVATE_WEBHOOKS to allow it.")
    return None


def sign(secret: str | Sequence[str], body: bytes, timestamp: int | None = None) -> str:
    """`t=…,v1=…`; with several secrets (a rotation's overlap) one `v1=` per secret, newest first,
    so a receiver that holds any one of them verifies (`verify` tries every `v1`)."""
    t = int(time.time()) if timestamp is None else timestamp
    keys = [secret] if isinstance(secret, str) else list(secret)
    digests = (hmac.new(key.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest() for key in keys)
    return f"t={t}," + ",".join(f"v1={digest}" for digest in digests)


def verify(secrets: list[str], header: str, body: bytes, *, now: float | None = None,
           tolerance_s: int = TOLERANCE_S) -> bool:
    """The receiver's check: any of the secrets (two during a rotation), within the tolerance,
    compared in constant time over the raw body."""
    try:
        fields = dict(part.split("=", 1) for part in header.split(","))
        t = int(fields["t"])
    except (ValueError, KeyError):
        return False
    if abs((time.time() if now is None else now) - t) > tolerance_s:
        return False
    candidates = [value for key, value in (part.split("=", 1) for part in header.split(",")) if key == "v1"]
    for secret in secrets:
        expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
        if any(hmac.compare_digest(expected, candidate) for candidate in candidates):
            return True
    return False


@dataclass
class Delivery:
    ok: bool
    status_code: int | None
    error: str
    duration_ms: int
    body: str = ""

    @property
    def retryable(self) -> bool:
        """2xx done; 4xx other than 408/429 permanent; 5xx, timeouts and refusals retried."""
        if self.ok:
            return False
        return self.status_code is None or self.status_code >= 500 or self.status_code in (408, 429)


def post(url: str, payload: dict, *, secret: str | Sequence[str], timeout_s: float,
         headers: dict[str, str] | None = None) -> Delivery:
    problem = check_target(url)
    if problem:
        return Delivery(False, 400, problem, 0)  # a refused target is permanent
    return _post(url, payload, secret, timeout_s, headers, _send)


def _post(url: str, payload: dict, secret: str | Sequence[str], timeout_s: float, headers: dict[str, str] | None,
          send) -> Delivery:
    started = time.monotonic()
    body = json.dumps(payload, separators=(",", ":")).encode()
    all_headers = {"Content-Type": "application/json", SIGNATURE_HEADER: sign(secret, body),
                   "User-Agent": "undolog-webhooks/1", **(headers or {})}
    with tracing.span("POST", "CLIENT", **{"http.request.method": "POST", "url.full": url}) as span:
        # The receiver continues the caller's trace (the walk's task, the approval's request).
        delivery = send(url, body, tracing.inject(all_headers), timeout_s, started)
        if span is not None and delivery.status_code is not None:
            span.set_attribute("http.response.status_code", delivery.status_code)
    return delivery


@dataclass(frozen=True)
class Request:
    """One of `post_many`'s POSTs: what `post` takes."""

    url: str
    payload: dict
    secret: str | Sequence[str]
    timeout_s: float
    headers: dict[str, str] | None = None


# Concurrent POSTs per process for post_many: enough to overlap many receivers' time.
SENDERS = 16


def post_many(requests: Sequence[Request]) -> list[Delivery]:
    """`post` for many at once (a fleet rollback's round): the same SSRF rule (checked once per
    distinct URL), signature, timeout and outcome per request, sent concurrently on this process's
    sender threads, answers in the order asked.

    Sent with the standard library's HTTP/1.1 client, each sender thread keeping one connection
    alive per host: httpx's layers cost a request ~0.55 ms of CPU against ~0.2 ms (bench/rollback's
    profile), and at a thousand compensations a second on two cores that was most of a worker."""
    problems = {url: check_target(url) for url in {request.url for request in requests}}
    futures = []
    for request in requests:
        if problems[request.url]:
            futures.append(Delivery(False, 400, problems[request.url], 0))  # a refused target is permanent
            continue
        # Each in a copy of the caller's context, so its span joins the caller's trace.
        futures.append(_senders().submit(contextvars.copy_context().run, _post, request.url, request.payload,
                                         request.secret, request.timeout_s, request.headers, _send_kept))
    return [future if isinstance(future, Delivery) else future.result() for future in futures]


_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _senders() -> ThreadPoolExecutor:
    """The process's sender threads, made lazily and per process id (a forked worker makes its own)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(max_workers=SENDERS, thread_name_prefix="outbound"))
        return _pool[1]


# The exceptions of a kept connection the receiver closed meanwhile (idle timeout, restart): the
# request is sent again once on a fresh connection. It may have arrived the first time; every
# request post_many sends carries an Idempotency-Key (the receiver dedupes), as retries do.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


def _send_kept(url: str, body: bytes, headers: dict[str, str], timeout_s: float, started: float) -> Delivery:
    parts = urlsplit(url)
    key = (parts.scheme, parts.hostname, parts.port)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    kept: dict = _local.__dict__.setdefault("kept", {})
    if _local.__dict__.get("kept_pid") != os.getpid():
        kept.clear()  # a forked child never shares its parent's sockets
        _local.kept_pid = os.getpid()
    for attempt in (1, 2):
        conn = kept.pop(key, None)
        reused = conn is not None and conn.sock is not None and not _closed_by_peer(conn.sock)
        if not reused:
            if conn is not None:
                conn.close()
            conn = (http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout_s, context=_tls())
                    if parts.scheme == "https" else http.client.HTTPConnection(parts.hostname, parts.port,
                                                                                 timeout=timeout_s))
        else:
            conn.sock.settimeout(timeout_s)
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            text = response.read().decode("utf-8", "replace")
        except _STALE as exc:
            conn.close()
            if reused and attempt == 1:
                continue
            return Delivery(False, None, f"{type(exc).__name__}: {exc}", _ms(started))
        except TimeoutError:
            conn.close()
            return Delivery(False, None, f"timed out after {timeout_s:g} s", _ms(started))
        except (OSError, http.client.HTTPException, ValueError) as exc:
            conn.close()
            return Delivery(False, None, f"{type(exc).__name__}: {exc}", _ms(started))
        if response.will_close:
            conn.close()
        else:
            kept[key] = conn
        return _answered(response.status, text, started)
    raise AssertionError("unreachable")  # the loop returns on its second attempt


def _closed_by_peer(sock: socket.socket) -> bool:
    """A kept connection with something to read before we asked: the peer closed it (EOF) or broke
    the protocol; either way not one to send on."""
    poller = select.poll()  # not select(): a worker's descriptors may number past 1024
    try:
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


def _send(url: str, body: bytes, headers: dict[str, str], timeout_s: float, started: float) -> Delivery:
    try:
        response = _client().post(url, content=body, headers=headers, timeout=timeout_s)
    except httpx.TimeoutException:
        return Delivery(False, None, f"timed out after {timeout_s:g} s", _ms(started))
    except httpx.HTTPError as exc:
        return Delivery(False, None, f"{type(exc).__name__}: {exc}", _ms(started))
    return _answered(response.status_code, response.text, started)


def _answered(status: int, text: str, started: float) -> Delivery:
    """The outcome of a request the receiver answered (either sender's): a 2xx delivered, else
    the status and the start of what it said."""
    ok = 200 <= status < 300
    return Delivery(ok, status, "" if ok else f"HTTP {status}: {text[:500]}", _ms(started), text[:10_000])


_local = threading.local()


def _client() -> httpx.Client:
    """One keep-alive client per process and thread: a walk of many compensations to one receiver
    reuses its connection instead of opening one (and a TLS handshake) per call. Made lazily and
    per process id, so a Celery worker forked from its parent never shares the parent's sockets."""
    client = getattr(_local, "client", None)
    if client is None or _local.pid != os.getpid():
        client = _local.client = httpx.Client(verify=_tls(), follow_redirects=False,
                                              limits=httpx.Limits(max_keepalive_connections=8, keepalive_expiry=30))
        _local.pid = os.getpid()
    return client


@lru_cache(maxsize=1)
def _tls() -> ssl.SSLContext:
    # One TLS context per process: httpx.post builds a new one per call otherwise, loading the
    # CA bundle each time (~27 ms of CPU, measured by bench/undo.py: more than half a webhook).
    return ssl.create_default_context(cafile=certifi.where())


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
