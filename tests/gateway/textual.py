"""A stdio MCP server that answers in text only, as many npm servers do (prose, or JSON
pretty-printed into a text block, never ``structuredContent``). ``environment`` answers the
environment it was started with (what an upstream the gateway spawns can read of the gateway's
secrets); ``add_note``/``remove_note`` answer prose, ``add_item``/``remove_item`` indented JSON.
State is the process's own (it lives as long as the gateway that started it)."""

from __future__ import annotations

import json
import os

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server

OBJ = {"type": "object"}
TOOLS = [
    types.Tool(name="environment", description="The environment this server was started with.", input_schema=OBJ,
               annotations=types.ToolAnnotations(read_only_hint=True)),
    types.Tool(name="add_note", description="Add a note.", input_schema=OBJ),
    types.Tool(name="remove_note", description="Remove a note.", input_schema=OBJ),
    types.Tool(name="add_item", description="Add an item.", input_schema=OBJ),
    types.Tool(name="remove_item", description="Remove an item.", input_schema=OBJ),
]
NOTES: list[str] = []
ITEMS: dict[str, dict] = {}


def text(value: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=value)])


async def list_tools(ctx, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    name, args = params.name, dict(params.arguments or {})
    if name == "environment":
        return text(json.dumps(dict(os.environ)))
    if name == "add_note":
        NOTES.append(args["text"])
        return text(f"Added note {len(NOTES)}: {args['text']}")
    if name == "remove_note":
        NOTES[:] = [note for note in NOTES if note != args["text"]]
        return text("Removed.")
    if name == "add_item":
        ITEMS[args["name"]] = {"name": args["name"], "position": len(ITEMS) + 1}
        return text(json.dumps(ITEMS[args["name"]], indent=2))
    if name == "remove_item":
        ITEMS.pop(args["name"], None)
        return text("{}")
    return types.CallToolResult(content=[types.TextContent(text=f"unknown tool {name}")], is_error=True)


server = Server("textual", on_list_tools=list_tools, on_call_tool=call_tool)


def main() -> None:
    from mcp.server.stdio import stdio_server

    async def run() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(run)


if __name__ == "__main__":
    main()
