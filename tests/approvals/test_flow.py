"""End to end over real HTTP (uvicorn), with a real Celery worker and beat on the real broker:
an irreversible call held, decided by a person or by its deadline, and the waiting caller told."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest
from effects.models import Effect, Session
from orgs.models import Event
from tests.approvals.conftest import irreversible, register
from tests.conftest import Persona, eventually, make_persona, register_standard_tools

pytestmark = pytest.mark.django_db(transaction=True)


class Http:
    """The agent's and the reviewer's HTTP clients against the real server."""

    def __init__(self, base: str, persona: Persona) -> None:
        token = persona.reviewer.user.auth_token.key
        self.agent = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {persona.key}"}, timeout=30)
        self.reviewer = httpx.Client(base_url=base, headers={"Authorization": f"Token {token}"}, timeout=30)

    def open_session(self) -> str:
        response = self.agent.post("/api/v1/sessions", json={"agent": "cleanup"})
        assert response.status_code == 201, response.text
        return response.json()["id"]

    def intercept(self, session: str, tool: str, args: dict, step: int) -> httpx.Response:
        return self.agent.post(f"/api/v1/sessions/{session}/intercept",
                               json={"tool": tool, "args": args, "step_index": step})

    def long_poll_in_background(self, effect_id: str) -> tuple[threading.Thread, dict]:
        """Start the caller's long poll; the dict gets its response and when it came back."""
        out: dict = {}

        def poll() -> None:
            out["sent_at"] = time.monotonic()
            out["response"] = self.agent.get(f"/api/v1/effects/{effect_id}", params={"wait": 20})
            out["answered_at"] = time.monotonic()

        thread = threading.Thread(target=poll)
        thread.start()
        time.sleep(0.5)  # the poll is now waiting on the server
        assert "response" not in out
        return thread, out


def test_a_reviewer_approves_the_waiting_caller_wakes_commits_and_a_resubmission_replays(server, worker):
    acme = make_persona("acme")
    register_standard_tools(acme)
    http = Http(server, acme)
    session = http.open_session()
    held = http.intercept(session, "delete_account", {"account_id": "acct-101"}, 1)
    assert held.status_code == 202 and held.json()["decision"] == "await_approval"
    effect_id, approval_id = held.json()["effect"]["id"], held.json()["approval"]["id"]
    queue = http.reviewer.get("/api/v1/approvals", params={"state": "pending"}).json()["approvals"]
    assert [row["id"] for row in queue] == [approval_id]
    thread, poll = http.long_poll_in_background(effect_id)

    approved = http.reviewer.post(f"/api/v1/approvals/{approval_id}/approve", json={"reason": "inactive"})
    decided_at = time.monotonic()
    thread.join()

    assert approved.status_code == 200, approved.text
    assert poll["response"].status_code == 200
    assert poll["response"].json()["effect"]["state"] == "approved"
    assert poll["response"].json()["decision"] == "approved"
    assert poll["answered_at"] - decided_at < 1.0
    commit = http.agent.post(f"/api/v1/effects/{effect_id}/commit", json={"result": {"deleted": "acct-101"}})
    assert commit.status_code == 200 and commit.json()["effect"]["state"] == "committed"
    replay = http.intercept(session, "delete_account", {"account_id": "acct-101"}, 1)
    assert replay.status_code == 200
    assert replay.json()["decision"] == "replay"
    assert replay.json()["effect"]["result"] == {"deleted": "acct-101"}
    assert Effect.objects.filter(session_id=session).count() == 1
    assert http.agent.post(f"/api/v1/sessions/{session}/complete").json()["session"]["state"] == "completed"


