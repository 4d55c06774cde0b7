"""With OpenTelemetry installed (the `otel` extra), requests carry the caller's trace."""

from __future__ import annotations

import httpx
from opentelemetry import trace

from undolog import UndoLogClient

from fakeserver import FakeServer

TRACE_ID, SPAN_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7


def recording(server: FakeServer, seen: list[httpx.Request]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return server(request)

    return httpx.MockTransport(handle)


def test_a_request_inside_a_span_carries_its_traceparent() -> None:
    server, seen = FakeServer(), []
    client = UndoLogClient("http://undolog.test", "test-key", transport=recording(server, seen))
    parent = trace.SpanContext(TRACE_ID, SPAN_ID, is_remote=False, trace_flags=trace.TraceFlags(1))

    with trace.use_span(trace.NonRecordingSpan(parent)):
        client.register_compensation("undo_send_email", "1.0.0", "webhook", "https://x.test/undo")
    client.register_compensation("undo_send_email", "1.0.0", "webhook", "https://x.test/undo")

    inside, outside = seen
    assert inside.headers["traceparent"] == f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"
    assert "traceparent" not in outside.headers
