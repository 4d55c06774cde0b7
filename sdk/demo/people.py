"""The people of the demo org on the REST API, with their user tokens: the admin who sets
the budget and resumes the agent, and the reviewer alice who decides on approvals."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx


class Person:
    def __init__(self, url: str, token: str, org: str) -> None:
        # X-Undolog-Org: on a server of `make run`, admin belongs to the tour's org `demo` too.
        self.http = httpx.Client(base_url=url, timeout=10, headers={
            "Authorization": f"Token {token}", "X-Undolog-Org": org})

    def _json(self, response: httpx.Response) -> dict[str, Any]:
        if response.is_error:
            raise RuntimeError(f"{response.request.method} {response.request.url.path}: "
                               f"{response.status_code} {response.text[:300]}")
        return response.json()

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        return self._json(self.http.get(path, params=params))

    def post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._json(self.http.post(path, json=body or {}))

    def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._json(self.http.patch(path, json=body))

    def refusals(self, session_id: str) -> list[dict[str, Any]]:
        rows = self.get("/api/v1/refusals", session=session_id)["refusals"]
        return sorted(rows, key=lambda r: r["created"])

    def close(self) -> None:
        self.http.close()


class Reviewer(threading.Thread):
    """Alice, deciding the requests of one session as they arrive: `answers` in order,
    each ("approve", None) or ("reject", reason)."""

    def __init__(self, person: Person, answers: list[tuple[str, str | None]],
                 say: Callable[[str], None]) -> None:
        super().__init__(daemon=True)
        self.person, self.answers, self.say = person, list(answers), say
        self.session_id: str | None = None
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        seen: set[str] = set()
        try:
            while self.answers and not self.stopping.is_set():
                for request in self.person.get("/api/v1/approvals", state="pending")["approvals"]:
                    if request["session"] == self.session_id and request["id"] not in seen:
                        seen.add(request["id"])
                        self.decide(request, *self.answers.pop(0))
                        break
                else:
                    time.sleep(0.1)
        except BaseException as exc:
            self.error = exc

    def decide(self, request: dict[str, Any], verb: str, reason: str | None) -> None:
        answer = "approve" if verb == "approve" else "deny"
        self.say(f"  reviewer asked: {request['tool']}({request['proposed_args']}) -> {answer}")
        self.person.post(f"/api/v1/approvals/{request['id']}/{verb}", {"reason": reason or ""})

    def stop(self) -> None:
        self.stopping.set()
        if self.ident is not None:  # started (the session may have failed to open first)
            self.join(10)
        if self.error is not None:
            raise self.error
