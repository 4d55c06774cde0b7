"""A tool registered with an executor webhook is run by the worker once approved: the SDK
never runs (nor claims) it, waits, and returns the result the worker committed."""

from __future__ import annotations

import pytest
from undolog import EffectFailed, ToolTier, undolog_tool

from approvals import webhooks
from effects.models import Effect, EffectTransition
from tests.approvals.receiver import Receiver
from tests.sdk.conftest import CountingTransport, agent_client, reviewer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def bank():
    receiver = Receiver(answer={"transfer": "tr_1", "status": "sent"})
    yield receiver
    receiver.close()


def wire_money_tool(url: str, ran: list):
    @undolog_tool(tier=ToolTier.IRREVERSIBLE, reason="Moves money out of the company",
                  risk_tags=["money"], estimated_impact="{amount} EUR to {to}",
                  executor={"url": url, "timeout_ms": 2000})
    def wire_money(amount: int, to: str) -> dict:
        ran.append((amount, to))  # must never happen: the worker runs it
        return {"transfer": "from the agent"}

    return wire_money


def test_the_sdk_returns_what_the_workers_executor_committed(acme, server, worker, bank):
    ran: list = []
    wire_money = wire_money_tool(bank.url("/execute"), ran)
    wire = CountingTransport()
    client = agent_client(acme, server, transport=wire)
    client.register(wire_money)
    person = reviewer(acme, server, ("approve", "invoice 2024-113"), delay=0.3)

    with client.session(agent="cleanup") as s:
        assert wire_money(100, "acct-9") == {"transfer": "tr_1", "status": "sent"}
    person.finish()

    assert ran == []
    [request] = bank.requests
    assert request.json()["args"] == {"amount": 100, "to": "acct-9"}
    assert webhooks.verify([acme.org.webhook_secret], request.headers["Undolog-Signature"], request.body)
    effect = Effect.objects.get(session_id=s.id)
    assert request.headers["Idempotency-Key"] == str(effect.id)
    assert [(t.to_state, t.actor) for t in EffectTransition.objects.filter(effect=effect)] == [
        ("approved", "acme-reviewer"), ("executing", "executor"), ("committed", "executor")]
    assert not [p for _, p in wire.requests if p.endswith(("/start", "/commit"))]


def test_a_failed_execution_raises_effect_failed(acme, server, worker):
    refusing = Receiver(statuses=[422])
    ran: list = []
    wire_money = wire_money_tool(refusing.url("/execute"), ran)
    client = agent_client(acme, server)
    client.register(wire_money)
    person = reviewer(acme, server, ("approve", ""))

    with client.session(agent="cleanup"), pytest.raises(EffectFailed, match="failed and is never run again"):
        wire_money(5, "acct-9")
    person.finish()
    refusing.close()
    assert ran == []
