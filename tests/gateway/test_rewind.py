"""`undolog_savepoint` and `undolog_rewind` through a real MCP client → the gateway → the tracker:
the issues created after the savepoint are closed upstream, newest first, by the gateway itself
(their undo is an upstream tool), and the run goes on from there."""

from __future__ import annotations

import anyio
import pytest

from effects.models import Effect
from tests.gateway.test_gateway import run, session_of, text

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_a_rewind_to_a_savepoint_closes_the_later_issues_newest_first_and_the_run_goes_on(harness, acme):
    gateway = harness()

    async def scenario():
        async with gateway.client() as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert {"undolog_savepoint", "undolog_rewind"} <= names
            await client.call_tool("create_issue", {"title": "a"})
            marked = await client.call_tool("undolog_savepoint", {"name": "after-a"})
            assert not marked.is_error and "Savepoint 'after-a' marks step" in text(marked)
            await client.call_tool("create_issue", {"title": "b"})
            await client.call_tool("create_issue", {"title": "c"})
            with anyio.fail_after(60):
                rewound = await client.call_tool("undolog_rewind", {"to": "after-a", "reason": "wrong titles"})
            assert not rewound.is_error, text(rewound)
            assert "undone, newest first: create_issue" in text(rewound)
            assert gateway.tracker.read()["closed"] == [3, 2]
            again = await client.call_tool("create_issue", {"title": "b"})  # identical: a new call
            assert again.structured_content["number"] == 4
            unknown = await client.call_tool("undolog_rewind", {"to": "nowhere"})
            assert unknown.is_error and "no savepoint named 'nowhere'" in text(unknown)

    run(scenario)

    session = session_of(acme)
    live = Effect.objects.filter(session=session, state="committed").order_by("step_index")
    assert [e.args["title"] for e in live] == ["a", "b"]
    assert gateway.tracker.calls("close_issue") == [["close_issue", {"number": 3}], ["close_issue", {"number": 2}]]
