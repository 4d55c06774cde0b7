"""A small issue tracker served over MCP: the real upstream of the gateway tests.

State lives in a JSON file (``TRACKER_STATE``), so a test reads what really happened:
the issues, the order issues were closed in, and every call the tracker received.
``python -m tests.gateway.tracker`` serves stdio; ``--http PORT`` serves streamable HTTP.
A title starting with "slow" makes create_issue write the issue, then hang (so a test can
kill the gateway mid-call); closing an issue titled "lingering…" answers a second after it is
closed (so a test can leave while an undo is in flight). ``enable_labels`` adds a tool and
says so (tools/list_changed).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from mcp.server.lowlevel import NotificationOptions, Server

STATE = Path(os.environ.get("TRACKER_STATE", "tracker-state.json"))


@contextmanager
def state():
    """Read-modify-write under a file lock: the stdio and HTTP servers may share one file."""
    with open(STATE.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(STATE.read_text()) if STATE.exists() else {}
        data.setdefault("issues", {}), data.setdefault("closed", []), data.setdefault("calls", [])
        data.setdefault("labels", False)
        yield data
        temporary = STATE.with_suffix(".tmp")
        temporary.write_text(json.dumps(data))
        temporary.replace(STATE)  # readers (the test) never see half a file


def hints(**kw: bool) -> types.ToolAnnotations:
    return types.ToolAnnotations(**kw)


OBJ = {"type": "object"}
NUMBER = {"type": "object", "properties": {"number": {"type": "integer"}}, "required": ["number"]}


def tools(labels: bool) -> list[types.Tool]:
    found = [
        types.Tool(name="list_issues", description="List open issues.", input_schema=OBJ,
                   annotations=hints(read_only_hint=True)),
        types.Tool(name="create_issue", description="Create an issue.",
                   input_schema={"type": "object", "properties": {"title": {"type": "string"}}},
                   annotations=hints(read_only_hint=False, destructive_hint=False, open_world_hint=False)),
        types.Tool(name="close_issue", description="Close an issue (closing a closed one is fine).",
                   input_schema=NUMBER, annotations=hints(destructive_hint=False, idempotent_hint=True)),
        types.Tool(name="delete_issue", description="Delete an issue for good.", input_schema=NUMBER,
                   annotations=hints(destructive_hint=True)),
        types.Tool(name="enable_labels", description="Turn on labels.", input_schema=OBJ),
    ]
    if labels:
        found.append(types.Tool(name="label_issue", description="Label an issue.", input_schema=NUMBER))
    return found


def ok(value: Any) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=json.dumps(value))], structured_content=value)


def fail(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


async def list_tools(ctx, params) -> types.ListToolsResult:
    with state() as data:
        return types.ListToolsResult(tools=tools(data["labels"]))


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    name, args = params.name, dict(params.arguments or {})
    with state() as data:
        data["calls"].append([name, args])
        issues = data["issues"]
        if name == "list_issues":
            return ok({"issues": [i for i in issues.values() if i["state"] == "open"]})
        if name == "create_issue":
            number = len(issues) + 1
            issues[str(number)] = {"number": number, "title": args.get("title", ""), "state": "open"}
            result = {"number": number, "title": args.get("title", "")}
        elif name in ("close_issue", "delete_issue", "label_issue"):
            issue = issues.get(str(args.get("number")))
            if issue is None:
                return fail(f"no issue {args.get('number')}")
            if name == "close_issue" and issue["state"] != "closed":
                issue["state"] = "closed"
                data["closed"].append(issue["number"])
            if name == "delete_issue":
                del issues[str(issue["number"])]
            result = {"number": issue["number"], "state": issue["state"] if name != "delete_issue" else "deleted"}
            lingering = name == "close_issue" and issue["title"].startswith("lingering")
        elif name == "enable_labels":
            data["labels"] = True
            result = {"labels": True}
        else:
            return fail(f"unknown tool {name}")
    if name == "enable_labels":
        await ctx.session.send_tool_list_changed()
    if name == "close_issue" and lingering:
        await anyio.sleep(1)  # closed already (the state file says so) but not yet answered
    if name == "create_issue" and result["title"].startswith("slow"):
        await anyio.sleep(60)  # the test kills the gateway meanwhile
    return ok(result)


server = Server("tracker", on_list_tools=list_tools, on_call_tool=call_tool)


def main() -> None:
    if "--http" in sys.argv:
        import uvicorn

        port = int(sys.argv[sys.argv.index("--http") + 1])
        app = server.streamable_http_app()
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
        return
    from mcp.server.stdio import stdio_server

    with state() as data:  # who spawned us: the gateway (a test kills it mid-call)
        data.setdefault("parents", []).append(os.getppid())

    async def run() -> None:
        async with stdio_server() as (read, write):
            options = server.create_initialization_options(notification_options=NotificationOptions(tools_changed=True))
            await server.run(read, write, options)

    anyio.run(run)


if __name__ == "__main__":
    main()
