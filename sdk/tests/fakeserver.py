"""An in-memory stand-in for the undolog API contract (DESIGN.md), for unit tests.

It implements just enough of the answers table to drive the SDK's flows through
``httpx.MockTransport``; the real server's behaviour is tested in the main suite.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class FakeServer:
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    effects: dict[str, dict[str, Any]] = field(default_factory=dict)
    by_signature: dict[str, str] = field(default_factory=dict)
    # tool name -> (state after the first long poll, extra fields such as reason)
    decisions: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    # intercept body -> an error answer (status, body), or None to go on as usual
    refuse: Callable[[dict[str, Any]], tuple[int, dict[str, Any]] | None] = lambda body: None
    forbid: bool = False  # when set, any request fails the test

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)

    def bodies(self, suffix: str) -> list[Any]:
        return [body for _, path, body in self.requests if path.endswith(suffix)]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert not self.forbid, f"unexpected request {request.method} {request.url}"
        body = json.loads(request.content) if request.content else None
        path = request.url.path
        self.requests.append((request.method, path, body))
        assert request.headers["Authorization"] == "Bearer test-key"
        for method, pattern, handler in ROUTES:
            match = re.fullmatch(pattern, path)
            if match and method == request.method:
                status, answer = handler(self, body, request, *match.groups())
                return httpx.Response(status, json=answer)
        return httpx.Response(404, json={"error": "not_found", "message": path})

    # -- handlers -------------------------------------------------------------------

    def register(self, body: Any, request: httpx.Request) -> tuple[int, Any]:
        for tool in body["tools"]:
            self.tools[tool["name"]] = tool
        return 200, {"tools": body["tools"]}

    def compensation(self, body: Any, request: httpx.Request) -> tuple[int, Any]:
        return 201, body

    def open_session(self, body: Any, request: httpx.Request) -> tuple[int, Any]:
        sid = str(uuid.uuid4())
        self.sessions[sid] = {"id": sid, "agent": body["agent"], "state": "running",
                              "step_index": 0}
        return 201, self.sessions[sid]

    def get_session(self, body: Any, request: httpx.Request, sid: str) -> tuple[int, Any]:
        session = self.sessions[sid]
        if session["state"] in ("failed", "compensating"):
            # The fake's undo walk advances one state per look.
            session["state"] = {"failed": "compensating", "compensating": "compensated"}[
                session["state"]]
        return 200, session

    def close_session(self, body: Any, request: httpx.Request, sid: str,
                      verb: str) -> tuple[int, Any]:
        session = self.sessions[sid]
        allowed = {"complete": {"running"}, "fail": {"running", "awaiting_approval", "halted"}}
        if session["state"] not in allowed[verb]:
            return 409, {"error": "session_not_running", "message": "not running",
                         "state": session["state"]}
        session["state"] = {"complete": "completed", "fail": "failed"}[verb]
        return 200, {"session": session}

    def intercept(self, body: Any, request: httpx.Request, sid: str) -> tuple[int, Any]:
        tool = self.tools.get(body["tool"])
        session = self.sessions[sid]
        session["step_index"] = max(session["step_index"], body["step_index"])
        refusal = self.refuse(body)
        if refusal is not None:
            return refusal
        if tool is None:
            return 404, {"error": "tool_not_registered", "message": f"unknown {body['tool']}"}
        signature = body.get("idempotency_key") or json.dumps([sid, body["tool"], body["args"]],
                                                              sort_keys=True)
        if signature in self.by_signature:
            return 200, {"decision": "replay", "effect": self.effects[self.by_signature[signature]]}
        effect = {"id": str(uuid.uuid4()), "tool": body["tool"], "step_index": body["step_index"],
                  "call_signature": signature, "args": body["args"], "result": None, "error": None}
        self.effects[effect["id"]] = effect
        self.by_signature[signature] = effect["id"]
        if tool["tier"] == "compensable":
            effect["state"] = "executing"
            return 201, {"decision": "execute", "effect": effect}
        effect["state"] = "pending"
        self.sessions[sid]["state"] = "awaiting_approval"
        return 202, {"decision": "await_approval", "effect": effect,
                     "approval": {"id": str(uuid.uuid4()), "timeout_at": "2030-01-01T00:00:00Z"}}

    def get_effect(self, body: Any, request: httpx.Request, eid: str) -> tuple[int, Any]:
        effect = self.effects[eid]
        decision = self.decisions.get(effect["tool"])
        if effect["state"] == "pending" and decision is not None:
            state, extra = decision
            effect.update(state=state, **extra)
            for session in self.sessions.values():
                if session["state"] == "awaiting_approval":
                    session["state"] = "running" if state == "approved" else "halted"
        return 200, {"effect": effect}

    def start_effect(self, body: Any, request: httpx.Request, eid: str) -> tuple[int, Any]:
        effect = self.effects[eid]
        if effect["state"] != "approved":
            return 409, {"error": "effect_state_conflict", "state": effect["state"],
                         "message": f"The effect is {effect['state']}; it cannot become executing."}
        effect["state"] = "executing"
        return 200, {"effect": effect}

    def settle_effect(self, body: Any, request: httpx.Request, eid: str,
                      verb: str) -> tuple[int, Any]:
        effect = self.effects[eid]
        if effect["state"] not in ("executing", "approved"):
            return 409, {"error": "effect_state_conflict", "message": effect["state"],
                         "state": effect["state"]}
        if verb == "commit":
            effect.update(state="committed", result=body["result"])
        else:
            effect.update(state="failed", error=body["error"])
        return 200, {"effect": effect}


UUID = r"([0-9a-f-]+)"
ROUTES = [
    ("POST", r"/api/v1/tools", FakeServer.register),
    ("POST", r"/api/v1/compensations", FakeServer.compensation),
    ("POST", r"/api/v1/sessions", FakeServer.open_session),
    ("GET", rf"/api/v1/sessions/{UUID}", FakeServer.get_session),
    ("POST", rf"/api/v1/sessions/{UUID}/(complete|fail)", FakeServer.close_session),
    ("POST", rf"/api/v1/sessions/{UUID}/intercept", FakeServer.intercept),
    ("GET", rf"/api/v1/effects/{UUID}", FakeServer.get_effect),
    ("POST", rf"/api/v1/effects/{UUID}/start", FakeServer.start_effect),
    ("POST", rf"/api/v1/effects/{UUID}/(commit|fail)", FakeServer.settle_effect),
]
