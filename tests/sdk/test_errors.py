"""Every error the server can answer an agent with reaches the SDK as its exception, with the
server's message: budget refusals (the guide's exact text), a suspended agent, an unknown
tool, a reused idempotency key, a run that is over or waiting for a person, a bad key, a bad
registration, and replays that cannot be served."""

from __future__ import annotations

import contextvars
import threading

import pytest
from undolog import (
    AgentSuspended,
    ApprovalWaitTimeout,
    AuthenticationError,
    BudgetExceededError,
    CompensationDescriptor,
    EffectFailed,
    EffectInFlight,
    IdempotencyKeyReused,
    InvalidRequest,
    SessionAwaitingApproval,
    SessionNotRunning,
    ToolNotRegistered,
    ToolTier,
    UndoLogClient,
    UndoLogConnectionError,
    refusal_as_tool_result,
    undolog_tool,
)
from undolog.testing import ScriptedAgent

from budgets.models import Refusal
from effects.models import Effect, Session
from tests.sdk.agent_tools import RAN, delete_account, send_email
from tests.sdk.conftest import Person, reviewer, token_of

pytestmark = pytest.mark.django_db(transaction=True)

GUIDE = ("Budget limit max_irreversible_per_run reached (limit 2); tool call 'delete_account' was not "
         "executed. Stop calling tools and give your final answer.")
DELETE_ALL = [("delete_account", {"account_id": a}) for a in ("acct-101", "acct-102", "acct-103")]


def test_it_raises_the_guides_budget_message_then_the_agent_is_suspended(acme, server, client):
    admin = Person(server, token_of(acme.admin))
    admin.patch_budget("cleanup", max_irreversible_per_run=2, on_exceeded="pause")
    person = reviewer(acme, server, ("approve", ""), ("approve", ""))

    with client.session(agent="cleanup") as s:
        transcript = ScriptedAgent([DELETE_ALL, "Deleted what the budget allowed."],
                                   tools=[delete_account]).run_sync()
    person.finish()

    assert [c.refused for c in transcript.calls] == [False, False, True]
    refused = transcript.calls[2].error
    assert isinstance(refused, BudgetExceededError)
    assert str(refused) == refused.message == GUIDE
    assert (refused.limit, refused.status, refused.code) == ("max_irreversible_per_run", 429, "budget")
    assert transcript.calls[2].result == refusal_as_tool_result(refused) == GUIDE
    assert RAN == ["delete_account acct-101", "delete_account acct-102"]
    assert len(person.asked) == 2  # the third never reached a reviewer
    refusal = Refusal.objects.get(session_id=s.id)
    assert (refusal.kind, refusal.tool_name, refusal.reason) == (
        "budget", "delete_account", "budget limit max_irreversible_per_run reached (3 > 2)")

    # The run ended with a violation: on_exceeded "pause" suspended the agent.
    with pytest.raises(AgentSuspended) as suspended:
        client.session(agent="cleanup").__enter__()
    assert (suspended.value.status, suspended.value.reason) == (423, "budget")
    assert suspended.value.message == "The agent cleanup is suspended; a reviewer must resume it."
    assert client.get_budget("cleanup")["state"] == "suspended"


def test_a_suspended_agents_calls_are_refused_mid_run(acme, server, client):
    with client.session(agent="cleanup"):
        response = Person(server, token_of(acme.reviewer)).http.post("/api/v1/agents/cleanup/suspend", json={})
        assert response.status_code == 200
        with pytest.raises(AgentSuspended) as suspended:
            send_email("ana@example.com")
    assert suspended.value.reason == "manual"
    assert refusal_as_tool_result(suspended.value).startswith("Agent suspended (manual)")
    assert RAN == []


def test_an_unregistered_tool_raises_tool_not_registered(acme, server, client):
    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=CompensationDescriptor.new("undo_send_email"))
    def send_sms(to: str) -> str:
        return to

    with client.session(agent="cleanup"), pytest.raises(ToolNotRegistered) as unknown:
        send_sms("+15550100")
    assert unknown.value.status == 404
    assert unknown.value.message == "No tool named 'send_sms' is registered in this organization."


