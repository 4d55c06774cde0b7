"""OpenTelemetry traces: off unless the usual OTel variables ask for them, and then the Django,
Celery and psycopg instrumentations plus the spans undolog adds itself (one per intercept
decision, one per outgoing webhook, whose request carries `traceparent`).

Off costs nothing: `ENABLED` is read once from the environment and, while it is False, no
OpenTelemetry module is imported and every helper here returns at its first line.

On when any of these is set: OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or
OTEL_TRACES_EXPORTER (`otlp`, `console`, or both comma-separated; `none` turns tracing off, as does
OTEL_SDK_DISABLED=true). The OTLP exporter is HTTP/protobuf and reads the standard variables
(endpoint, headers, timeout); OTEL_SERVICE_NAME names the process (default `undolog-web` /
`undolog-worker`), and the batch processor the OTEL_BSP_* ones.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any


def _configured(env: os._Environ | dict[str, str] = os.environ) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return False
    return bool(exporters or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


ENABLED = _configured()
_tracer: Any = None


def setup(service: str) -> bool:
    """Install the tracer provider, its exporters and the instrumentations, once per process.
    Called by the ASGI/WSGI entry points before Django loads its middleware (the Django
    instrumentation adds one) and by each Celery worker process as it starts."""
    global _tracer
    if not ENABLED or _tracer is not None:
        return False
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    name = os.environ.get("OTEL_SERVICE_NAME") or service
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    for processor in _processors():
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    _instrument()
    _tracer = trace.get_tracer("undolog")
    return True


def _processors() -> list[Any]:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    chosen = [name.strip() for name in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",")]
    processors = []
    if "otlp" in chosen:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processors.append(BatchSpanProcessor(OTLPSpanExporter()))
    if "console" in chosen:
        processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
    return processors


def _instrument() -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    DjangoInstrumentor().instrument()
    # The publishing side too: a task sent from a request carries the request's trace in its headers.
    CeleryInstrumentor().instrument()
    # No SQL commenter: it would make every statement text unique and defeat prepared statements.
    PsycopgInstrumentor().instrument(enable_commenter=False, skip_dep_check=True)


def on() -> bool:
    return _tracer is not None


@contextmanager
def span(name: str, kind: str = "INTERNAL", **attributes: Any):
    """A span under the current one, or nothing (yields None) while tracing is off."""
    if _tracer is None:
        yield None
        return
    from opentelemetry.trace import SpanKind

    with _tracer.start_as_current_span(name, kind=SpanKind[kind], attributes=attributes) as current:
        yield current


def inject(headers: dict[str, str]) -> dict[str, str]:
    """Add `traceparent` (and `tracestate`) of the current span to outgoing headers."""
    if _tracer is not None:
        from opentelemetry import propagate

        propagate.inject(headers)
    return headers


def activate(provider: Any) -> None:
    """Spans from this module go to `provider` (tests: a provider with an in-memory exporter)."""
    global _tracer
    _tracer = provider.get_tracer("undolog") if provider is not None else None
