"""The gateway as a service over streamable HTTP: real `mcp` clients (the package's default
negotiation, 2026-07-28, and the legacy handshake, 2025-11-25), several at once, each with its
own bearer token → `undolog gateway --http` (a real process) → the tracker → the real server."""

from __future__ import annotations

import anyio
import httpx
import pytest

from effects.models import SafeCall, Session
from lifecycle.abandon import sweep
from tests.conftest import eventually
from tests.gateway.conftest import CLIENTS, TOKENS, http_gateway, mcp_over_http

pytestmark = [pytest.mark.django_db(transaction=True)]


def text(result) -> str:
    return "\n".join(block.text for block in result.content)


def runs(persona) -> dict[str, Session]:
    return {str(s.pk): s for s in Session.objects.filter(org=persona.org)}


async def start(client) -> str:
    started = await client.call_tool("undolog_start_run", {})
    assert not started.is_error, text(started)
    return started.structured_content["run"]


def test_two_stateless_clients_at_once_get_their_own_runs_and_ones_rollback_leaves_the_others_work(
        harness, acme):
    gateway = harness(extra=CLIENTS)
    seen: dict[str, str] = {}

    async def both(url):
        async with mcp_over_http(url, TOKENS["ana"]) as ana, mcp_over_http(url, TOKENS["bo"]) as bo:
            seen["ana"], seen["bo"] = ana.protocol_version, bo.protocol_version
            ana_run, bo_run = await start(ana), await start(bo)
            async with anyio.create_task_group() as group:  # the two conversations interleave
                group.start_soon(ana.call_tool, "create_issue", {"title": "ana's", "undolog_run": ana_run})
                group.start_soon(bo.call_tool, "create_issue", {"title": "bo's", "undolog_run": bo_run})
            listed = await bo.call_tool("list_issues", {"undolog_run": bo_run})
            assert not listed.is_error and len(listed.structured_content["issues"]) == 2
            failed = await ana.call_tool("undolog_fail_run", {"reason": "wrong repo", "undolog_run": ana_run})
            assert not failed.is_error and "rolled back" in text(failed)
            with anyio.fail_after(30):
                while len(gateway.tracker.read()["closed"]) != 1:
                    await anyio.sleep(0.05)
            later = await bo.call_tool("create_issue", {"title": "bo's second", "undolog_run": bo_run})
            assert not later.is_error, text(later)
            done = await bo.call_tool("undolog_finish_run", {"undolog_run": bo_run})
            assert not done.is_error
            return ana_run, bo_run

    with http_gateway(gateway) as (url, _):
        ana_run, bo_run = anyio.run(both, url)

    assert seen == {"ana": "2026-07-28", "bo": "2026-07-28"}
    issues = gateway.tracker.read()["issues"]
    closed = {issue["title"] for issue in issues.values() if issue["state"] == "closed"}
    assert closed == {"ana's"}  # bo's work stands
    assert eventually(lambda: runs(acme)[ana_run].state == "compensated")
    found = runs(acme)
    assert set(found) == {ana_run, bo_run}
    assert found[bo_run].state == "completed"
    assert (found[ana_run].metadata["client"], found[ana_run].started_by) == ("ana", "ana@example.com")
    assert (found[bo_run].metadata["client"], found[bo_run].started_by) == ("bo", "")
    assert [e.tool_name for e in found[bo_run].effects.order_by("step_index")] == ["create_issue", "create_issue"]
    assert list(SafeCall.objects.filter(session_id=bo_run).values_list("tool_name", flat=True)) == ["list_issues"]


def test_a_stateless_call_that_names_no_run_is_refused_and_nothing_runs(harness, acme):
    gateway = harness(extra=CLIENTS)

    async def scenario(url):
        async with mcp_over_http(url, TOKENS["ana"]) as ana:
            tools = {tool.name: tool for tool in (await ana.list_tools()).tools}
            assert "undolog_run" in tools["create_issue"].input_schema["properties"]
            return (await ana.call_tool("create_issue", {"title": "orphan"}),
                    await ana.call_tool("list_issues", {}),
                    await ana.call_tool("undolog_fail_run", {"reason": "whose?"}))

    with http_gateway(gateway) as (url, _):
        results = anyio.run(scenario, url)

    for result in results:
        assert result.is_error and "Call undolog_start_run once" in text(result)
    assert gateway.tracker.calls() == []
    assert not Session.objects.filter(org=acme.org).exists()