def test_a_reused_idempotency_key_with_other_args_raises(acme, server, client):
    @undolog_tool(tier=ToolTier.COMPENSABLE, name="send_email", idempotency_key=lambda args: "welcome-mail",
                  compensation=CompensationDescriptor.new("undo_send_email", {"to": "{to}"}))
    def keyed_email(to: str) -> dict:
        return {"sent": to}

    with client.session(agent="cleanup"):
        assert keyed_email("ana@example.com") == {"sent": "ana@example.com"}
        assert keyed_email("ana@example.com") == {"sent": "ana@example.com"}  # a replay
        with pytest.raises(IdempotencyKeyReused) as reused:
            keyed_email("ben@example.com")
    assert (reused.value.status, reused.value.message) == (
        409, "This idempotency_key was already used for a different call.")


def test_a_call_in_a_run_that_is_over_raises_session_not_running(acme, server, client):
    with client.session(agent="cleanup") as s:
        send_email("ana@example.com")

    with client.resume_session(s.id), pytest.raises(SessionNotRunning) as over:
        send_email("ben@example.com")
    assert (over.value.state, over.value.status) == ("completed", 409)
    assert over.value.message == "The session is completed; open a new session."


def test_a_call_while_another_waits_for_a_reviewer_raises_session_awaiting_approval(acme, server, client):
    with client.session(agent="cleanup", approval_timeout=0.5) as s:
        with pytest.raises(ApprovalWaitTimeout) as gave_up:
            delete_account("acct-101")
        with pytest.raises(SessionAwaitingApproval) as busy:
            send_email("ana@example.com")
        [pending] = Person(server, token_of(acme.reviewer)).pending()
        assert busy.value.approval["id"] == pending["id"]
        assert busy.value.status == 409
        assert gave_up.value.effect_id == pending["effect"]
    assert Session.objects.get(pk=s.id).state == "awaiting_approval"  # /complete was refused, not raised


def test_a_wrong_key_raises_authentication_error(server, acme):
    with pytest.raises(AuthenticationError) as refused:
        UndoLogClient(server, "ul_not-a-key").session(agent="cleanup").__enter__()
    assert (refused.value.status, refused.value.code) == (401, "authentication_failed")
    assert refused.value.message == "The agent key is not valid or was revoked."


def test_a_bad_registration_raises_invalid_request_with_its_fields(acme, server, client):
    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=CompensationDescriptor.new("undo_nothing"))
    def archive(account_id: str) -> None: ...

    with pytest.raises(InvalidRequest) as invalid:
        client.register(archive)
    assert invalid.value.fields == {"tools[0].compensation": "undo_nothing@1.0.0 is not in the compensation "
                                    "registry: register it with POST /api/v1/compensations first."}


def test_an_unreachable_server_raises_connection_error(acme):
    from tests.processes import free_port

    with pytest.raises(UndoLogConnectionError, match="cannot reach undolog"):
        UndoLogClient(f"http://127.0.0.1:{free_port()}", acme.key).session(agent="cleanup").__enter__()


def test_a_replayed_failure_raises_effect_failed_and_does_not_run_again(acme, server, client):
    with client.session(agent="cleanup"):
        with pytest.raises(RuntimeError):
            send_email("bounce@example.com")
        with pytest.raises(EffectFailed, match="failed and is never run again"):
            send_email("bounce@example.com")
    assert Effect.objects.get().state == "failed"


def test_a_replay_of_a_call_still_running_elsewhere_raises_effect_in_flight(acme, server, client):
    started, release = threading.Event(), threading.Event()

    @undolog_tool(tier=ToolTier.COMPENSABLE, name="send_email",
                  compensation=CompensationDescriptor.new("undo_send_email", {"to": "{to}"}))
    def slow_email(to: str, subject: str = "Your account") -> dict:
        started.set()
        release.wait(10)
        return {"sent": to}

    with client.session(agent="cleanup"):
        first = threading.Thread(target=contextvars.copy_context().run, args=(slow_email, "ana@example.com"))
        first.start()
        assert started.wait(10)
        with pytest.raises(EffectInFlight, match="being executed elsewhere; not running it twice"):
            slow_email("ana@example.com")  # the same call: replayed, found executing
        release.set()
        first.join(10)
    assert Effect.objects.get().state == "committed"
