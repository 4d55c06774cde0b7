"""The tier paths of a session against the in-memory fake of the API contract."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from undolog import (
    ApprovalExpired,
    ApprovalRejected,
    ApprovalWaitTimeout,
    CompensationDescriptor,
    EffectInFlight,
    ToolTier,
    UndoLogClient,
    UndoLogConnectionError,
    current_session,
    refusal_as_tool_result,
    undolog_tool,
)

from fakeserver import FakeServer

ran: list[str] = []


@undolog_tool(tier=ToolTier.SAFE)
def list_inactive_accounts(limit: int = 10) -> list[str]:
    ran.append("list")
    return ["acct-101", "acct-102"][:limit]


@undolog_tool(tier=ToolTier.COMPENSABLE,
              compensation=CompensationDescriptor.new("undo_send_email", {"to": "{to}"}))
def send_email(to: str, subject: str = "hi") -> dict:
    ran.append(f"send {to}")
    if to == "bounce@x.io":
        raise RuntimeError("mailbox full")
    return {"message_id": f"<{to}>"}


@undolog_tool(tier=ToolTier.COMPENSABLE,
              compensation=CompensationDescriptor.new("undo_count", {}))
async def count_things(n: int) -> int:
    ran.append(f"count {n}")
    return n * 2


@undolog_tool(tier=ToolTier.IRREVERSIBLE, reason="Deletes an account for good")
async def delete_account(account_id: str) -> str:
    ran.append(f"delete {account_id}")
    return f"deleted {account_id}"


@undolog_tool(tier=ToolTier.IRREVERSIBLE, reason="Wires money", executor={"url": "https://x/pay"})
async def wire(amount: int) -> str:
    ran.append("wire")
    return "wired here"


TOOLS = (list_inactive_accounts, send_email, count_things, delete_account, wire)


@pytest.fixture(autouse=True)
def _registered(client: UndoLogClient) -> None:
    ran.clear()
    client.register(*TOOLS)


def test_register_posts_every_spec(server: FakeServer) -> None:
    [body] = server.bodies("/api/v1/tools")
    assert [t["name"] for t in body["tools"]] == [t.__name__ for t in TOOLS]


def test_register_compensation_posts_the_contract_body(client: UndoLogClient,
                                                       server: FakeServer) -> None:
    client.register_compensation("undo_send_email", "1.0.0", "webhook", "https://x.io/undo")
    assert server.bodies("/api/v1/compensations") == [{
        "fn_name": "undo_send_email", "fn_version": "1.0.0", "handler": "webhook",
        "target": "https://x.io/undo", "timeout_ms": 5000}]


def test_safe_calls_make_no_request_and_ride_on_the_next_one(client: UndoLogClient,
                                                             server: FakeServer) -> None:
    with client.session(agent="cleanup"):
        server.forbid = True
        assert list_inactive_accounts() == ["acct-101", "acct-102"]
        assert list_inactive_accounts(1) == ["acct-101"]
        server.forbid = False
        send_email("a@x.io")
    [intercept] = server.bodies("/intercept")
    assert intercept == {
        "tool": "send_email", "args": {"to": "a@x.io", "subject": "hi"}, "step_index": 3,
        "safe_calls": [
            {"tool": "list_inactive_accounts", "step_index": 1, "args": {"limit": 10}},
            {"tool": "list_inactive_accounts", "step_index": 2, "args": {"limit": 1}}]}


def test_trailing_safe_calls_are_reported_when_the_session_completes(client: UndoLogClient,
                                                                     server: FakeServer) -> None:
    with client.session(agent="cleanup") as s:
        list_inactive_accounts()
    assert server.bodies("/complete") == [{"safe_calls": [
        {"tool": "list_inactive_accounts", "step_index": 1, "args": {"limit": 10}}]}]
    assert s.state == "completed"


def test_compensable_call_intercepts_runs_and_commits(client: UndoLogClient,
                                                      server: FakeServer) -> None:
    with client.session(agent="cleanup", metadata={"trigger": "nightly"}):
        assert send_email("a@x.io", subject="bye") == {"message_id": "<a@x.io>"}
    assert server.bodies("/api/v1/sessions") == [{"agent": "cleanup",
                                                  "metadata": {"trigger": "nightly"}}]
    assert server.bodies("/commit") == [{"result": {"message_id": "<a@x.io>"}}]
    assert ran == ["send a@x.io"]


def test_a_raising_tool_reports_failure_reraises_and_fails_the_session(
        client: UndoLogClient, server: FakeServer) -> None:
    with (pytest.raises(RuntimeError, match="mailbox full"),
          client.session(agent="cleanup") as s):
        send_email("a@x.io")
        send_email("bounce@x.io")
    assert server.bodies("/effects/" + _effect_id(server, "bounce@x.io") + "/fail") == [
        {"error": "RuntimeError: mailbox full"}]
    assert server.bodies("/fail")[-1] == {"error": "RuntimeError: mailbox full"}
    assert s.wait_compensated(timeout=5, poll_interval=0)["state"] == "compensated"


def test_a_replayed_call_returns_the_stored_result_without_running(
        client: UndoLogClient, server: FakeServer) -> None:
    async def run() -> list[int]:
        async with client.session(agent="cleanup"):
            return [await count_things(21), await count_things(21)]

    assert asyncio.run(run()) == [42, 42]
    assert ran == ["count 21"]
    assert server.bodies("/commit") == [{"result": {"value": 42}}]


def test_a_resumed_session_replays_what_was_committed(client: UndoLogClient,
                                                      server: FakeServer) -> None:
    # Like a crash, an interrupt leaves the session running.
    with pytest.raises(KeyboardInterrupt), client.session(agent="cleanup") as first:
        send_email("a@x.io")
        raise KeyboardInterrupt
    with client.resume_session(first.id) as again:
        assert send_email("a@x.io") == {"message_id": "<a@x.io>"}
    assert ran == ["send a@x.io"]
    assert again.id == first.id and again.state == "completed"
    assert server.bodies("/intercept")[-1]["step_index"] == 2


def test_a_replay_of_an_effect_in_flight_elsewhere_raises(client: UndoLogClient,
                                                          server: FakeServer) -> None:
    with client.session(agent="cleanup"):
        send_email("a@x.io")
        next(iter(server.effects.values()))["state"] = "executing"
        with pytest.raises(EffectInFlight):
            send_email("a@x.io")
    assert ran == ["send a@x.io"]


def test_an_approved_irreversible_call_waits_runs_and_commits(client: UndoLogClient,
                                                              server: FakeServer) -> None:
    server.decisions["delete_account"] = ("approved", {})
    waits: list[Any] = []

    async def run() -> str:
        async with client.session(agent="cleanup", on_wait=waits.append):
            return await delete_account("acct-101")

    assert asyncio.run(run()) == "deleted acct-101"
    assert [w.state for w in waits] == ["pending"]
    assert waits[0].timeout_at == "2030-01-01T00:00:00Z"
    polls = [(m, p) for m, p, _ in server.requests if m == "GET" and "/effects/" in p]
    assert len(polls) == 1
    assert server.bodies("/commit") == [{"result": {"value": "deleted acct-101"}}]
    # Claimed (approved → executing) before it ran, so no second caller can run it too.
    verbs = [p.rsplit("/", 1)[-1] for m, p, _ in server.requests
             if m == "POST" and "/effects/" in p]
    assert verbs == ["start", "commit"]


def test_a_call_another_caller_started_first_returns_its_outcome_without_running(
        server: FakeServer) -> None:
    server.decisions["delete_account"] = ("approved", {})
    looks = {"after_lost_start": 0}

    def other_caller(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        effect = next(iter(server.effects.values()), None)
        if request.method == "POST" and path.endswith("/start"):
            effect["state"] = "executing"  # the other caller's /start landed first
        elif request.method == "GET" and "/effects/" in path and effect["state"] == "executing":
            looks["after_lost_start"] += 1
            if looks["after_lost_start"] == 2:  # it commits while we wait
                effect.update(state="committed", result={"value": "deleted by the other"})
        return server(request)

    transport = httpx.MockTransport(other_caller)
    client = UndoLogClient("http://undolog.test", "test-key", transport=transport,
                           async_transport=transport, poll_wait=1)
    client.register(delete_account)

    async def run() -> str:
        async with client.session(agent="cleanup"):
            return await delete_account("acct-101")

    assert asyncio.run(run()) == "deleted by the other"
    assert ran == [] and server.bodies("/commit") == []


def test_a_call_started_by_another_caller_while_waiting_returns_its_outcome(
        server: FakeServer) -> None:
    server.decisions["delete_account"] = ("executing", {})  # someone else claimed it
    polls = {"n": 0}

    def other_caller(request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and "/effects/" in request.url.path:
            polls["n"] += 1
            effect = next(iter(server.effects.values()))
            if polls["n"] == 2:
                effect.update(state="committed", result={"value": "deleted by the other"})
        return server(request)

    transport = httpx.MockTransport(other_caller)
    client = UndoLogClient("http://undolog.test", "test-key", transport=transport,
                           async_transport=transport, poll_wait=1)
    client.register(delete_account)
    with client.session(agent="cleanup"):
        assert asyncio.run(delete_account("acct-101")) == "deleted by the other"
    assert ran == [] and server.bodies("/start") == [] and server.bodies("/commit") == []


def test_the_long_poll_asks_the_server_to_wait(server: FakeServer) -> None:
    seen: list[httpx.Request] = []

    def spy(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return server(request)

    transport = httpx.MockTransport(spy)
    client = UndoLogClient("http://undolog.test", "test-key", async_transport=transport,
                           transport=transport, poll_wait=30)
    client.register(delete_account)
    server.decisions["delete_account"] = ("approved", {})

    async def run() -> None:
        async with client.session(agent="cleanup"):
            await delete_account("acct-101")

    asyncio.run(run())
    [poll] = [r for r in seen if r.method == "GET" and "/effects/" in r.url.path]
    assert poll.url.params["wait"] == "30"


def test_a_rejected_call_raises_with_reason_and_reviewer(client: UndoLogClient,
                                                         server: FakeServer) -> None:
    server.decisions["delete_account"] = (
        "rejected", {"approval": {"reason": "acct-102 has an open invoice", "decided_by": "alice"}})

    async def run() -> None:
        async with client.session(agent="cleanup"):
            await delete_account("acct-102")

    with pytest.raises(ApprovalRejected) as caught:
        asyncio.run(run())
    assert (caught.value.reason, caught.value.reviewer) == ("acct-102 has an open invoice", "alice")
    assert refusal_as_tool_result(caught.value) == "DENIED: acct-102 has an open invoice"
    assert ran == []


def test_an_expired_request_raises(client: UndoLogClient, server: FakeServer) -> None:
    server.decisions["delete_account"] = ("expired", {})

    async def run() -> None:
        async with client.session(agent="cleanup"):
            await delete_account("acct-103")

    with pytest.raises(ApprovalExpired):
        asyncio.run(run())
    assert ran == []


def test_waiting_longer_than_approval_timeout_raises(client: UndoLogClient,
                                                     server: FakeServer,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_sleep(seconds: float) -> None: ...

    monkeypatch.setattr(asyncio, "sleep", no_sleep)

    async def run() -> None:
        async with client.session(agent="cleanup", approval_timeout=0.01):
            await delete_account("acct-101")

    with pytest.raises(ApprovalWaitTimeout) as caught:
        asyncio.run(run())
    assert caught.value.effect_id in server.effects


def test_a_tool_with_an_executor_is_never_run_by_the_agent(client: UndoLogClient,
                                                           server: FakeServer) -> None:
    server.decisions["wire"] = ("committed", {"result": {"value": "wired by the worker"}})

    async def run() -> str:
        async with client.session(agent="cleanup"):
            return await wire(100)

    assert asyncio.run(run()) == "wired by the worker"
    assert ran == [] and server.bodies("/commit") == []


def test_reasoning_goes_with_the_next_intercept_only(client: UndoLogClient,
                                                     server: FakeServer) -> None:
    with client.session(agent="cleanup") as s:
        assert current_session() is s
        s.reasoning("the user asked for a goodbye note")
        send_email("a@x.io")
        send_email("b@x.io")
    assert current_session() is None
    first, second = server.bodies("/intercept")
    assert first["reasoning"] == "the user asked for a goodbye note"
    assert "reasoning" not in second


def test_an_idempotency_key_is_computed_from_the_bound_args(client: UndoLogClient,
                                                            server: FakeServer) -> None:
    @undolog_tool(tier="compensable", compensation=CompensationDescriptor.new("refund"),
                  idempotency_key=lambda args: f"charge-{args['order']}")
    def charge(order: str, cents: int = 100) -> dict:
        return {"ok": True}

    client.register(charge)
    with client.session(agent="cleanup"):
        charge("o-1")
    assert server.bodies("/intercept")[0]["idempotency_key"] == "charge-o-1"


def test_a_lost_intercept_keeps_the_safe_calls_for_the_next_request(server: FakeServer) -> None:
    broken = {"on": False}

    def flaky(request: httpx.Request) -> httpx.Response:
        if broken["on"]:
            raise httpx.ConnectError("connection refused", request=request)
        return server(request)

    transport = httpx.MockTransport(flaky)
    client = UndoLogClient("http://undolog.test", "test-key", transport=transport)
    client.register(*TOOLS)
    with client.session(agent="cleanup"):
        list_inactive_accounts()
        broken["on"] = True
        with pytest.raises(UndoLogConnectionError):
            send_email("a@x.io")
        broken["on"] = False
        send_email("a@x.io")
    assert [c["tool"] for c in server.bodies("/intercept")[-1]["safe_calls"]] == [
        "list_inactive_accounts"]


def test_parallel_async_calls_share_the_session_and_get_distinct_steps(
        client: UndoLogClient, server: FakeServer) -> None:
    async def run() -> list[int]:
        async with client.session(agent="cleanup"):
            return list(await asyncio.gather(*(count_things(n) for n in range(5))))

    assert asyncio.run(run()) == [0, 2, 4, 6, 8]
    assert sorted(b["step_index"] for b in server.bodies("/intercept")) == [1, 2, 3, 4, 5]


def _effect_id(server: FakeServer, to: str) -> str:
    return next(e["id"] for e in server.effects.values() if e["args"].get("to") == to)


def test_async_safe_calls_make_no_request_either(client: UndoLogClient, server: FakeServer) -> None:
    @undolog_tool(tier=ToolTier.SAFE)
    async def search_web(query: str) -> str:
        return f"results for {query}"

    async def run() -> list[str]:
        async with client.session(agent="cleanup") as s:
            server.forbid = True
            found = await asyncio.gather(search_web("a"), search_web(query="b"))
            server.forbid = False
            assert [c["args"] for c in s._safe] == [{"query": "a"}, {"query": "b"}]
            return list(found)

    assert asyncio.run(run()) == ["results for a", "results for b"]


def test_a_run_halted_by_a_reviewer_still_leaves_its_block_cleanly(client: UndoLogClient,
                                                                   server: FakeServer) -> None:
    server.decisions["delete_account"] = ("rejected", {"approval": {"reason": "no"}})

    async def caught() -> Any:
        async with client.session(agent="cleanup") as s:
            with pytest.raises(ApprovalRejected):
                await delete_account("acct-101")
        return s

    async def uncaught() -> None:
        async with client.session(agent="cleanup"):
            await delete_account("acct-102")

    assert asyncio.run(caught()).state == "halted"  # /complete answered 409, not raised
    with pytest.raises(ApprovalRejected):  # the halted run is failed, so it is rolled back
        asyncio.run(uncaught())
    assert server.bodies("/fail")[-1] == {"error": "ApprovalRejected: rejected by a reviewer: no"}