def test_bad_run_handles_and_another_clients_run_are_refused_and_nothing_runs(harness, acme):
    gateway = harness(extra=CLIENTS)

    async def scenario(url):
        async with mcp_over_http(url, TOKENS["ana"]) as ana, mcp_over_http(url, TOKENS["bo"]) as bo:
            ana_run = await start(ana)
            answers = {
                "malformed": await bo.call_tool("create_issue", {"title": "x", "undolog_run": "not-a-run"}),
                "oversized": await bo.call_tool("create_issue", {"title": "x", "undolog_run": "r" * 5000}),
                "not a string": await bo.call_tool("create_issue", {"title": "x", "undolog_run": 7}),
                "ana's run": await bo.call_tool("create_issue", {"title": "x", "undolog_run": ana_run}),
                "ana's run, failed": await bo.call_tool("undolog_fail_run", {"reason": "x", "undolog_run": ana_run}),
                "unknown": await bo.call_tool("create_issue", {"title": "x", "undolog_run":
                                                               "0b7d3c38-4b8e-4c1e-9a51-6f0a4f8e2d11"}),
            }
            headed = mcp_over_http(url, TOKENS["bo"], headers={"Undolog-Run": "f" * 36})
            async with headed as by_header:
                answers["header"] = await by_header.call_tool("list_issues", {})
            return ana_run, answers

    with http_gateway(gateway) as (url, _):
        ana_run, answers = anyio.run(scenario, url)

    assert "is not a run handle" in text(answers["malformed"])
    assert "is not a run handle" in text(answers["oversized"]) and len(text(answers["oversized"])) < 300
    assert "is not a run handle" in text(answers["not a string"])
    assert "is not a run handle" in text(answers["header"])
    for case in ("ana's run", "ana's run, failed", "unknown"):
        assert answers[case].is_error and "of this client (bo)" in text(answers[case]), case
    assert all(result.is_error for result in answers.values())
    assert gateway.tracker.calls() == []
    assert Session.objects.get(pk=ana_run).state == "running"  # bo's fail did not reach it


def test_a_request_without_a_valid_token_is_401_before_any_tool_is_listed(harness, acme):
    gateway = harness(extra=CLIENTS)
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}}}}
    headers = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list",
               "Accept": "application/json, text/event-stream"}

    with http_gateway(gateway) as (url, _):
        answers = {
            "none": httpx.post(url, json=listing, headers=headers),
            "wrong": httpx.post(url, json=listing, headers={**headers, "Authorization": "Bearer nope"}),
            "another gateway's": httpx.post(url, json=listing, headers={
                **headers, "Authorization": "Bearer other-gateway-token-0123456789"}),
            "the agent key": httpx.post(url, json=listing, headers={**headers,
                                                                     "Authorization": f"Bearer {acme.key}"}),
            "basic": httpx.post(url, json=listing, headers={**headers, "Authorization": f"Basic {TOKENS['ana']}"}),
        }
        good = httpx.post(url, json=listing, headers={**headers, "Authorization": f"Bearer {TOKENS['ana']}"})

        async def default_client():
            async with mcp_over_http(url) as client:
                await client.list_tools()

        with pytest.raises(BaseException):  # noqa: B017 (the mcp client raises its own wrapper of the 401)
            anyio.run(default_client)

    for case, response in answers.items():
        assert response.status_code == 401, case
        assert response.headers["www-authenticate"].startswith("Bearer"), case
        assert response.json()["error"] == "unauthorized" and "tools" not in response.text, case
    assert good.status_code == 200 and "create_issue" in good.text


def test_two_legacy_clients_at_once_keep_one_run_per_mcp_session(harness, acme):
    gateway = harness(extra=CLIENTS)
    seen: list[str] = []

    async def both(url):
        async with mcp_over_http(url, TOKENS["ana"], mode="legacy") as ana, \
                mcp_over_http(url, TOKENS["bo"], mode="legacy") as bo:
            seen.extend([ana.protocol_version, bo.protocol_version])
            await ana.call_tool("create_issue", {"title": "ana's"})
            await bo.call_tool("create_issue", {"title": "bo's"})
            await ana.call_tool("undolog_fail_run", {"reason": "undo mine"})
            with anyio.fail_after(30):
                while gateway.tracker.read()["closed"] != [1]:
                    await anyio.sleep(0.05)
            again = await bo.call_tool("create_issue", {"title": "bo's second"})
            assert not again.is_error, text(again)
        # both ended their MCP sessions (DELETE): bo's run is complete

    with http_gateway(gateway) as (url, _):
        anyio.run(both, url)
        eventually(lambda: sorted(s.state for s in runs(acme).values()) == ["compensated", "completed"])

    assert seen == ["2025-11-25", "2025-11-25"]
    by_client = {s.metadata["client"]: s for s in runs(acme).values()}
    assert by_client["bo"].effects.count() == 2 and by_client["ana"].effects.count() == 1


