"""Two `undolog gateway --http` replicas behind the test's own round-robin proxy (each request
to the next replica): one client's run spans both, because its state is in the undolog server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import ExitStack, contextmanager

import anyio
import pytest

from effects.models import Effect, Session
from tests.conftest import eventually
from tests.gateway.conftest import CLIENTS, TOKENS, http_gateway, mcp_over_http, wait_until_listening
from tests.processes import BASE_DIR, _stop, free_port

pytestmark = [pytest.mark.django_db(transaction=True)]


def text(result) -> str:
    return "\n".join(block.text for block in result.content)


@contextmanager
def replicas(harness, tmp_path):
    """Two gateway processes and the proxy in front; yields (proxy url, [gateway Popen], log)."""
    log = tmp_path / "proxy.jsonl"
    with ExitStack() as stack:
        gateways = [stack.enter_context(http_gateway(harness)) for _ in range(2)]
        port = free_port()
        proxy = subprocess.Popen([sys.executable, "-m", "tests.gateway.proxy", str(port),
                                  *[url.removesuffix("/mcp") for url, _ in gateways], str(log)],
                                 cwd=BASE_DIR, start_new_session=True)
        stack.callback(_stop, proxy)
        url = f"http://127.0.0.1:{port}/mcp"
        wait_until_listening(url, proxy)
        yield url, [process for _, process in gateways], log


def served(log) -> list[tuple[int, str]]:
    return [tuple(json.loads(line)) for line in log.read_text().splitlines()]


def test_one_clients_run_spans_both_replicas_replays_and_rolls_back_through_either(harness, acme, tmp_path):
    gateway = harness(extra=CLIENTS)

    async def scenario(url):
        async with mcp_over_http(url, TOKENS["ana"]) as ana:
            run = await ana.call_tool("undolog_start_run", {})
            handle = run.structured_content["run"]
            first = await ana.call_tool("create_issue", {"title": "a", "undolog_run": handle})
            second = await ana.call_tool("create_issue", {"title": "b", "undolog_run": handle})
            listed = await ana.call_tool("list_issues", {"undolog_run": handle})
            again = await ana.call_tool("create_issue", {"title": "a", "undolog_run": handle})  # a retry
            assert not any(r.is_error for r in (first, second, listed, again))
            assert again.structured_content == first.structured_content == {"number": 1, "title": "a"}
            failed = await ana.call_tool("undolog_fail_run", {"reason": "undo both", "undolog_run": handle})
            assert not failed.is_error, text(failed)
            with anyio.fail_after(30):
                while gateway.tracker.read()["closed"] != [2, 1]:
                    await anyio.sleep(0.05)
            return handle

    with replicas(gateway, tmp_path) as (url, _, log):
        handle = anyio.run(scenario, url)
        calls = [(replica, method) for replica, method in served(log) if method == "tools/call"]

    assert {replica for replica, _ in calls} == {0, 1}  # the one run's calls went to both replicas
    assert [args["title"] for _, args in gateway.tracker.calls("create_issue")] == ["a", "b"]  # the retry replayed
    assert gateway.tracker.calls("close_issue") == [["close_issue", {"number": 2}], ["close_issue", {"number": 1}]]
    assert list(Session.objects.filter(org=acme.org).values_list("id", flat=True)) == [Session.objects.get(
        pk=handle).pk]
    assert eventually(lambda: Session.objects.get(pk=handle).state == "compensated")
    steps = list(Effect.objects.filter(session_id=handle).order_by("created").values_list("step_index", flat=True))
    assert steps == sorted(steps) and len(set(steps)) == 2  # one order across both replicas


def test_a_replica_killed_mid_call_loses_nothing_the_retry_through_the_other_is_answered_from_the_log(
        harness, acme, tmp_path):
    gateway = harness(extra=CLIENTS)

    with replicas(gateway, tmp_path) as (url, processes, log):

        async def killed_mid_call():
            async with mcp_over_http(url, TOKENS["ana"]) as ana:
                handle = (await ana.call_tool("undolog_start_run", {})).structured_content["run"]

                async def kill_when_upstream_ran():
                    with anyio.fail_after(20):
                        while not any(i["title"] == "slow c" for i in gateway.tracker.read()["issues"].values()):
                            await anyio.sleep(0.05)
                    replica, _ = [entry for entry in served(log) if entry[1] == "tools/call"][-1]
                    os.killpg(processes[replica].pid, signal.SIGKILL)

                outcome = {}
                async with anyio.create_task_group() as group:
                    group.start_soon(kill_when_upstream_ran)
                    with anyio.fail_after(30):
                        try:
                            await ana.call_tool("create_issue", {"title": "slow c", "undolog_run": handle})
                        except Exception as exc:  # the replica died under the call, however the client says so
                            outcome["cut"] = exc
                assert "cut" in outcome
                retried = await ana.call_tool("create_issue", {"title": "slow c", "undolog_run": handle})
                after = await ana.call_tool("create_issue", {"title": "d", "undolog_run": handle})
                return handle, retried, after

        handle, retried, after = anyio.run(killed_mid_call)

    assert retried.is_error and "never run a second time" in text(retried)
    assert not after.is_error and after.structured_content["title"] == "d"  # the run goes on, on the other one
    assert [args["title"] for _, args in gateway.tracker.calls("create_issue")] == ["slow c", "d"]  # once
    effects = {e.args["title"]: e.state for e in Effect.objects.filter(session_id=handle)}
    assert effects == {"slow c": "executing", "d": "committed"}
