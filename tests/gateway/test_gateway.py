"""A real MCP client → `undolog gateway` (a real process) → the tracker (a real MCP server)
→ the real undolog server and worker. What the model reads, and what really happened upstream."""

from __future__ import annotations

import anyio
import pytest

from effects.models import Effect, SafeCall, Session
from tests.conftest import eventually

pytestmark = [pytest.mark.django_db(transaction=True)]


def text(result) -> str:
    return "\n".join(block.text for block in result.content)


def run(scenario, *args):
    return anyio.run(scenario, *args)


def session_of(persona) -> Session:
    return Session.objects.filter(org=persona.org).order_by("-created").first()


def test_a_safe_list_passes_with_no_effect_row_and_is_reported_when_the_client_leaves(harness, acme):
    gateway = harness()

    async def scenario():
        async with gateway.client() as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert {"list_issues", "create_issue", "delete_issue", "undolog_finish_run",
                    "undolog_fail_run"} <= names
            result = await client.call_tool("list_issues", {})
            assert not result.is_error and result.structured_content == {"issues": []}
            assert gateway.person.http.get("/api/v1/sessions").json()["sessions"] == []  # no round trip

    run(scenario)

    assert Effect.objects.filter(org=acme.org).count() == 0
    session = eventually(lambda: Session.objects.filter(org=acme.org, state="completed").first())
    assert list(SafeCall.objects.filter(session=session).values_list("tool_name", flat=True)) == ["list_issues"]
    assert gateway.tracker.calls("list_issues") == [["list_issues", {}]]


def test_fail_run_closes_both_created_issues_newest_first_through_the_upstream(harness, acme):
    gateway = harness()

    async def scenario():
        async with gateway.client() as client:
            first = await client.call_tool("create_issue", {"title": "a"})
            second = await client.call_tool("create_issue", {"title": "b"})
            assert (first.structured_content["number"], second.structured_content["number"]) == (1, 2)
            failed = await client.call_tool("undolog_fail_run", {"reason": "wrong repository"})
            assert not failed.is_error and "rolled back" in text(failed)
            with anyio.fail_after(30):  # the gateway runs the undo while the client stays
                while gateway.tracker.read()["closed"] != [2, 1]:
                    await anyio.sleep(0.05)

    run(scenario)

    session = session_of(acme)
    assert eventually(lambda: Session.objects.get(pk=session.pk).state == "compensated")
    assert session.error == "wrong repository"
    assert gateway.tracker.calls("close_issue") == [["close_issue", {"number": 2}], ["close_issue", {"number": 1}]]


def test_a_client_leaving_while_an_undo_is_in_flight_still_has_it_reported(harness, acme):
    gateway = harness()

    async def scenario():
        async with gateway.client() as client:
            await client.call_tool("create_issue", {"title": "lingering"})
            failed = await client.call_tool("undolog_fail_run", {"reason": "wrong repository"})
            assert not failed.is_error
            with anyio.fail_after(30):
                while gateway.tracker.read()["closed"] != [1]:  # closed upstream, not yet answered
                    await anyio.sleep(0.02)
        # leaving now cancels the gateway's loop while its upstream call is still out

    run(scenario)

    session = session_of(acme)
    assert eventually(lambda: Session.objects.get(pk=session.pk).state == "compensated")
    assert gateway.tracker.calls("close_issue") == [["close_issue", {"number": 1}]]  # done once, not again


def test_a_delete_waits_with_progress_until_a_reviewer_approves_then_runs(harness, acme):
    gateway = harness()
    progress: list[str] = []

    async def on_progress(done, total, message):
        progress.append(message or "")

    async def scenario():
        async with gateway.client() as client:
            await client.call_tool("create_issue", {"title": "a"})
            decider = gateway.reviewer(("approve", "fine"), delay=0.6)
            result = await client.call_tool("delete_issue", {"number": 1}, progress_callback=on_progress)
            await anyio.to_thread.run_sync(decider.finish)
            assert not result.is_error, text(result)
            assert result.structured_content == {"number": 1, "state": "deleted"}

    run(scenario)

    assert gateway.tracker.read()["issues"] == {}
    assert progress and "waits for a reviewer" in progress[0]


