"""The intercept's fast path caches keys, tools and budget limits in each server process
(lifecycle/intercept/one_statement.py). Against a real gunicorn with two workers, both warmed, no cache lets a
revoked key, a suspended agent, a lowered cap, the incident switch or a re-tiered tool through,
not even once; and fifty concurrent duplicates still make one effect."""

from __future__ import annotations

import itertools
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
from django.db import connection

from effects.models import Effect, Session, UndoEntry
from orgs.models import Agent, AgentKey
from tests.budgets.conftest import register_budget_tools, set_budget
from tests.conftest import make_persona
from tests.processes import wsgi_server

pytestmark = pytest.mark.django_db(transaction=True)
FAST = connection.vendor == "postgresql"
PAIRS = 10


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    with wsgi_server(workers=2) as base:
        yield base


class HttpAgent:
    """An agent calling the server over HTTP, each request on a fresh connection."""

    def __init__(self, base: str, key: str) -> None:
        self.base, self.headers = base, {"Authorization": f"Bearer {key}"}
        self.steps = itertools.count(1)
        self.session = self.post("/api/v1/sessions", {"agent": "cleanup"}).json()["id"]

    def post(self, path: str, body: dict) -> httpx.Response:
        return httpx.post(self.base + path, json=body, headers=self.headers, timeout=30)

    def call(self, tool: str = "send_email") -> httpx.Response:
        step = next(self.steps)
        args = {"table": f"t{step}"} if tool == "drop_table" else {"to": f"u{step}@x.io"}
        return self.post(f"/api/v1/sessions/{self.session}/intercept",
                         {"tool": tool, "args": args, "step_index": step})

    def in_pairs(self, tool: str = "send_email", pairs: int = PAIRS) -> list[httpx.Response]:
        """Two calls at once, `pairs` times: a sync worker serves one request at a time, so each
        pair reaches both workers."""
        with ThreadPoolExecutor(2) as pool:
            return [r for _ in range(pairs) for r in pool.map(lambda _: self.call(tool), range(2))]


def warmed(server: str, slug: str) -> tuple:
    """Both workers' caches hold the key, the tools and the limits: from its second call on, each
    worker answers from them (PostgreSQL; SQLite has no fast path). Which worker takes which call
    is the kernel's choice (a quick worker may take both calls of a pair), so the calls go on in
    pairs until four pairs in a row were all answered from the caches."""
    persona = make_persona(slug)
    register_budget_tools(persona)
    agent = HttpAgent(server, persona.key)
    answers = agent.in_pairs("drop_table", pairs=2) + agent.in_pairs("send_email", pairs=2)
    streak = 0
    while FAST and streak < 4 and len(answers) < 60:
        pair = agent.in_pairs("send_email", pairs=1)
        answers += pair
        streak = streak + 1 if {r.headers.get("X-Undolog-Path") for r in pair} == {"fast"} else 0
    assert {r.status_code for r in answers} == {201}
    assert streak == 4 if FAST else {r.headers.get("X-Undolog-Path") for r in answers} == {None}
    return persona, agent


def test_a_revoked_key_is_refused_by_every_worker_from_its_next_call(server):
    persona, agent = warmed(server, "fp-revoke")

    AgentKey.objects.get(agent=persona.agent).revoke()

    assert Counter(r.status_code for r in agent.in_pairs()) == {401: 2 * PAIRS}


def test_a_rotated_key_past_its_grace_is_refused_by_every_worker_while_its_successor_works(server):
    persona, agent = warmed(server, "fp-rotate")

    _, successor = AgentKey.objects.get(agent=persona.agent).rotate(grace=timedelta(0))

    assert Counter(r.status_code for r in agent.in_pairs()) == {401: 2 * PAIRS}
    agent.headers = {"Authorization": f"Bearer {successor}"}
    assert Counter(r.status_code for r in agent.in_pairs(pairs=2)) == {201: 4}


def test_a_suspended_agent_is_refused_by_every_worker_from_its_next_call(server):
    persona, agent = warmed(server, "fp-suspend")

    Agent.objects.get(pk=persona.agent.pk).suspend(Agent.SuspendReason.MANUAL)

    answers = agent.in_pairs()
    assert Counter(r.status_code for r in answers) == {423: 2 * PAIRS}
    assert {r.json()["error"] for r in answers} == {"agent_suspended"}


def test_a_lowered_cap_holds_in_every_worker_from_the_next_call(server):
    persona, agent = warmed(server, "fp-cap")
    used = Session.objects.get(pk=agent.session).tool_calls

    set_budget(persona, max_tool_calls_per_run=used + 3)

    assert Counter(r.status_code for r in agent.in_pairs()) == {201: 3, 429: 2 * PAIRS - 3}
    assert Effect.objects.filter(session_id=agent.session).count() == used + 3


def test_the_incident_switch_holds_in_every_worker_from_the_next_call(server):
    persona, agent = warmed(server, "fp-incident")

    assert persona.admin.post("/api/v1/org/incident", {"on": True}, format="json").status_code == 200

    refused = agent.in_pairs("drop_table")
    assert Counter(r.status_code for r in refused) == {429: 2 * PAIRS}
    assert {r.json()["incident"] for r in refused} == {True}
    assert Counter(r.status_code for r in agent.in_pairs("send_email", pairs=2)) == {201: 4}  # reversible goes on


def test_a_tool_re_registered_as_irreversible_waits_for_a_reviewer_in_every_worker(server):
    persona, agent = warmed(server, "fp-retier")

    response = persona.admin.post("/api/v1/tools", {"tools": [
        {"name": "send_email", "tier": "irreversible", "approval": {"reason": "Mail leaves the building"}}]},
        format="json")
    assert response.status_code == 200, response.content

    with ThreadPoolExecutor(2) as pool:
        sessions = [HttpAgent(server, persona.key) for _ in range(2 * PAIRS)]
        answers = list(pool.map(lambda a: a.call("send_email"), sessions))
    assert Counter(r.status_code for r in answers) == {202: 2 * PAIRS}
    assert {r.json()["decision"] for r in answers} == {"await_approval"}


def test_fifty_concurrent_duplicates_through_the_server_make_one_effect(server):
    persona, agent = warmed(server, "fp-duplicates")
    body = {"tool": "send_email", "args": {"to": "once@x.io"}, "step_index": 999,
            "safe_calls": [{"tool": "list_inactive_accounts", "step_index": 998}]}

    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(lambda _: agent.post(f"/api/v1/sessions/{agent.session}/intercept", body),
                                range(50)))

    assert Counter(r.status_code for r in answers) == {201: 1, 200: 49}
    assert {r.json()["effect"]["id"] for r in answers} == {
        str(Effect.objects.get(session_id=agent.session, args={"to": "once@x.io"}).id)}
    assert UndoEntry.objects.filter(effect__args={"to": "once@x.io"}).count() == 1
    session = Session.objects.get(pk=agent.session)
    assert session.tool_counts["list_inactive_accounts"] == 1  # the SAFE call is charged once