def test_a_quiet_clients_run_is_completed_by_the_idle_sweep_and_its_work_stands(harness, acme):
    from datetime import timedelta

    from django.utils import timezone

    gateway = harness(extra=CLIENTS)

    async def quiet(url):
        async with mcp_over_http(url, TOKENS["ana"]) as ana:
            run = await start(ana)
            await ana.call_tool("create_issue", {"title": "kept", "undolog_run": run})
            return run
        # the client is closed without finishing its run: nothing on the wire says so

    with http_gateway(gateway) as (url, _):
        run = anyio.run(quiet, url)

    session = Session.objects.get(pk=run)
    assert (session.state, session.on_idle) == ("running", "complete")
    assert sweep(now=timezone.now() + timedelta(seconds=acme.org.run_idle_timeout_s + 5)) == 1
    session.refresh_from_db()
    assert session.state == "completed" and session.error.startswith("abandoned: no call for ")
    assert gateway.tracker.read()["closed"] == []  # nothing rolled back


def test_a_gateway_on_a_public_address_without_client_tokens_refuses_to_start(harness, acme, tmp_path):
    import subprocess
    import sys

    from tests.processes import BASE_DIR

    gateway = harness()
    done = subprocess.run([sys.executable, "-m", "undolog", "gateway", "--config", str(gateway.config),
                           "--http", "0.0.0.0:8119"], env=gateway.env(), cwd=BASE_DIR, capture_output=True,
                          text=True, timeout=60)

    assert done.returncode == 1
    assert "refusing to serve --http on 0.0.0.0" in done.stderr and "[clients.<name>]" in done.stderr
    assert gateway.tracker.read()["calls"] == [] and "parents" not in gateway.tracker.read()  # no upstream started


def test_the_person_a_client_acts_for_cannot_approve_its_runs_calls(harness, acme):
    gateway = harness(extra=CLIENTS, approval_wait_s=1)
    ana_herself = acme.person("ana@example.com", "reviewer")

    async def scenario(url):
        async with mcp_over_http(url, TOKENS["ana"]) as ana:
            run = await start(ana)
            await ana.call_tool("create_issue", {"title": "a", "undolog_run": run})
            waiting = await ana.call_tool("delete_issue", {"number": 1, "undolog_run": run})
            assert waiting.is_error and "awaits a reviewer's approval" in text(waiting)
            (pending,) = await anyio.to_thread.run_sync(gateway.person.pending)
            refused = await anyio.to_thread.run_sync(lambda: ana_herself.post(
                f"/api/v1/approvals/{pending['id']}/approve", {"reason": "mine"}, format="json"))
            assert refused.status_code == 403 and "You started this run" in refused.json()["message"]
            assert gateway.tracker.calls("delete_issue") == []
            approved = await anyio.to_thread.run_sync(gateway.person.decide, pending["id"], "approve")
            assert approved.status_code == 200
            return await ana.call_tool("delete_issue", {"number": 1, "undolog_run": run})

    with http_gateway(gateway) as (url, _):
        again = anyio.run(scenario, url)

    assert not again.is_error, text(again)
    assert gateway.tracker.calls("delete_issue") == [["delete_issue", {"number": 1}]]


def test_a_legacy_session_opened_by_one_client_is_refused_to_another(harness, acme):
    gateway = harness(extra=CLIENTS)
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    accept = {"Accept": "application/json, text/event-stream"}

    with http_gateway(gateway) as (url, _):
        opened = httpx.post(url, json=initialize, headers={**accept, "Authorization": f"Bearer {TOKENS['ana']}"})
        session_id = opened.headers["mcp-session-id"]
        legacy = {**accept, "Mcp-Session-Id": session_id, "MCP-Protocol-Version": "2025-11-25"}
        by_bo = httpx.post(url, json=listing, headers={**legacy, "Authorization": f"Bearer {TOKENS['bo']}"})
        by_ana = httpx.post(url, json=listing, headers={**legacy, "Authorization": f"Bearer {TOKENS['ana']}"})

    assert opened.status_code == 200
    assert by_bo.status_code == 404 and by_bo.json()["error"] == "session_not_found"
    assert by_ana.status_code == 200 and "create_issue" in by_ana.text
