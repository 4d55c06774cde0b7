"""The outbox: a web process killed (SIGKILL) right after committing a change that records an
event loses nothing. The event row is the outbox; the worker's sweep fans it out, and the org's
webhook receives it exactly once."""

from __future__ import annotations

import time

import httpx
import pytest
from django.db import connection

from deliveries.models import Delivery
from orgs.models import Event
from tests.conftest import eventually, make_persona, register_standard_tools
from tests.processes import asgi_server, celery_worker
from tests.receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_event_whose_web_process_died_after_commit_reaches_the_webhook_once():
    from undolog_site.celery import app

    app.control.purge()  # messages a previous run left in the test broker
    acme = make_persona("acme-outbox")
    register_standard_tools(acme)
    with Receiver() as receiver:
        hook = acme.admin.post("/api/v1/webhooks", {"url": receiver.url, "event_types": ["approval.requested"]},
                               format="json").json()
        receiver.secrets = [hook["secret"]]

        # 1. A web process that dies the moment the intercept's transaction has committed.
        with asgi_server(UNDOLOG_TEST_FAULT="event.committed:approval.requested") as base:
            agent = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {acme.key}"}, timeout=10)
            session = agent.post("/api/v1/sessions", json={"agent": "cleanup"}).json()["id"]
            call = {"tool": "delete_account", "args": {"account_id": "acct-7"}, "step_index": 1}
            try:
                # PostgreSQL's fast approval path fans a held request out after its answer, at once: the
                # process may get the answer out before it dies.
                answer = agent.post(f"/api/v1/sessions/{session}/intercept", json=call)
                assert connection.vendor == "postgresql" and answer.status_code == 202, answer.text
            except httpx.TransportError:
                pass  # died before its answer (the pipeline's fan-out is in the request)
            eventually(lambda: not _alive(base), timeout=10)

        # 2. The change committed, its event with it; nothing was fanned out.
        event = Event.objects.get(org=acme.org, kind="approval.requested")
        assert event.fanned_out_at is None
        assert not Delivery.objects.filter(event=event).exists()
        assert receiver.log == []

        # 3. A worker with beat: the outbox sweep fans the event out, the delivery goes out once.
        with celery_worker(beat=True):
            receiver.wait_for(lambda r: len(r.applied) == 1, timeout=30)
            time.sleep(6)  # another sweep of events and of deliveries: nothing more may go out

    [delivery] = Delivery.objects.filter(event=event)
    assert (delivery.state, delivery.attempts, str(delivery.webhook_id)) == ("delivered", 1, hook["id"])
    [arrived] = receiver.log
    assert arrived.verified and arrived.key == str(delivery.pk)
    assert arrived.body["type"] == "approval.requested"
    assert arrived.body["payload"]["approval"]["proposed_args"] == {"account_id": "acct-7"}
    assert not receiver.duplicates
    event.refresh_from_db()
    assert event.fanned_out_at is not None


def _alive(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
