"""A stdio upstream sees what its TOML entry lists and a minimal base of the gateway's
environment, never the gateway's own secrets (issue 37): the gateway runs as an HTTP service
with client tokens, and the upstream dumps the environment it was started with."""

from __future__ import annotations

import json
import sys

import anyio
import pytest

from tests.gateway.conftest import TOKENS, http_gateway, mcp_over_http
from tests.processes import BASE_DIR

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_a_stdio_upstream_gets_its_listed_env_and_a_base_never_the_gateways_secrets(
        harness, monkeypatch):
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("SOME_OTHER_SECRET", "other-secret-value-123")
    monkeypatch.setenv("ENVDUMP_SOURCE_TOKEN", "listed-token-value-456")
    gateway = harness(extra=f"""
[servers.textual]
command = {json.dumps([sys.executable, "-m", "tests.gateway.textual"])}
cwd = {json.dumps(str(BASE_DIR))}
trusted = true
env = {{ ENVDUMP_TOKEN = "${{ENVDUMP_SOURCE_TOKEN}}", MODE = "test" }}
""")

    async def scenario():
        with http_gateway(gateway) as (url, _):
            async with mcp_over_http(url, TOKENS["ana"], mode="legacy") as client:
                result = await client.call_tool("environment", {})
                return json.loads(result.content[0].text)

    seen = anyio.run(scenario)

    assert seen["ENVDUMP_TOKEN"] == "listed-token-value-456" and seen["MODE"] == "test"  # what it lists
    assert seen["PATH"] and seen["HOME"] and seen["LANG"] == "C.UTF-8"  # the base
    values = set(seen.values())
    for secret in (*TOKENS.values(), gateway.persona.key, "other-secret-value-123"):
        assert secret not in values
    assert not [name for name in seen if name.startswith("UNDOLOG_") or name.endswith("_GATEWAY_TOKEN")]
    assert "SOME_OTHER_SECRET" not in seen and "DATABASE_URL" not in seen
