"""A stdio MCP server with one read-only tool, ``environment``, answering the environment it was
started with: what an upstream the gateway spawns can read of the gateway's secrets."""

from __future__ import annotations

import json
import os

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server

TOOL = types.Tool(name="environment", description="The environment this server was started with.",
                  input_schema={"type": "object"}, annotations=types.ToolAnnotations(read_only_hint=True))


async def list_tools(ctx, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[TOOL])


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=json.dumps(dict(os.environ)))])


server = Server("envdump", on_list_tools=list_tools, on_call_tool=call_tool)


def main() -> None:
    from mcp.server.stdio import stdio_server

    async def run() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(run)


if __name__ == "__main__":
    main()
