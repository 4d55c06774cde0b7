"""Thirty irreversible calls of one run at once, as a model issues parallel tool calls, through the
fast approval path (lifecycle/intercept/two_statements.py) with a cap of one irreversible call per run: held
for people, decided by an approve rule, or decided by a grant. Exactly one is admitted: one effect,
one request, the run's counter at 1; every other call is refused (429 over the cap, or 409 once
the held call has paused the run), and none of them wrote anything.

A real irreversible tool (not a compensable one flagged irreversible, which takes the other path),
real concurrent clients, each with its own PostgreSQL connection (issue 36, item 4: with the fast
path's row guard dropped, 2-7 effects were admitted and the counter still read 1)."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from approvals.models import ApprovalRequest
from effects.models import Effect, Session
from tests.approvals.conftest import irreversible, register
from tests.budgets.conftest import set_budget
from tests.conftest import agent_client, in_parallel, intercept, make_persona, open_session, register_standard_tools

CALLS = 30


def _persona(slug: str, how: str):
    persona = make_persona(slug)
    register_standard_tools(persona)
    register(persona, irreversible("refund"))
    set_budget(persona, max_irreversible_per_run=1)
    if how == "rule":
        response = persona.admin.post("/api/v1/rules", {"outcome": "approve", "name": "small",
                                                         "condition": "args.amount <= 50"}, format="json")
        assert response.status_code == 201, response.content
    if how == "grant":
        response = persona.reviewer.post("/api/v1/grants", {"agent": "cleanup", "tool": "refund",
                                                              "minutes": 60}, format="json")
        assert response.status_code == 201, response.content
    # Warm: this process's key, config and rules cached (the config's version moved with the rule
    # or the grant), as for every call but a process's first.
    assert intercept(persona, open_session(persona), "refund", {"amount": 10, "order": "warm"}, 1).status_code \
        in (201, 202)
    return persona


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how, admitted", [("held", 202), ("rule", 202), ("grant", 201)])
def test_thirty_concurrent_irreversible_calls_of_one_run_with_a_cap_of_one_make_one_effect(how, admitted):
    persona = _persona(f"acme-race-{how}", how)
    session = open_session(persona)
    warm = [open_session(persona) for _ in range(CALLS)]
    ready = threading.Barrier(CALLS)

    def call(n: int):
        # Each thread's connection warmed first (opened, the fast path's statements prepared on it),
        # so that the thirty calls reach the read and the write together.
        client = agent_client(persona.key)
        client.post(f"/api/v1/sessions/{warm[n]}/intercept", {
            "tool": "refund", "args": {"amount": 10, "order": "warm"}, "step_index": 1}, format="json")
        ready.wait(timeout=30)
        response = client.post(f"/api/v1/sessions/{session}/intercept", {
            "tool": "refund", "args": {"amount": 10, "order": f"o-{n}"}, "step_index": n + 1}, format="json")
        body = response.json()
        return response.status_code, response.get("X-Undolog-Path"), body.get("decision") or body.get("error")

    results = in_parallel(call, CALLS)

    statuses = Counter(status for status, _, _ in results)
    assert statuses[admitted] == 1, results
    assert set(statuses) <= {admitted, 429, 409}, results  # 409: the held call paused the run first
    assert [path for status, path, _ in results if status == admitted] == ["fast"], results
    effects = Effect.objects.filter(session_id=session)
    assert effects.count() == 1, [(e.step_index, e.state) for e in effects]
    row = Session.objects.get(pk=session)
    assert row.irreversible_calls == 1
    assert ApprovalRequest.objects.filter(session_id=session).count() == 1
    expected = {"held": ("awaiting_approval", "pending"), "rule": ("running", "approved"),
                "grant": ("running", "approved")}[how]
    assert (row.state, effects.get().state) == expected
