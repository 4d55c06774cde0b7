"""MCP annotations to tiers, and ``undolog mcp-import`` against a real stdio MCP server."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from undolog import CompensationDescriptor, ToolTier
from undolog.cli import main
from undolog.mcp import effective_hints, spec_for, tier_for

SAFE, COMP, IRR = ToolTier.SAFE, ToolTier.COMPENSABLE, ToolTier.IRREVERSIBLE
UNDO = CompensationDescriptor.new("undo_it")


def tool(name: str = "t", **hints: Any) -> dict[str, Any]:
    return {"name": name, "annotations": hints or None}


@pytest.mark.parametrize(("hints", "trusted", "compensation", "also", "tier"), [
    ({}, True, None, (), IRR),                                   # no hints: destructive, open world
    ({}, True, UNDO, (), COMP),
    ({"readOnlyHint": True}, True, None, (), SAFE),
    ({"readOnlyHint": True}, False, None, (), IRR),              # untrusted read-only is not enough
    ({"readOnlyHint": True}, False, UNDO, (), COMP),
    ({"readOnlyHint": True}, True, None, ("t",), IRR),           # also= wins
    ({"readOnlyHint": True, "destructiveHint": True}, True, None, (), SAFE),
    ({"destructiveHint": True, "idempotentHint": True}, True, None, (), IRR),
    ({"destructiveHint": True}, True, UNDO, (), COMP),
    ({"destructiveHint": False, "openWorldHint": True}, True, None, (), IRR),   # an email
    ({"destructiveHint": False}, True, UNDO, (), COMP),
    ({"destructiveHint": False, "openWorldHint": False}, True, None, (), IRR),  # no undo known
    ({"destructiveHint": False, "openWorldHint": False}, True, UNDO, (), COMP),
    ({"destructiveHint": True}, True, UNDO, ("t",), IRR),
])
def test_tier_for_follows_the_documented_table(hints: dict, trusted: bool, compensation: Any,
                                               also: tuple, tier: ToolTier) -> None:
    assert tier_for(tool(**hints), trusted=trusted, also=also, compensation=compensation) is tier


def test_tier_for_reads_mcp_objects_of_either_major_version() -> None:
    v1 = SimpleNamespace(name="t", annotations=SimpleNamespace(readOnlyHint=True))
    v2 = SimpleNamespace(name="t", annotations=SimpleNamespace(read_only_hint=True))
    bare = SimpleNamespace(name="t", annotations=None)
    assert tier_for(v1, trusted=True) is SAFE
    assert tier_for(v2, trusted=True) is SAFE
    assert tier_for(bare, trusted=True) is IRR
    assert effective_hints(bare) == {"readOnlyHint": False, "destructiveHint": True,
                                     "idempotentHint": False, "openWorldHint": True}


def test_an_irreversible_import_takes_its_reason_from_the_description() -> None:
    mcp_tool = {"name": "delete_account", "description": "Permanently delete an account.\nMore.",
                "annotations": {"destructiveHint": True}}
    spec, found = spec_for(mcp_tool, trusted=True, cost_weight=5.0)
    assert spec.to_dict() == {
        "name": "delete_account", "tier": "irreversible", "cost_weight": 5.0,
        "description": "Permanently delete an account.\nMore.",
        "approval": {"reason": "Permanently delete an account.",
                     "risk_tags": ["mcp", "destructive", "open-world"], "estimated_impact": ""},
        "annotations": {"destructiveHint": True},
        "labels": ["external"]}  # open world by MCP's default: it reaches outside
    assert found.why == "destructive"
    nameless, _ = spec_for({"name": "zap"})
    assert nameless.approval.reason.startswith("MCP tool zap")


OPS_SERVER = textwrap.dedent('''
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    server = MCPServer(name="ops")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def list_inactive_accounts() -> list[str]:
        """IDs of accounts with no login for 12 months."""
        return []

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True))
    async def delete_account(account_id: str) -> str:
        """Permanently delete an account and its data. This cannot be undone."""
        return account_id

    @server.tool(annotations=ToolAnnotations(destructive_hint=False, open_world_hint=True))
    async def email_owner(account_id: str, message: str) -> str:
        """Email the account owner. A sent email can't be recalled."""
        return account_id

    if __name__ == "__main__":
        server.run()
''')


@pytest.fixture
def ops_server(tmp_path: Path) -> list[str]:
    import mcp.server.mcpserver  # noqa: F401  (the mcp extra is part of the dev install)
    path = tmp_path / "ops_server.py"
    path.write_text(OPS_SERVER)
    return [sys.executable, str(path)]


@pytest.fixture
def undolog_api() -> Any:
    """A throwaway HTTP server that records what the CLI registers."""
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append({"path": self.path, "auth": self.headers["Authorization"], **body})
            payload = json.dumps({"tools": body["tools"]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None: ...

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}", received
    httpd.shutdown()


def test_mcp_import_registers_the_servers_tools(ops_server: list[str], undolog_api: Any,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    url, received = undolog_api
    code = main(["mcp-import", "--trusted", "--also", "email_owner", "--cost-weight", "5",
                 "--url", url, "--api-key", "k", "--", *ops_server])
    assert code == 0
    [request] = received
    assert (request["path"], request["auth"]) == ("/api/v1/tools", "Bearer k")
    tiers = {t["name"]: (t["tier"], t["cost_weight"]) for t in request["tools"]}
    assert tiers == {"list_inactive_accounts": ("safe", 1.0),
                     "delete_account": ("irreversible", 5.0),
                     "email_owner": ("irreversible", 5.0)}
    delete = next(t for t in request["tools"] if t["name"] == "delete_account")
    assert delete["approval"]["reason"] == ("Permanently delete an account and its data. "
                                            "This cannot be undone.")
    assert delete["annotations"] == {"destructiveHint": True, "idempotentHint": True}
    out = capsys.readouterr().out
    assert "delete_account" in out and "listed in also=" in out and "3 tools, registered" in out


def test_mcp_import_of_an_untrusted_server_makes_nothing_safe(
        ops_server: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mcp-import", "--dry-run", "--", *ops_server]) == 0
    out = capsys.readouterr().out
    assert "safe" not in out.split("why", 1)[1].replace("untrusted", "")
    assert "claims read-only, untrusted server" in out and "dry run" in out


def test_mcp_import_needs_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mcp-import", "--trusted"]) == 2
    assert "after --" in capsys.readouterr().err


def test_mcp_import_reports_a_server_that_dies(capsys: pytest.CaptureFixture[str]) -> None:
    import mcp  # noqa: F401
    assert main(["mcp-import", "--dry-run", "--", sys.executable, "-c", "raise SystemExit(3)"]) == 1
    assert "could not list the tools of the MCP server" in capsys.readouterr().err
