"""Traces: a span per intercept decision with the GenAI tool attributes; one trace from an SDK
call through the server, the Celery walk and the compensation webhook; nothing when off."""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from undolog import UndoLogClient

from core import tracing
from tests.conftest import eventually, intercept
from tests.otlp import Collector
from tests.processes import BASE_DIR, asgi_server, celery_worker, child_env
from tests.receiver import Receiver
from tests.sdk import agent_tools


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.activate(provider)
    yield exporter
    tracing.activate(None)


@pytest.mark.django_db
def test_each_intercept_decision_is_a_span_with_the_genai_tool_attributes(acme, session_id, spans):
    executed = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1).json()
    held = intercept(acme, session_id, "delete_account", {"account_id": "acct-1"}, 2).json()

    first, second = spans.get_finished_spans()
    assert first.name == "execute_tool send_email"
    assert dict(first.attributes) == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "send_email", "gen_ai.tool.type": "function",
        "gen_ai.tool.call.id": executed["effect"]["id"], "undolog.tier": "compensable",
        "undolog.decision": "execute", "undolog.session.id": session_id}
    assert second.name == "execute_tool delete_account"
    assert (second.attributes["undolog.tier"], second.attributes["undolog.decision"]) == \
        ("irreversible", "await_approval")
    assert second.attributes["gen_ai.tool.call.id"] == held["effect"]["id"]


@pytest.mark.django_db
def test_a_refused_or_failed_intercept_is_a_span_too(acme, session_id, spans):
    intercept(acme, session_id, "no_such_tool", {}, 1)

    (span,) = spans.get_finished_spans()
    assert span.name == "execute_tool no_such_tool"
    assert (span.attributes["undolog.decision"], span.attributes["error.type"]) == \
        ("tool_not_registered", "tool_not_registered")


def test_tracing_is_on_only_when_the_otel_variables_ask_for_it():
    assert not tracing._configured({})
    assert tracing._configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing._configured({"OTEL_TRACES_EXPORTER": "console"})
    assert not tracing._configured({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert not tracing._configured({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})


def test_off_the_server_loads_no_instrumentation_exporter_or_tracer():
    # (redis-py 8 imports opentelemetry.sdk's metrics by itself when it is installed: not ours to skip.)
    probe = ("import sys, django; from undolog_site.asgi import application; from lifecycle import api; "
             "from undolog_site.celery import app; from core import tracing; "
             "print(tracing._tracer, sorted(m for m in sys.modules if m.startswith(('opentelemetry.instrumentation', "
             "'opentelemetry.exporter', 'opentelemetry.sdk.trace'))))")
    env = {k: v for k, v in child_env().items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", probe], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                         check=True).stdout

    assert out.strip() == "None []"


@pytest.mark.django_db(transaction=True)
def test_one_trace_runs_from_an_sdk_call_through_the_worker_and_its_webhook(acme):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = provider.get_tracer("the-agent")
    with Collector() as collector, Receiver(secrets=[acme.org.webhook_secret]) as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
        with celery_worker(**env), asgi_server(**env) as base:
            client = UndoLogClient(base, acme.key)
            client.register_compensation("undo_send_email", "1.0.0", "webhook", receiver.url)
            client.register(agent_tools.send_email)
            with agent.start_as_current_span("agent run") as root, pytest.raises(RuntimeError):  # noqa: SIM117
                with client.session():
                    agent_tools.send_email("a@x.io")
                    raise RuntimeError("the agent fell over")  # the run fails: its undo stack is walked
            trace_id = format(root.get_span_context().trace_id, "032x")
            (delivery,) = eventually(lambda: receiver.log, timeout=60)
            # The worker exports in batches from a thread: on a loaded machine that can take a while.
            worker_post = eventually(lambda: [s for s in collector.of_trace(trace_id)
                                              if s.service == "undolog-worker" and s.name == "POST"], timeout=60)
            eventually(lambda: any("walk_undo_stack" in s.name for s in collector.of_trace(trace_id)
                                   if s.service == "undolog-worker"), timeout=60)
            client.close()

    assert delivery.verified
    # The compensation webhook continues the trace: its traceparent names the worker's POST span.
    version, traced_id, parent_id, _ = delivery.headers["traceparent"].split("-")
    assert (version, traced_id) == ("00", trace_id)
    assert parent_id == worker_post[0].span_id
    spans = collector.of_trace(trace_id)
    web = {s.name for s in spans if s.service == "undolog-web"}
    worker = {s.name for s in spans if s.service == "undolog-worker"}
    assert "execute_tool send_email" in web
    assert any("walk_undo_stack" in name for name in worker)
    (decision,) = [s for s in spans if s.name == "execute_tool send_email"]
    assert (decision.attributes["undolog.decision"], decision.attributes["gen_ai.tool.name"]) == \
        ("execute", "send_email")
    # Every span of the trace hangs off the agent's root span, through the SDK's traceparent.
    ids = {s.span_id for s in spans} | {format(root.get_span_context().span_id, "016x")}
    assert all(s.parent_id in ids for s in spans)
