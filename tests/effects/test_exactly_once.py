"""Exactly-once under real concurrency: 50 identical intercepts from 50 threads over HTTP."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from threading import Barrier

import httpx
import pytest

from effects.models import Effect, UndoEntry
from tests.conftest import make_persona, open_session, register_standard_tools
from tests.processes import asgi_server

N = 50


@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_identical_intercepts_make_one_effect():
    persona = make_persona("acme")
    register_standard_tools(persona)
    session = open_session(persona)
    with asgi_server() as base:
        answers = _fire_together(f"{base}/api/v1/sessions/{session}/intercept", persona.key)

    decisions = sorted(answer["decision"] for _, answer in answers)
    assert decisions == ["execute"] + ["replay"] * (N - 1), answers
    assert {status for status, _ in answers} == {200, 201}
    assert Effect.objects.count() == 1
    assert UndoEntry.objects.count() == 1
    assert {answer["effect"]["id"] for _, answer in answers} == {str(Effect.objects.get().id)}


def _fire_together(url: str, key: str) -> list[tuple[int, dict]]:
    body = {"tool": "send_email", "args": {"to": "a@x.io", "subject": "hi"}, "step_index": 1}
    start = Barrier(N)

    def fire(_: int) -> tuple[int, dict]:
        with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
            start.wait()
            response = client.post(url, json=body)
            return response.status_code, response.json()

    with ThreadPoolExecutor(N) as pool:
        return list(pool.map(fire, range(N)))
