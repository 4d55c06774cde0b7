"""Redis goes away (broker, channel layer, long-poll bus and rate-limit counters at once): the API
keeps working on the database alone, /healthz names Redis as degraded, and when Redis comes back
(empty: it kept nothing) the workers reconnect and the beat's sweeps catch up from the rows.

Against real processes: a Redis of the test's own (tests/services.py) that the test stops and
starts again, a two-process gunicorn, a Celery worker with beat, a real compensation receiver."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from django.test import Client
from rest_framework.authtoken.models import Token

from effects.models import Effect, Session, UndoEntry
from tests.conftest import STANDARD_TOOLS, eventually, make_persona
from tests.effects.conftest import register_undo
from tests.processes import asgi_server, celery_worker, wsgi_server
from tests.receiver import Receiver
from tests.services import own_redis
from tests.topology import Dashboard

pytestmark = pytest.mark.django_db(transaction=True)

BRISK = {"UNDOLOG_UNDO_SWEEP_S": "1", "UNDOLOG_UNDO_STALL_S": "2"}


def timed(call):
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


def test_intercepts_commits_and_decisions_work_without_redis_and_the_walk_catches_up_when_it_returns():
    acme = make_persona("acme")
    with Receiver(secrets=[acme.org.webhook_secret]) as receiver, own_redis() as redis_server:
        register_undo(acme, receiver.url)
        assert acme.api.post("/api/v1/tools", {"tools": [STANDARD_TOOLS[2]]}, format="json").status_code == 200
        reviewer_token = Token.objects.get(user=acme.reviewer.user).key
        browser = Client()
        browser.force_login(acme.reviewer.user)
        with wsgi_server(workers=2, REDIS_URL=redis_server.url, **BRISK) as base, \
                asgi_server(REDIS_URL=redis_server.url) as asgi, \
                celery_worker(beat=True, REDIS_URL=redis_server.url, **BRISK), \
                httpx.Client(base_url=base, headers={"Authorization": f"Bearer {acme.key}"}, timeout=30) as agent, \
                httpx.Client(base_url=base, headers={"Authorization": f"Token {reviewer_token}"},
                             timeout=30) as reviewer:
            dashboard = Dashboard(asgi, browser.cookies["sessionid"].value)
            dashboard.thread.start()
            assert dashboard.connected.wait(15)
            redis_server.stop()

            health = agent.get("/healthz")
            assert health.status_code == 200 and health.json()["degraded"] == ["redis"], health.json()

            # 1. Intercepts and commits answer, each in well under a second or two.
            session = agent.post("/api/v1/sessions", json={}).json()["id"]
            slowest = 0.0
            for step in range(1, 6):
                answer, took = timed(lambda s=step: agent.post(f"/api/v1/sessions/{session}/intercept", json={
                    "tool": "send_email", "args": {"to": f"{s}@x.io"}, "step_index": s}))
                assert answer.status_code == 201, answer.text
                committed, took_commit = timed(lambda a=answer: agent.post(
                    f"/api/v1/effects/{a.json()['effect']['id']}/commit", json={"result": {"n": 1}}))
                assert committed.status_code == 200, committed.text
                slowest = max(slowest, took, took_commit)
            assert slowest < 3, slowest

            # 2. An irreversible call waits; the long poll reads the database instead of the bus,
            #    and sees the reviewer's decision (made on the other process, maybe) within a second.
            held = agent.post(f"/api/v1/sessions/{session}/intercept", json={
                "tool": "delete_account", "args": {"account_id": "a-1"}, "step_index": 6}).json()
            assert held["decision"] == "await_approval", held
            polled: dict = {}

            def long_poll() -> None:
                polled["answer"] = agent.get(f"/api/v1/effects/{held['effect']['id']}", params={"wait": 20})
                polled["at"] = time.monotonic()

            poller = threading.Thread(target=long_poll)
            poller.start()
            time.sleep(0.5)
            decided = reviewer.post(f"/api/v1/approvals/{held['approval']['id']}/approve", json={})
            decided_at = time.monotonic()
            assert decided.status_code == 200, decided.text
            poller.join(timeout=25)
            assert polled["answer"].json()["effect"]["state"] == "approved"
            assert polled["at"] - decided_at < 2.0
            started = agent.post(f"/api/v1/effects/{held['effect']['id']}/start", json={})
            assert started.status_code == 200, started.text
            assert agent.post(f"/api/v1/effects/{held['effect']['id']}/commit", json={"result": {}}).status_code == 200

            # 3. The run fails: answered at once, its walk cannot be sent to a worker.
            failed, took = timed(lambda: agent.post(f"/api/v1/sessions/{session}/fail", json={"error": "boom"}))
            assert failed.status_code == 200 and took < 3, (failed.text, took)
            time.sleep(1.5)
            assert receiver.applied == {}
            assert Session.objects.get(pk=session).state in ("failed", "compensating")

            # 4. Redis comes back, empty: the worker reconnects and the beat's sweep finds the walk.
            redis_server.start()
            eventually(lambda: Session.objects.get(pk=session).state == "compensated", timeout=60, every=0.2)
            entries = set(UndoEntry.objects.filter(session_id=session).values_list("id", flat=True))
            assert {str(pk) for pk in entries} == set(receiver.applied) and len(entries) == 5
            assert sum(receiver.deliveries.values()) == 5  # each undo sent once
            assert Effect.objects.filter(session_id=session).count() == 6
            assert agent.get("/healthz").json()["status"] == "ok"

            # 5. Pushes resume: the open dashboard (reconnecting like live.js if its socket dropped)
            #    gets the next decision, made on a web node, through the ASGI node.
            eventually(dashboard.connected.is_set, timeout=20)
            later = agent.post("/api/v1/sessions", json={}).json()["id"]
            held = agent.post(f"/api/v1/sessions/{later}/intercept", json={
                "tool": "delete_account", "args": {"account_id": "a-2"}, "step_index": 1}).json()
            assert reviewer.post(f"/api/v1/approvals/{held['approval']['id']}/approve", json={}).status_code == 200
            eventually(lambda: held["approval"]["id"] in dashboard.decided, timeout=5)
            dashboard.stop.set()
