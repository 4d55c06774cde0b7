"""A minimal in-memory MCP server for bench.gateway: no file I/O, so the timings measure the
hops, not the upstream. `list_issues` is read-only; `create_issue` / `close_issue` change a dict."""

from __future__ import annotations

import json

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

ISSUES: dict[int, str] = {}
OBJ = {"type": "object"}


async def list_tools(ctx, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[
        types.Tool(name="list_issues", input_schema=OBJ, annotations=types.ToolAnnotations(read_only_hint=True)),
        types.Tool(name="create_issue", input_schema=OBJ,
                   annotations=types.ToolAnnotations(destructive_hint=False, open_world_hint=False)),
        types.Tool(name="close_issue", input_schema=OBJ, annotations=types.ToolAnnotations(idempotent_hint=True)),
    ])


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    if params.name == "list_issues":
        value: dict = {"open": len(ISSUES)}
    elif params.name == "create_issue":
        number = len(ISSUES) + 1
        ISSUES[number] = "open"
        value = {"number": number}
    else:
        ISSUES[int((params.arguments or {}).get("number", 0))] = "closed"
        value = {"closed": True}
    return types.CallToolResult(content=[types.TextContent(text=json.dumps(value))], structured_content=value)


async def main() -> None:
    server = Server("bench-upstream", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
