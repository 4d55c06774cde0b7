"""The ``undolog`` command.

    undolog gateway [--config undolog-gateway.toml] [--http HOST:PORT]
    undolog mcp-import [--trusted] [--also NAME ...] [--cost-weight W]
                       [--safe-cost-weight W] [--dry-run] [--url URL] [--api-key KEY]
                       -- <command that starts an MCP server over stdio>
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from ._version import __version__
from .errors import UndoLogError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after "--" is the MCP server's command line, options and all.
    ours, command = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    args = _parser().parse_args(ours)
    if args.command == "gateway":
        return _gateway(args)
    if args.command != "mcp-import":
        _parser().print_help()
        return 2
    if not command:
        print("undolog mcp-import: give the MCP server command after --", file=sys.stderr)
        return 2
    try:
        return _mcp_import(args, command)
    except (UndoLogError, RuntimeError, ValueError, OSError) as exc:
        print(f"undolog mcp-import: {exc}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="undolog", description="undolog command line")
    parser.add_argument("--version", action="version", version=f"undolog {__version__}")
    sub = parser.add_subparsers(dest="command")
    mcp = sub.add_parser("mcp-import", help="register an MCP server's tools with undolog",
                         description="List the tools of an MCP server (started over stdio), "
                                     "tier them from their annotations, register them.")
    mcp.add_argument("--trusted", action="store_true",
                     help="believe the server's readOnlyHint (read-only tools become SAFE)")
    mcp.add_argument("--also", nargs="+", action="extend", default=[], metavar="NAME",
                     help="tools to treat as IRREVERSIBLE whatever their hints")
    mcp.add_argument("--cost-weight", type=float, default=1.0,
                     help="cost weight of the tools that reach the server (default 1.0)")
    mcp.add_argument("--safe-cost-weight", type=float, default=1.0,
                     help="cost weight of SAFE tools (default 1.0)")
    mcp.add_argument("--dry-run", action="store_true", help="print the table, register nothing")
    mcp.add_argument("--url", help="server URL (default $UNDOLOG_URL)")
    mcp.add_argument("--api-key", help="agent key (default $UNDOLOG_API_KEY)")
    gateway = sub.add_parser(
        "gateway", help="serve MCP in front of other MCP servers, through undolog",
        description="An MCP server that fronts the upstream MCP servers named in "
                    "its config: every call is tiered, approved, budgeted and "
                                         "undoable through undolog.")
    gateway.add_argument("--config", default="undolog-gateway.toml", help="the gateway's TOML file")
    gateway.add_argument("--http", metavar="HOST:PORT",
                         help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio")
    return parser


def _gateway(args: argparse.Namespace) -> int:
    try:
        from .gateway import ConfigError, run
    except ImportError as exc:
        print(f"undolog gateway needs the mcp package: pip install 'undolog[mcp]' ({exc})",
              file=sys.stderr)
        return 1
    try:
        run(args.config, args.http)
    except (ConfigError, UndoLogError, ValueError, OSError) as exc:
        print(f"undolog gateway: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


def _mcp_import(args: argparse.Namespace, command: list[str]) -> int:
    from .mcp import list_mcp_tools, spec_for

    tools = asyncio.run(list_mcp_tools(command))
    rows = [spec_for(t, trusted=args.trusted, also=args.also, cost_weight=args.cost_weight,
                     safe_cost_weight=args.safe_cost_weight) for t in tools]
    unknown = set(args.also) - {spec.name for spec, _ in rows}
    if unknown:
        print(f"warning: --also names no tool of this server: {sorted(unknown)}", file=sys.stderr)
    if not rows:
        print("the MCP server lists no tools; nothing to register")
        return 0
    if not args.dry_run:
        from .client import UndoLogClient

        with UndoLogClient(args.url, args.api_key) as client:
            client.register([spec for spec, _ in rows])
    print(render_table(rows))
    where = "dry run: nothing registered" if args.dry_run else "registered"
    print(f"\n{len(rows)} tools, {where}")
    return 0


def render_table(rows: Sequence[tuple[Any, Any]]) -> str:
    """name | tier | weight | hints | why, one line per tool."""
    lines = [("tool", "tier", "weight", "hints", "why")]
    for spec, found in rows:
        hints = " ".join(_shown_hints(found.hints)) or "-"
        lines.append((spec.name, spec.tier.value, f"{spec.cost_weight:g}", hints, found.why))
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line[:4], widths, strict=True)) + "  " + line[4]
        for line in lines)


def _shown_hints(hints: dict[str, bool]) -> list[str]:
    """Effective hints; MCP says destructive/idempotent mean nothing for a read-only tool."""
    ignored = {"destructiveHint", "idempotentHint"} if hints.get("readOnlyHint") else set()
    return [k.removesuffix("Hint") for k, v in hints.items() if v and k not in ignored]


if __name__ == "__main__":
    sys.exit(main())
