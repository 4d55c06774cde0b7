"""Each answer of the contract's table becomes its exception; refusals become model text."""

from __future__ import annotations

import httpx
import pytest

from undolog import (
    AgentSuspended,
    ApprovalRejected,
    AuthenticationError,
    BudgetExceededError,
    CompensationDescriptor,
    IdempotencyKeyReused,
    InvalidRequest,
    SessionAwaitingApproval,
    SessionNotRunning,
    ToolNotRegistered,
    UndoLogClient,
    UndoLogError,
    refusal_as_tool_result,
    undolog_tool,
)
from undolog.errors import error_from_response
from undolog.testing import ScriptedAgent

from fakeserver import FakeServer

BUDGET_MESSAGE = ("Budget limit max_irreversible_per_run reached (limit 2); tool call "
                  "'delete_account' was not executed. "
                  "Stop calling tools and give your final answer.")
BUDGET = {"decision": "refused", "kind": "budget", "limit": "max_irreversible_per_run",
          "message": BUDGET_MESSAGE}


@undolog_tool(tier="compensable", compensation=CompensationDescriptor.new("undo_delete"))
def delete_account(account_id: str) -> str:
    return f"deleted {account_id}"


@pytest.mark.parametrize(("status", "body", "cls", "code"), [
    (429, BUDGET, BudgetExceededError, "budget"),
    (423, {"error": "agent_suspended", "reason": "budget", "message": "suspended"},
     AgentSuspended, "agent_suspended"),
    (404, {"error": "tool_not_registered", "message": "no such tool"}, ToolNotRegistered,
     "tool_not_registered"),
    (409, {"error": "session_not_running", "state": "completed", "message": "done"},
     SessionNotRunning, "session_not_running"),
    (409, {"error": "session_awaiting_approval", "approval": {"id": "a1"}, "message": "wait"},
     SessionAwaitingApproval, "session_awaiting_approval"),
    (409, {"error": "idempotency_key_reused", "message": "other args"}, IdempotencyKeyReused,
     "idempotency_key_reused"),
    (400, {"error": "invalid", "fields": {"args": "too big"}, "message": "bad"}, InvalidRequest,
     "invalid"),
    (401, {"error": "not_authenticated", "message": "bad key"}, AuthenticationError,
     "not_authenticated"),
    (409, {"error": "session_state_conflict", "state": "completed"}, SessionNotRunning,
     "session_state_conflict"),
    (409, {"error": "already_decided", "message": "too late"}, UndoLogError, "already_decided"),
    (429, {"decision": "refused", "kind": "approval", "reason": "no"}, ApprovalRejected,
     "rejected"),
])
def test_each_error_answer_maps_to_its_exception(status: int, body: dict, cls: type,
                                                  code: str) -> None:
    exc = error_from_response(status, body)
    assert type(exc) is cls
    assert (exc.code, exc.status) == (code, status)


def test_an_error_that_is_not_json_keeps_its_status_and_text() -> None:
    exc = error_from_response(502, None, "<html>Bad gateway</html>")
    assert (type(exc), exc.code, exc.status) == (UndoLogError, "http_502", 502)
    assert "Bad gateway" in exc.message


def test_exceptions_carry_the_servers_details() -> None:
    budget = error_from_response(429, BUDGET)
    assert str(budget) == BUDGET_MESSAGE and budget.limit == "max_irreversible_per_run"
    suspended = error_from_response(423, {"error": "agent_suspended", "reason": "budget"})
    invalid = error_from_response(400, {"error": "invalid", "fields": {"tool": "x"}})
    over = error_from_response(409, {"error": "session_not_running", "state": "halted"})
    assert (suspended.reason, invalid.fields, over.state) == ("budget", {"tool": "x"}, "halted")


def test_refusals_read_as_the_guide_tells_the_model() -> None:
    assert refusal_as_tool_result(error_from_response(429, BUDGET)) == BUDGET_MESSAGE
    assert refusal_as_tool_result(ApprovalRejected(reason="open invoice")) == "DENIED: open invoice"
    rule = error_from_response(403, {"decision": "refused", "kind": "rule", "rule": "keep-vips",
                                     "message": "DENIED by rule 'keep-vips': VIPs stay."})
    assert refusal_as_tool_result(rule) == "DENIED by rule 'keep-vips': VIPs stay."
    suspended = refusal_as_tool_result(error_from_response(423, {"error": "agent_suspended",
                                                                 "reason": "budget"}))
    assert suspended.endswith("Stop calling tools and give your final answer.")


def test_a_budget_refusal_in_a_session_raises_and_names_the_limit(client: UndoLogClient,
                                                                  server: FakeServer) -> None:
    client.register(delete_account)
    server.refuse = lambda body: (429, BUDGET)
    with client.session(agent="cleanup"), pytest.raises(BudgetExceededError) as caught:
        delete_account("acct-103")
    assert caught.value.limit == "max_irreversible_per_run"


def test_an_unregistered_tool_is_reported(client: UndoLogClient) -> None:
    with client.session(agent="cleanup"), pytest.raises(ToolNotRegistered):
        delete_account("acct-101")


def test_the_scripted_agent_turns_the_third_deletion_into_the_budget_message(
        client: UndoLogClient, server: FakeServer) -> None:
    client.register(delete_account)
    script = [[(delete_account, {"account_id": a}) for a in ("acct-101", "acct-102")]
              + [("delete_account", {"account_id": "acct-103"}, "the third one too")],
              "Deleted what the budget allowed."]

    # The cap of 2, as the server enforces it.
    server.refuse = lambda body: (429, BUDGET) if body["args"]["account_id"] == "acct-103" else None
    with client.session(agent="cleanup"):
        transcript = ScriptedAgent(script, tools=[delete_account]).run_sync()
    assert [c.result for c in transcript.calls] == ["deleted acct-101", "deleted acct-102",
                                                    BUDGET_MESSAGE]
    assert [c.refused for c in transcript.calls] == [False, False, True]
    assert transcript.answer == "Deleted what the budget allowed."
    assert server.bodies("/intercept")[-1]["reasoning"] == "the third one too"


def test_a_client_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="UNDOLOG_API_KEY"):
        UndoLogClient("http://undolog.test")
    monkeypatch.setenv("UNDOLOG_API_KEY", "k")
    monkeypatch.setenv("UNDOLOG_URL", "http://from-env:9000/")
    assert UndoLogClient().base_url == "http://from-env:9000"


def test_an_unreachable_server_is_a_connection_error() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = UndoLogClient("http://undolog.test", "k", transport=httpx.MockTransport(down))
    with pytest.raises(UndoLogError) as caught:
        client.register(delete_account)
    assert caught.value.code == "connection_error"
