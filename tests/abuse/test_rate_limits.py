"""Per-key and per-org API rate limits (core/ratelimit.py): 429 `rate_limited` with `Retry-After`
and the limit in the body, counted in Redis (so every node and process shares the count),
configurable per org, and failing open when Redis is away."""

from __future__ import annotations

import pytest
from django.db import connection

from core import ratelimit
from effects.models import Effect
from tests.conftest import intercept, make_persona, open_session
from tests.processes import wsgi_server

FAST = connection.vendor == "postgresql"


def limit_org(persona, *, per_key=None, per_org=None) -> None:
    response = persona.admin.patch("/api/v1/org/settings", {"rate_limit_per_key": per_key,
                                                             "rate_limit_per_org": per_org}, format="json")
    assert response.status_code == 200, response.content


def test_it_refuses_the_call_past_the_keys_limit_with_429_rate_limited_and_writes_nothing(acme, tools):
    limit_org(acme, per_key=3)
    session = open_session(acme)  # the key's first request of the three

    answers = [intercept(acme, session, "send_email", {"to": f"{n}@x.io"}, n) for n in range(1, 5)]

    assert [a.status_code for a in answers] == [201, 201, 429, 429]
    refused = answers[2]
    body = refused.json()
    assert body["error"] == "rate_limited" and "decision" not in body  # not the budget's `refused`
    assert body["limit"] == {"scope": "key", "max_requests": 3, "window_s": 60}
    assert 1 <= int(refused["Retry-After"]) <= 20 and body["retry_after_s"] == int(refused["Retry-After"])
    assert Effect.objects.filter(session_id=session).count() == 2
    if FAST:  # refused before the one statement: no query at all
        assert refused.get("X-Undolog-Path") == "fast"


def test_a_commit_past_the_keys_limit_is_refused_429_and_leaves_the_effect_uncommitted(acme, tools):
    limit_org(acme, per_key=4)
    session = open_session(acme)  # 1
    first, second = (intercept(acme, session, "send_email", {"to": f"{n}@x.io"}, n).json()["effect"]["id"]
                     for n in (1, 2))  # 2, 3

    kept = acme.api.post(f"/api/v1/effects/{first}/commit", {"result": {"sent": True}}, format="json")  # 4
    refused = acme.api.post(f"/api/v1/effects/{second}/commit", {"result": {"sent": True}}, format="json")

    assert kept.status_code == 200, kept.content
    assert refused.status_code == 429 and refused.json()["error"] == "rate_limited"
    assert Effect.objects.get(pk=first).state == Effect.State.COMMITTED
    assert Effect.objects.get(pk=second).state == Effect.State.EXECUTING
    if FAST:  # refused by the commit's own fast path, before its statement
        assert refused.get("X-Undolog-Path") == "fast"


def test_a_keys_limit_does_not_touch_another_key_but_the_orgs_limit_holds_for_all(acme, tools):
    limit_org(acme, per_key=2, per_org=1000)
    other = make_persona("acme-two")  # another org: its own counters
    assert acme.api.get("/api/v1/tools").status_code == 200
    assert acme.api.get("/api/v1/tools").status_code == 200
    assert acme.api.get("/api/v1/tools").status_code == 429
    assert other.api.get("/api/v1/tools").status_code == 200
    # The admin (a person: their own key) still gets through; then the org's limit caps everyone.
    assert acme.admin.get("/api/v1/org/settings").status_code == 200
    limit_org(acme, per_key=1000, per_org=2)
    codes = [acme.viewer.get("/api/v1/tools").status_code for _ in range(3)]
    assert codes[-1] == 429, codes
    response = acme.reviewer.get("/api/v1/tools")
    assert response.status_code == 429 and response.json()["limit"]["scope"] == "org"


def test_the_org_settings_show_and_validate_the_limits(acme):
    assert acme.viewer.get("/api/v1/org/settings").json()["rate_limit_per_key"] is None
    assert acme.admin.patch("/api/v1/org/settings", {"rate_limit_per_key": 0}, format="json").status_code == 400
    assert acme.admin.patch("/api/v1/org/settings", {"rate_limit_per_org": "x"}, format="json").status_code == 400
    assert acme.reviewer.patch("/api/v1/org/settings", {"rate_limit_per_org": 5}, format="json").status_code == 403
    limit_org(acme, per_key=50, per_org=60)
    assert acme.viewer.get("/api/v1/org/settings").json()["rate_limit_per_org"] == 60


def test_a_limit_refuses_none_of_its_requests_when_redis_does_not_answer(acme, tools, settings):
    limit_org(acme, per_key=1)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    fresh = ratelimit._Redis()
    saved, ratelimit._redis = ratelimit._redis, fresh
    try:
        session = open_session(acme)
        codes = [intercept(acme, session, "send_email", {"to": f"{n}@x.io"}, n).status_code for n in range(1, 4)]
    finally:
        ratelimit._redis = saved
    assert codes == [201, 201, 201]
    assert fresh._down_until > 0  # asked once, then stopped asking for a while


@pytest.mark.django_db(transaction=True)
def test_the_limit_holds_across_the_processes_of_a_multi_process_server():
    """Four gunicorn processes, one count: a limit of 10 admits 10 of 30 calls, whichever process
    takes each one (the fast path on PostgreSQL, the pipeline on SQLite)."""
    import httpx

    acme = make_persona("acme")
    from tests.conftest import register_standard_tools

    register_standard_tools(acme)
    session = open_session(acme)
    acme.org.rate_limit_per_key = 10
    acme.org.save(update_fields=["rate_limit_per_key"])
    with wsgi_server(workers=4) as base, httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {acme.key}"}) as client:
        codes = [client.post(f"/api/v1/sessions/{session}/intercept",
                             json={"tool": "send_email", "args": {"to": f"{n}@x.io"}, "step_index": n}).status_code
                 for n in range(1, 31)]
    assert codes.count(201) == 10 and codes.count(429) == 20, codes
    assert Effect.objects.filter(session_id=session).count() == 10
