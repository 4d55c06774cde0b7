"""``undolog gateway``: an MCP server in front of other MCP servers, so any MCP client gets
tiers, approvals, budgets and undo without changing a line (needs the ``[mcp]`` extra).

    undolog gateway --config undolog-gateway.toml            # stdio (a desktop client spawns it)
    undolog gateway --config undolog-gateway.toml --http 127.0.0.1:8765

See ``config`` for the TOML, ``core`` for what happens to each call.
"""

from __future__ import annotations

from .config import ConfigError, GatewayConfig, load_config, parse_config
from .core import FAIL_RUN, FINISH_RUN, RUN_ARG, START_RUN, Gateway

__all__ = [
    "FAIL_RUN",
    "FINISH_RUN",
    "RUN_ARG",
    "START_RUN",
    "ConfigError",
    "Gateway",
    "GatewayConfig",
    "load_config",
    "parse_config",
    "run",
]


def run(config_path: str, http: str | None = None) -> None:
    """Start the gateway (blocks): stdio, or streamable HTTP at ``HOST:PORT``."""
    import anyio

    from .logs import configure
    from .server import check_bind, serve_http, serve_stdio

    configure()  # LOG_FORMAT / LOG_LEVEL, as for the undolog server; to stderr
    config = load_config(config_path)
    if http:
        host, _, port = http.rpartition(":")
        host = host or "127.0.0.1"
        check_bind(host, config.clients)  # before any upstream is started
        anyio.run(serve_http, Gateway(config), host, int(port))
    else:
        anyio.run(serve_stdio, Gateway(config))