def test_a_rejected_delete_returns_the_reason_and_deletes_nothing(harness, acme):
    gateway = harness()

    async def scenario():
        async with gateway.client() as client:
            await client.call_tool("create_issue", {"title": "a"})
            decider = gateway.reviewer(("reject", "that issue is still in use"))
            result = await client.call_tool("delete_issue", {"number": 1})
            await anyio.to_thread.run_sync(decider.finish)
            assert result.is_error
            assert "that issue is still in use" in text(result)

    run(scenario)

    assert list(gateway.tracker.read()["issues"]) == ["1"]
    assert gateway.tracker.calls("delete_issue") == []


def test_a_per_run_cap_refuses_with_the_exact_message_and_never_calls_the_upstream(harness, acme):
    gateway = harness()
    gateway.admin.patch_budget(acme.agent.name, max_irreversible_per_run=0)

    async def scenario():
        async with gateway.client() as client:
            return await client.call_tool("delete_issue", {"number": 1})

    result = run(scenario)

    refusal = gateway.person.http.get("/api/v1/refusals").json()["refusals"][0]
    assert result.is_error and text(result) == refusal["message"]
    assert text(result) == ("Budget limit max_irreversible_per_run reached (limit 0); tool call 'delete_issue' "
                            "was not executed. Stop calling tools and give your final answer.")
    assert gateway.tracker.calls("delete_issue") == []


def test_an_untrusted_servers_read_only_hint_earns_nothing(harness, acme):
    gateway = harness(trusted=False, approval_wait_s=1)

    async def scenario():
        async with gateway.client() as client:
            return await client.call_tool("list_issues", {})

    result = run(scenario)

    tools = {t["name"]: t["tier"] for t in gateway.person.http.get("/api/v1/tools").json()["tools"]}
    assert tools["list_issues"] == "irreversible"
    assert result.is_error and "awaits a reviewer's approval" in text(result)
    assert "/approvals/" in text(result) and "Call it again" in text(result)
    assert gateway.tracker.calls("list_issues") == []


def test_a_call_awaiting_approval_is_picked_up_by_calling_it_again_and_runs_once(harness, acme):
    gateway = harness(approval_wait_s=1)

    async def scenario():
        async with gateway.client() as client:
            await client.call_tool("create_issue", {"title": "a"})
            first = await client.call_tool("delete_issue", {"number": 1})
            assert first.is_error and "awaits a reviewer's approval" in text(first)
            (pending,) = gateway.person.pending()
            assert gateway.person.decide(pending["id"], "approve").status_code == 200
            return await client.call_tool("delete_issue", {"number": 1})

    again = run(scenario)

    assert not again.is_error, text(again)
    assert gateway.tracker.calls("delete_issue") == [["delete_issue", {"number": 1}]]


def test_a_gateway_killed_mid_call_and_restarted_never_runs_the_retried_call_twice(harness, acme):
    import os
    import signal

    gateway = harness()

    async def killed_mid_call():
        async with gateway.client() as client:
            done = await client.call_tool("create_issue", {"title": "a"})
            assert not done.is_error

            async def kill_when_upstream_ran():
                with anyio.fail_after(20):
                    while "2" not in gateway.tracker.read()["issues"]:
                        await anyio.sleep(0.05)
                os.kill(gateway.tracker.read()["parents"][-1], signal.SIGKILL)

            async with anyio.create_task_group() as group:
                group.start_soon(kill_when_upstream_ran)
                with anyio.fail_after(20):
                    await client.call_tool("create_issue", {"title": "slow b"})

    with pytest.raises(BaseException):  # noqa: B017 (the connection dies with the gateway, however it says so)
        run(killed_mid_call)

    async def retried():
        async with gateway.client() as client:
            return (await client.call_tool("create_issue", {"title": "a"}),
                    await client.call_tool("create_issue", {"title": "slow b"}))

    replayed, in_flight = run(retried)

    assert replayed.structured_content == {"number": 1, "title": "a"}  # the stored result
    assert in_flight.is_error and "never run a second time" in text(in_flight)
    assert [args["title"] for _, args in gateway.tracker.calls("create_issue")] == ["a", "slow b"]
    assert Session.objects.filter(org=acme.org).count() == 1  # the restarted gateway resumed the run


