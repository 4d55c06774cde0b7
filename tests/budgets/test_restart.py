"""Point 3: counters are rows, so they survive every restart. The guide's daily_cap story with
a new server process for the second run: a crash loop cannot reset the day's budget."""

from __future__ import annotations

import httpx
import pytest
from rest_framework.authtoken.models import Token

from budgets.models import Refusal
from tests.budgets.conftest import register_budget_tools, set_budget
from tests.budgets.test_daily_cap import COMPENSABLE_DELETE
from tests.conftest import make_persona
from tests.processes import asgi_server


def run(base: str, key: str) -> list[int]:
    """One read and three deletes through the real server; the HTTP statuses."""
    agent = {"Authorization": f"Bearer {key}"}
    session = httpx.post(f"{base}/api/v1/sessions", json={"agent": "cleanup"}, headers=agent).json()["id"]
    statuses = []
    for n in (1, 2, 3):
        body = {"tool": "delete_account", "args": {"account_id": f"acct-10{n}"}, "step_index": n + 1}
        if n == 1:
            body["safe_calls"] = [{"tool": "list_inactive_accounts", "step_index": 1}]
        response = httpx.post(f"{base}/api/v1/sessions/{session}/intercept", json=body, headers=agent)
        statuses.append(response.status_code)
    assert httpx.post(f"{base}/api/v1/sessions/{session}/complete", headers=agent).status_code == 200
    return statuses


@pytest.mark.django_db(transaction=True)
def test_the_days_counters_survive_a_server_restart():
    acme = make_persona("acme-restart")
    register_budget_tools(acme, COMPENSABLE_DELETE)
    set_budget(acme, max_irreversible_per_run=2, max_cost_per_day=16)
    reviewer = {"Authorization": f"Token {Token.objects.get(user=acme.reviewer.user).key}"}

    with asgi_server() as base:
        assert run(base, acme.key) == [201, 201, 429]

    with asgi_server() as base:  # a new process: nothing carried over in memory
        assert httpx.post(f"{base}/api/v1/agents/cleanup/resume", headers=reviewer).status_code == 200
        assert run(base, acme.key) == [201, 429, 429]
        left = httpx.get(f"{base}/api/v1/agents/cleanup/budget", headers=reviewer).json()["remaining"]

    assert {k: v for k, v in left.items() if v is not None} == {"irreversible_run": 1, "cost_day": 0.98}
    assert list(Refusal.objects.order_by("created").values_list("limit", flat=True)) == [
        "max_irreversible_per_run", "max_cost_per_day", "max_cost_per_day"]