def test_a_rejection_halts_the_run_and_the_waiting_caller_gets_the_reason(server, worker):
    acme = make_persona("acme")
    register_standard_tools(acme)
    http = Http(server, acme)
    session = http.open_session()
    held = http.intercept(session, "delete_account", {"account_id": "acct-102"}, 1).json()
    thread, poll = http.long_poll_in_background(held["effect"]["id"])

    rejected = http.reviewer.post(f"/api/v1/approvals/{held['approval']['id']}/reject",
                                  json={"reason": "acct-102 has an open invoice"})
    decided_at = time.monotonic()
    thread.join()

    assert rejected.status_code == 200
    assert poll["answered_at"] - decided_at < 1.0
    answer = poll["response"].json()
    assert (answer["decision"], answer["reason"]) == ("rejected", "acct-102 has an open invoice")
    assert answer["effect"]["state"] == "rejected"
    assert Session.objects.get(pk=session).state == "halted"
    again = http.intercept(session, "delete_account", {"account_id": "acct-102"}, 1).json()
    assert (again["effect"]["decision"], again["effect"]["reason"]) == ("rejected", "acct-102 has an open invoice")
    other = http.intercept(session, "delete_account", {"account_id": "acct-103"}, 2)
    assert other.status_code == 409 and other.json()["error"] == "session_not_running"


def test_the_beat_expires_a_request_whose_deadline_passed_and_halts_the_run(server, worker):
    acme = make_persona("acme")
    register(acme, irreversible("drop_table", timeout_s=1, auto_approve_on_timeout=False))
    http = Http(server, acme)
    session = http.open_session()
    held = http.intercept(session, "drop_table", {"account_id": "t1"}, 1).json()

    answer = http.agent.get(f"/api/v1/effects/{held['effect']['id']}", params={"wait": 10})

    assert answer.json()["effect"]["state"] == "expired"
    assert answer.json()["decision"] == "expired"
    approval = ApprovalRequest.objects.get(pk=held["approval"]["id"])
    assert (approval.state, approval.decided_by_label, approval.decided_by) == ("expired", "timeout", None)
    # The real beat schedule (every 2 s) decided it: within a sweep or two of the deadline.
    assert approval.decided_at - approval.timeout_at < timedelta(seconds=5)
    assert Session.objects.get(pk=session).state == "halted"
    assert Event.objects.filter(kind="approval.expired", session_id=session).count() == 1


def test_the_beat_auto_approves_when_the_tool_says_so_and_the_run_goes_on(server, worker):
    acme = make_persona("acme")
    register(acme, irreversible("send_invoice", timeout_s=1, auto_approve_on_timeout=True))
    http = Http(server, acme)
    session = http.open_session()
    held = http.intercept(session, "send_invoice", {"account_id": "a1"}, 1).json()

    answer = http.agent.get(f"/api/v1/effects/{held['effect']['id']}", params={"wait": 10}).json()

    assert (answer["effect"]["state"], answer["decision"]) == ("approved", "approved")
    assert answer["effect"]["approval"]["decided_by"] == "timeout"
    assert Session.objects.get(pk=session).state == "running"
    event = Event.objects.get(kind="approval.decided", session_id=session)
    assert (event.data["decision"], event.data["decided_by"]) == ("approved", "timeout")


def test_deadlines_missed_while_the_worker_was_down_are_caught_up(server, worker):
    acme = make_persona("acme")
    register_standard_tools(acme)
    http = Http(server, acme)
    sessions = [http.open_session() for _ in range(3)]
    held = [http.intercept(s, "delete_account", {"account_id": s}, 1).json() for s in sessions]
    # As if beat had been down for an hour: three deadlines long past, no message anywhere.
    ApprovalRequest.objects.filter(pk__in=[h["approval"]["id"] for h in held]).update(
        timeout_at=timezone.now() - timedelta(hours=1))

    eventually(lambda: set(Session.objects.filter(pk__in=sessions).values_list("state", flat=True)) == {"halted"},
               timeout=8)

    assert set(ApprovalRequest.objects.filter(session_id__in=sessions).values_list("state", flat=True)) == {"expired"}


def test_an_extended_deadline_is_not_expired_by_the_sweep(server, worker):
    acme = make_persona("acme")
    register(acme, irreversible("drop_table", timeout_s=2))
    http = Http(server, acme)
    session = http.open_session()
    held_at = time.monotonic()
    held = http.intercept(session, "drop_table", {"account_id": "t1"}, 1).json()

    extended = http.reviewer.post(f"/api/v1/approvals/{held['approval']['id']}/extend", json={"minutes": 5})
    time.sleep(max(0.0, held_at + 2 + 2.2 - time.monotonic()))  # past the old deadline by a beat period

    assert extended.status_code == 200
    assert ApprovalRequest.objects.get(pk=held["approval"]["id"]).state == "pending"
