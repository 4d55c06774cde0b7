"""GET /api/v1/effects/{id}?wait=N: answers as soon as the effect changes, not at the timeout."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest
from django.db import IntegrityError

from effects.models import Effect
from tests.conftest import intercept, make_persona, open_session, register_standard_tools
from tests.processes import asgi_server


@pytest.mark.django_db(transaction=True)
def test_a_waiting_long_poll_wakes_within_a_second_of_the_change():
    persona = make_persona("acme")
    register_standard_tools(persona)
    session = open_session(persona)
    effect_id = intercept(persona, session, "delete_account", {"account_id": "a1"}, 1).json()["effect"]["id"]
    with asgi_server() as base:
        changed_at: list[float] = []

        def approve_later() -> None:
            time.sleep(1.5)
            Effect.objects.get(pk=effect_id).approve("reviewer:test")
            changed_at.append(time.monotonic())

        threading.Thread(target=approve_later).start()
        response = httpx.get(f"{base}/api/v1/effects/{effect_id}?wait=20",
                             headers={"Authorization": f"Bearer {persona.key}"}, timeout=30)
        answered_at = time.monotonic()

    assert response.status_code == 200
    assert response.json()["effect"]["state"] == "approved"
    assert answered_at - changed_at[0] < 1.0


def test_a_long_poll_returns_the_unchanged_effect_at_the_timeout(acme, session_id):
    effect_id = intercept(acme, session_id, "delete_account", {"account_id": "a1"}, 1).json()["effect"]["id"]

    started = time.monotonic()
    response = acme.api.get(f"/api/v1/effects/{effect_id}?wait=0.5")

    assert response.json()["effect"]["state"] == "pending"
    assert 0.5 <= time.monotonic() - started < 2


def test_a_committed_effect_answers_at_once(acme, session_id):
    effect_id = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1).json()["effect"]["id"]
    acme.api.post(f"/api/v1/effects/{effect_id}/commit", {"result": {"ok": 1}}, format="json")

    started = time.monotonic()
    response = acme.api.get(f"/api/v1/effects/{effect_id}?wait=30")

    assert response.json()["effect"]["result"] == {"ok": 1}
    assert time.monotonic() - started < 0.5


def test_the_database_refuses_a_second_effect_with_the_same_signature(acme, session_id):
    first = Effect.objects.get(pk=intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1)
                               .json()["effect"]["id"])
    first.id = uuid.uuid4()  # a new row, same session and signature

    with pytest.raises(IntegrityError, match="one_effect_per_signature|UNIQUE"):
        first.save(force_insert=True)
