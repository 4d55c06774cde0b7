"""A legacy (2025-11-25) client that calls `undolog_start_run`, as the gateway's instructions say,
keeps one run: its MCP session's (issue 37). And a replayed call answers in the shape the
upstream first answered it. Real `mcp` clients → `undolog gateway` (a real process) → real
upstreams (the tracker; a server that answers text only) → the real server."""

from __future__ import annotations

import json
import sys

import anyio
import pytest
from undolog.gateway.core import replayed_result

from effects.models import Effect, Session
from tests.conftest import eventually
from tests.gateway.conftest import CLIENTS, TOKENS, http_gateway, mcp_over_http
from tests.processes import BASE_DIR

pytestmark = [pytest.mark.django_db(transaction=True)]


def text(result) -> str:
    return "\n".join(block.text for block in result.content)


def test_start_run_in_a_legacy_session_answers_the_sessions_own_run_and_nothing_splits(harness, acme):
    gateway = harness(extra=CLIENTS)

    async def scenario(url):
        async with mcp_over_http(url, TOKENS["ana"], mode="legacy") as client:
            assert not (await client.call_tool("create_issue", {"title": "before"})).is_error
            started = await client.call_tool("undolog_start_run", {})
            assert not started.is_error and "already has a run" in text(started)
            handle = started.structured_content["run"]
            named = await client.call_tool("create_issue", {"title": "named", "undolog_run": handle})
            unnamed = await client.call_tool("create_issue", {"title": "unnamed"})
            assert not named.is_error and not unnamed.is_error
            assert not (await client.call_tool("list_issues", {"undolog_run": handle})).is_error

            def counted() -> bool:  # reported while the client stays: the handle may go elsewhere
                run = gateway.person.http.get(f"/api/v1/sessions/{handle}").json()
                return run["budget"]["tool_counts"].get("list_issues") == 1

            with anyio.fail_after(10):
                while not await anyio.to_thread.run_sync(counted):
                    await anyio.sleep(0.1)
            return handle

    with http_gateway(gateway) as (url, _):
        handle = anyio.run(scenario, url)
        (run,) = Session.objects.filter(org=acme.org)
        assert str(run.pk) == handle
        assert eventually(lambda: Session.objects.get(pk=run.pk).state == "completed")  # the client left
    steps = list(Effect.objects.filter(session=run).order_by("step_index").values_list("args__title", flat=True))
    assert steps == ["before", "named", "unnamed"]


def test_start_run_first_in_a_legacy_session_opens_the_sessions_run_and_leaving_completes_it(harness, acme):
    gateway = harness(extra=CLIENTS)

    async def scenario(url):
        async with mcp_over_http(url, TOKENS["bo"], mode="legacy") as client:
            started = await client.call_tool("undolog_start_run", {})
            assert "Run started" in text(started)
            again = await client.call_tool("undolog_start_run", {})
            assert again.structured_content == started.structured_content and "already has a run" in text(again)
            assert not (await client.call_tool("create_issue", {"title": "a"})).is_error
            return started.structured_content["run"]

    with http_gateway(gateway) as (url, _):
        handle = anyio.run(scenario, url)
        (run,) = Session.objects.filter(org=acme.org)
        assert str(run.pk) == handle and run.metadata["client"] == "bo"
        assert eventually(lambda: Session.objects.get(pk=run.pk).state == "completed")
    assert Effect.objects.get(session=run).args == {"title": "a"}


def test_a_replayed_call_answers_as_the_upstream_first_did(harness, acme):
    gateway = harness(extra=f"""
[servers.textual]
command = {json.dumps([sys.executable, "-m", "tests.gateway.textual"])}
cwd = {json.dumps(str(BASE_DIR))}
trusted = true

[servers.textual.tools.add_note]
tier = "compensable"
compensation = {{ tool = "remove_note", args = {{ text = "{{text}}" }} }}

[servers.textual.tools.add_item]
tier = "compensable"
compensation = {{ tool = "remove_item", args = {{ name = "{{name}}" }} }}
""")

    async def scenario():
        async with gateway.client() as client:
            answers = {}
            for tool, args in (("add_note", {"text": "milk"}), ("add_item", {"name": "eggs"}),
                               ("create_issue", {"title": "a"})):
                first = await client.call_tool(tool, args)
                replayed = await client.call_tool(tool, args)
                answers[tool] = (first, replayed)
            return answers

    answers = anyio.run(scenario)

    note, note_again = answers["add_note"]
    assert text(note) == text(note_again) == "Added note 1: milk" and note_again.structured_content is None
    item, item_again = answers["add_item"]
    assert text(item_again) == text(item) == json.dumps({"name": "eggs", "position": 1}, indent=2)
    assert item_again.structured_content is None
    issue, issue_again = answers["create_issue"]
    assert issue_again.structured_content == issue.structured_content == {"number": 1, "title": "a"}
    assert len(gateway.tracker.calls("create_issue")) == 1
    assert Effect.objects.filter(org=acme.org).count() == 3  # each ran once; the second call of each replayed


def test_a_replay_this_gateway_no_longer_holds_is_rebuilt_in_the_upstreams_shape():
    prose = replayed_result({"text": "Added note 1: milk"})
    assert [block.text for block in prose.content] == ["Added note 1: milk"] and prose.structured_content is None
    structured = replayed_result({"number": 1})
    assert structured.structured_content == {"number": 1} and json.loads(structured.content[0].text) == {"number": 1}
    listed = replayed_result([1, 2])
    assert listed.structured_content is None and json.loads(listed.content[0].text) == [1, 2]