def test_an_upstream_tool_list_change_is_registered_and_passed_on(harness, acme):
    gateway = harness()
    changed = anyio.Event()

    async def on_message(message):
        if getattr(message, "method", "") == "notifications/tools/list_changed":
            changed.set()

    async def scenario():
        async with gateway.client(message_handler=on_message) as client:
            assert "label_issue" not in {t.name for t in (await client.list_tools()).tools}
            await client.call_tool("enable_labels", {})
            with anyio.fail_after(10):
                await changed.wait()
            return {t.name for t in (await client.list_tools()).tools}

    names = run(scenario)

    assert "label_issue" in names
    registered = {t["name"] for t in gateway.person.http.get("/api/v1/tools").json()["tools"]}
    assert "label_issue" in registered


def test_the_same_rollback_works_through_a_streamable_http_upstream(harness, acme, http_tracker):
    gateway = harness(url=http_tracker)

    async def scenario():
        async with gateway.client() as client:
            await client.call_tool("create_issue", {"title": "a"})
            await client.call_tool("create_issue", {"title": "b"})
            await client.call_tool("undolog_fail_run", {"reason": "undo it"})
            with anyio.fail_after(30):
                while gateway.tracker.read()["closed"] != [2, 1]:
                    await anyio.sleep(0.05)

    run(scenario)

    assert "parents" not in gateway.tracker.read()  # served over HTTP, not spawned by the gateway


def test_a_reviewers_reject_and_roll_back_undoes_the_run_through_the_gateway(harness, acme):
    gateway = harness()

    async def scenario():
        async with gateway.client() as client:
            await client.call_tool("create_issue", {"title": "a"})
            rolled = gateway.reviewer(("reject", "stop this run"))
            rolled.person.decide = lambda approval_id, verb, reason="": rolled.person.http.post(
                f"/api/v1/approvals/{approval_id}/reject", params={"rollback": "true"}, json={"reason": reason})
            result = await client.call_tool("delete_issue", {"number": 1})
            await anyio.to_thread.run_sync(rolled.finish)
            assert result.is_error and "stop this run" in text(result)
            with anyio.fail_after(30):
                while gateway.tracker.read()["closed"] != [1]:
                    await anyio.sleep(0.05)
            after = await client.call_tool("create_issue", {"title": "b"})
            assert after.is_error and "This run is over" in text(after)

    run(scenario)

    assert eventually(lambda: session_of(acme).state == "compensated")


def test_the_gateway_over_streamable_http_keeps_one_run_per_client_session(harness, acme):
    import subprocess
    import sys

    import httpx

    from tests.processes import BASE_DIR, _stop, free_port

    gateway = harness()
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "undolog", "gateway", "--config", str(gateway.config),
                                "--http", f"127.0.0.1:{port}"], env=gateway.env(), cwd=BASE_DIR,
                               start_new_session=True)
    url = f"http://127.0.0.1:{port}/mcp"

    def up() -> bool:
        try:
            httpx.get(url, timeout=1)
            return True
        except httpx.HTTPError:
            return False

    async def one_client(title: str, fail: bool) -> None:
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        async with streamable_http_client(url) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            created = await client.call_tool("create_issue", {"title": title})
            assert not created.is_error, text(created)
            if fail:
                await client.call_tool("undolog_fail_run", {"reason": "undo it"})

    try:
        eventually(up, timeout=30)
        run(one_client, "a", True)
        eventually(lambda: gateway.tracker.read()["closed"] == [1], timeout=30)
        run(one_client, "b", False)
        # The second client ended its MCP session cleanly: its own run is complete.
        eventually(lambda: sorted(Session.objects.filter(org=acme.org).values_list("state", flat=True))
                   == ["compensated", "completed"])
    finally:
        _stop(process)
