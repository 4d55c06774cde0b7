"""Each page's SQL, pinned, with enough rows that a query per row would show: no N+1."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from effects.models import Session
from orgs.models import Agent
from tests.conftest import intercept
from tests.dashboard.conftest import hold, page_client

# Every page: the session, the user, the membership, the nav badge's count, the incident banner.
FRAME = 5


def count(client, url: str) -> tuple[int, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    statements = [q["sql"] for q in queries.captured_queries
                  if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]
    return len(statements), statements


@pytest.fixture
def busy(acme, tools):
    """Three held runs (each with a committed compensable call and an undo entry) and 60 more sessions
    over three agents."""
    held = [hold(acme, {"account_id": f"acct-{n}"}) for n in range(3)]
    for name in ("a", "b"):
        agent = Agent.objects.create(org=acme.org, name=f"agent-{name}")
        Session.objects.bulk_create(Session(org=acme.org, agent=agent, irreversible_calls=n % 3) for n in range(30))
    return held


def test_the_queue_takes_a_fixed_number_of_queries(acme, busy):
    client = page_client(acme)
    few, _ = count(client, "/")
    for n in range(5):
        hold(acme, {"account_id": f"more-{n}"})

    many, statements = count(client, "/")

    assert many == few, statements
    # the pending rows; approvals' 7-day stats: pending and overdue counts (which the nav badge
    # reuses, so the frame counts only the compensation failures), the 7 days' decisions; the
    # agents and the irreversible tools (with their risk tags) for the filters
    assert many == FRAME - 1 + 1 + 1 + 2 + 2, statements


def test_the_decided_tab_filtered_and_paged_takes_a_fixed_number_of_queries(acme, busy):
    for held in busy:
        acme.reviewer.post(f"/api/v1/approvals/{held['approval']['id']}/approve", {}, format="json")
    client = page_client(acme)
    url = "/?tab=decided&agent=cleanup&tool=delete_account&tag=data-loss&age=5m"

    n, statements = count(client, url)

    assert n == FRAME - 1 + 1 + 2 + 2 + 1, statements  # as the queue, with the decided page for the rows


def test_an_approval_takes_a_fixed_number_of_queries(acme, busy):
    n, statements = count(page_client(acme), f"/approvals/{busy[0]['approval']['id']}/")

    assert n == FRAME + 3, statements  # the request (with session, agent, effect), its tools' labels, its history


def test_a_decided_approval_adds_one_query_for_the_next_pending(acme, busy):
    acme.reviewer.post(f"/api/v1/approvals/{busy[0]['approval']['id']}/approve", {}, format="json")

    n, statements = count(page_client(acme), f"/approvals/{busy[0]['approval']['id']}/")

    assert n == FRAME + 4, statements


def test_the_sessions_list_takes_a_fixed_number_of_queries(acme, busy):
    n, statements = count(page_client(acme), "/sessions/?since=24h")

    assert n == FRAME + 2, statements  # the agents (for the filter), one page of sessions


def test_a_session_takes_a_fixed_number_of_queries(acme, busy):
    session = busy[0]["session"]
    client = page_client(acme)
    few, _ = count(client, f"/sessions/{session}/")
    for step in range(10, 20):  # more calls, undo entries and transitions
        intercept(acme, session, "send_email", {"to": f"u{step}@x.io"}, step)

    many, statements = count(client, f"/sessions/{session}/")

    assert many == few, statements
    # the session, effects, their transitions, approvals, SAFE calls, refusals, undo entries,
    # their attempts, the state history, the budget limits, the tools' labels, its rewinds, its savepoints
    assert many == FRAME + 13, statements


def test_the_live_part_of_a_session_skips_the_frame(acme, busy):
    n, statements = count(page_client(acme), f"/sessions/{busy[0]['session']}/?part=live")

    assert n == 3 + 13, statements  # session, user, membership; then the session's own reads


def test_the_agents_page_takes_a_fixed_number_of_queries(acme, busy):
    client = page_client(acme)
    few, _ = count(client, "/agents/")
    for name in ("c", "d", "e"):
        Agent.objects.create(org=acme.org, name=f"agent-{name}")

    many, statements = count(client, "/agents/")

    assert many == few, statements
    # the agents, their runs per day, the budget policies, today's counters, the healthy runs, the
    # runs being walked back; and today's usage from the effect log (the tools' weights, the day's
    # effects, its SAFE calls)
    assert many == FRAME + 6 + 3, statements


def test_the_agents_page_reads_the_cap_to_restore_once_for_all_switched_off_agents(acme, busy):
    from budgets.models import BudgetPolicy, PolicyChange

    client = page_client(acme)
    for agent in Agent.objects.for_org(acme.org):
        BudgetPolicy.objects.create(org=acme.org, agent=agent, max_irreversible_per_run=0)
        PolicyChange.objects.create(org=acme.org, agent=agent, actor="t", changes={"max_irreversible_per_run": [2, 0]})

    n, statements = count(client, "/agents/")

    assert n == FRAME + 9 + 1, statements  # the budget history of the switched agents, one query


def test_the_failures_page_takes_a_fixed_number_of_queries(acme, busy):
    from effects.models import UndoEntry

    UndoEntry.objects.filter(session__org=acme.org).update(state=UndoEntry.State.COMPENSATION_FAILED)
    n, statements = count(page_client(acme), "/compensation-failures/")

    assert n == FRAME + 2, statements  # the entries (with session, agent, effect), their attempts


def test_the_settings_page_takes_a_fixed_number_of_queries(acme, busy):
    n, statements = count(page_client(acme, "admin"), "/settings/")

    assert n <= FRAME + 2, statements  # the webhooks, the Slack connection


def test_the_agents_page_reads_every_agents_keys_in_one_query_for_admins(acme, busy):
    from orgs.models import AgentKey

    client = page_client(acme, "admin")
    few, _ = count(client, "/agents/")
    for agent in Agent.objects.for_org(acme.org):
        AgentKey.issue(agent)
        AgentKey.issue(agent)

    many, statements = count(client, "/agents/")

    assert many == few == FRAME + 9 + 1, statements  # the keys of all agents, one query
