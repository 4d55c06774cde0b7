"""Edit before approving through the gateway: the upstream tool runs with the reviewer's edit."""

from __future__ import annotations

import threading

import anyio
import pytest

from tests.gateway.test_gateway import run, text

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_upstream_runs_the_args_the_reviewer_edited(harness, acme):
    gateway = harness()

    def edit_and_approve() -> None:
        request = gateway.person.next_pending(set())
        answer = gateway.person.http.post(f"/api/v1/approvals/{request['id']}/approve",
                                          json={"args": {"number": 2}, "args_digest": request["args_digest"]})
        assert answer.status_code == 200, answer.text

    async def scenario():
        async with gateway.client() as client:
            await client.call_tool("create_issue", {"title": "keep me"})
            await client.call_tool("create_issue", {"title": "the one to delete"})
            decider = threading.Thread(target=edit_and_approve, daemon=True)
            decider.start()
            result = await client.call_tool("delete_issue", {"number": 1})
            await anyio.to_thread.run_sync(decider.join, 10)
            assert not result.is_error, text(result)
            return result

    result = run(scenario)

    assert result.structured_content == {"number": 2, "state": "deleted"}
    assert gateway.tracker.calls("delete_issue") == [["delete_issue", {"number": 2}]]
    assert list(gateway.tracker.read()["issues"]) == ["1"]
