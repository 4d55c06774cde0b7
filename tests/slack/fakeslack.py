"""A local fake of Slack's Web API: a real HTTP server on 127.0.0.1 that slack-sdk's WebClient
talks to (its `base_url` pointed here). It answers chat.postMessage, chat.postEphemeral, chat.update,
users.info, views.open and an interaction's response_url as Slack does, checks the bot token,
and records every call."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


@dataclass
class SlackCall:
    method: str
    args: dict
    token: str


class FakeSlack:
    def __init__(self, token: str) -> None:
        self.token = token
        self.users: dict[str, dict] = {}  # Slack user id → users.info's `user`
        self.calls: list[SlackCall] = []
        self.arrived = threading.Condition()
        self.seq = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/api/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def response_url(self) -> str:
        """Where an interaction's replies go (Slack gives one per payload)."""
        return f"http://127.0.0.1:{self.server.server_address[1]}/actions/respond"

    def called(self, method: str) -> list[SlackCall]:
        return [c for c in self.calls if c.method == method]

    def wait_for(self, method: str, n: int = 1, timeout: float = 15) -> list[SlackCall]:
        deadline = time.monotonic() + timeout
        with self.arrived:
            while len(self.called(method)) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"Slack got {len(self.called(method))} {method} calls, not {n}: "
                                         f"{[c.method for c in self.calls]}")
                self.arrived.wait(left)
        return self.called(method)

    def answer(self, call: SlackCall) -> dict:
        if call.method == "respond":  # an interaction's response_url: no token, the URL is the secret
            return {"ok": True}
        if call.token != self.token:
            return {"ok": False, "error": "invalid_auth"}
        if call.method == "chat.postMessage":
            self.seq += 1
            return {"ok": True, "channel": "C0FAKE", "ts": f"1700000000.{self.seq:06d}", "message": call.args}
        if call.method == "chat.postEphemeral":
            return {"ok": True, "message_ts": "1700000000.999999"}
        if call.method == "chat.update":
            return {"ok": True, "channel": call.args.get("channel"), "ts": call.args.get("ts")}
        if call.method == "users.info":
            user = self.users.get(call.args.get("user", ""))
            return {"ok": True, "user": user} if user else {"ok": False, "error": "user_not_found"}
        if call.method == "views.open":
            return {"ok": True, "view": {"id": "V0FAKE", **call.args.get("view", {})}}
        return {"ok": False, "error": "unknown_method"}

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                url = urlparse(self.path)
                method = url.path.rsplit("/", 1)[-1]
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if "json" in (self.headers.get("Content-Type") or ""):
                    args = json.loads(raw or b"{}")
                else:
                    args = {k: v[0] for k, v in parse_qs(raw.decode() or url.query).items()}
                token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                call = SlackCall(method, args, token)
                answer = json.dumps(fake.answer(call)).encode()
                with fake.arrived:
                    fake.calls.append(call)
                    fake.arrived.notify_all()
                self.send_response(200)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def log_message(self, *args) -> None:
                pass

        return Handler
