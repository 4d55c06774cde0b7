"""Two gateways of one agent that give two different upstreams one server name never run each
other's undos (issue 37): a gateway's agent-side undo functions are scoped to the upstream that
runs them, claims name the upstreams they serve, and a second gateway that disagrees about a
name is refused at start. Real gateways, real tracker upstreams (stdio and streamable HTTP), the
real server and worker."""

from __future__ import annotations

import subprocess
import sys

import anyio
import httpx
import pytest
from undolog.gateway import load_config

from effects.models import Session, UndoEntry
from tests.conftest import eventually
from tests.gateway.conftest import Harness, Tracker
from tests.processes import BASE_DIR

pytestmark = [pytest.mark.django_db(transaction=True)]


def claim(base: str, key: str, **body) -> httpx.Response:
    return httpx.post(f"{base}/api/v1/undo-entries/claim", json={"max": 10, "lease_s": 30, **body},
                      headers={"Authorization": f"Bearer {key}"}, timeout=10)


def test_only_the_gateway_serving_the_upstream_claims_its_undo_and_the_other_is_refused(
        tmp_path, acme, server, worker, http_tracker):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    right = Harness(tmp_path / "a", acme, server)  # [servers.tracker]: the stdio tracker
    wrong = Harness(tmp_path / "b", acme, server, url=http_tracker)  # [servers.tracker]: another one
    wrong_truth = Tracker(tmp_path / "tracker.json")  # what the HTTP tracker really holds
    right_scope = load_config(right.config).servers[0].scope
    wrong_scope = load_config(wrong.config).servers[0].scope
    assert right_scope != wrong_scope and right_scope.startswith("mcp:tracker:")

    async def create_and_leave():
        async with right.client() as client:
            created = await client.call_tool("create_issue", {"title": "a"})
            assert created.structured_content["number"] == 1

    anyio.run(create_and_leave)
    session = eventually(lambda: Session.objects.filter(org=acme.org, state="completed").first())
    assert right.admin.http.post(f"/api/v1/sessions/{session.pk}/undo").status_code == 200
    entry = eventually(lambda: UndoEntry.objects.filter(session=session, claim_deadline__isnull=False).first())
    assert entry.fn.fn_name == "mcp.tracker.close_issue" and entry.fn.scope == right_scope

    # The wrong gateway's claim, and a claim naming no upstream (an SDK process of this agent),
    # get nothing: the entry waits for the gateway that serves its upstream.
    assert claim(server, acme.key, scopes=[wrong_scope]).json() == {"entries": []}
    assert claim(server, acme.key).json() == {"entries": []}

    # The wrong gateway is refused at start, saying why and how to tell the two apart.
    refused = subprocess.run([sys.executable, "-m", "undolog", "gateway", "--config", str(wrong.config)],
                             env=wrong.env(), cwd=BASE_DIR, stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 1, refused.stderr
    assert "mcp.tracker.close_issue@1.0.0 is served by the upstream" in refused.stderr
    assert right_scope in refused.stderr and "identity" in refused.stderr

    async def serve_the_undo():
        async with right.client():
            with anyio.fail_after(30):
                while right.tracker.read()["closed"] != [1]:
                    await anyio.sleep(0.05)

    anyio.run(serve_the_undo)
    assert eventually(lambda: Session.objects.get(pk=session.pk).state == "compensated")
    assert right.tracker.calls("close_issue") == [["close_issue", {"number": 1}]]
    assert wrong_truth.calls("close_issue") == []
    assert UndoEntry.objects.get(pk=entry.pk).state == "compensated"


def test_a_scoped_function_keeps_its_scope_and_a_tool_keeps_its_upstream(acme, server):
    agent = {"Authorization": f"Bearer {acme.key}"}

    def register(scope: str | None, name: str = "undo_ledger") -> httpx.Response:
        body = {"fn_name": name, "fn_version": "1.0.0", "handler": "agent", **({"scope": scope} if scope else {})}
        return httpx.post(f"{server}/api/v1/compensations", json=body, headers=agent, timeout=10)

    def tool(fn_name: str) -> httpx.Response:
        spec = {"name": "remove_item", "tier": "compensable",
                "compensation": {"fn_name": fn_name, "fn_version": "1.0.0", "args": {}}}
        return httpx.post(f"{server}/api/v1/tools", json={"tools": [spec]}, headers=agent, timeout=10)

    assert register("ledger-a").status_code == 201
    assert register("ledger-a").status_code == 200  # the same upstream again: fine
    for other in ("ledger-b", None):  # another upstream, or none (it would widen who may claim)
        refused = register(other)
        assert refused.status_code == 409
        assert refused.json()["error"] == "compensation_scope_conflict"
        assert refused.json()["scope"] == "ledger-a"
    assert register("ledger-b", "undo_ledger_b").status_code == 201

    assert tool("undo_ledger").status_code == 200
    moved = tool("undo_ledger_b")
    assert moved.status_code == 409 and moved.json()["error"] == "tool_scope_conflict"
    listed = httpx.get(f"{server}/api/v1/tools", headers=agent, timeout=10).json()["tools"]
    assert [t["compensation"]["fn_name"] for t in listed if t["name"] == "remove_item"] == ["undo_ledger"]

    webhook = {"fn_name": "undo_mail", "fn_version": "1.0.0", "handler": "webhook",
               "target": "https://example.com/undo", "scope": "x"}
    bad = httpx.post(f"{server}/api/v1/compensations", json=webhook, headers=agent, timeout=10)
    assert bad.status_code == 400 and "scope" in bad.json()["fields"]
