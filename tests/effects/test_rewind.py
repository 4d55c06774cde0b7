"""Rewind (lifecycle/rewind.py): a run goes back to a step, and the effects after it are undone by
the walk, newest first, each once, against a real webhook receiver (eager Celery)."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from effects.models import Effect, Rewind, SafeCall, Savepoint, Session, SessionTransition, UndoEntry
from orgs.models import Event
from tests.conftest import intercept

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]


def rewind(persona, session_id, client=None, **body):
    return (client or persona.api).post(f"/api/v1/sessions/{session_id}/rewind", body, format="json")


def register_irreversible(persona, name="send_invoice"):
    response = persona.api.post("/api/v1/tools", {"tools": [
        {"name": name, "tier": "irreversible", "approval": {"reason": "money leaves"}}]}, format="json")
    assert response.status_code == 200, response.content


def approve_rule(persona, tool):
    response = persona.admin.post("/api/v1/rules", {
        "name": f"let-{tool}", "condition": f'tool.name == "{tool}"', "outcome": "approve"}, format="json")
    assert response.status_code == 201, response.content


def snapshot(session_id):
    """Everything a refused rewind must leave as it was."""
    session = Session.objects.get(pk=session_id)
    return (session.state, session.step_index, session.rewinds, session.rewind_to, session.tool_calls,
            sorted(Effect.objects.filter(session_id=session_id).values_list("call_signature", "state")),
            sorted(UndoEntry.objects.filter(session_id=session_id).values_list("state", flat=True)),
            SafeCall.objects.filter(session_id=session_id).count(),
            Savepoint.objects.filter(session_id=session_id).count(), Rewind.objects.count(),
            Event.objects.filter(kind="session.rewound").count(),
            SessionTransition.objects.filter(session_id=session_id).count())


def test_it_undoes_the_later_effects_newest_first_each_once_and_resumes_at_the_step(acme, stack_of, receiver):
    stack = stack_of(6)

    response = rewind(acme, stack.session_id, to_step=3, reason="took a wrong turn at step 4")

    assert response.status_code == 200, response.content
    body = response.json()
    assert [item["step_index"] for item in body["to_undo"]] == [6, 5, 4]
    assert body["resumes_at"] == 3 and body["left_done"] == [] and body["from_step"] == 6
    assert receiver.order == [stack.entries[5], stack.entries[4], stack.entries[3]]
    assert all(n == 1 for n in receiver.deliveries.values()) and not receiver.duplicates
    session = stack.session
    assert (session.state, session.step_index, session.rewind_to, session.rewinds) == ("running", 3, None, 1)
    states = dict(Effect.objects.filter(session_id=stack.session_id).values_list("step_index", "state"))
    assert states == {1: "committed", 2: "committed", 3: "committed", 4: "compensated", 5: "compensated",
                      6: "compensated"}
    assert [stack.entry(n).state for n in range(3)] == ["pending"] * 3
    record = Rewind.objects.get(session_id=stack.session_id)
    assert record.finished_at is not None and record.by.startswith("agent:")
    event = Event.objects.get(kind="session.rewound")
    assert event.data["reason"] == "took a wrong turn at step 4"
    assert (event.data["counts"], event.data["to_step"]) == ({"to_undo": 3, "left_done": 0, "withdrawn": 0}, 3)
    history = list(SessionTransition.objects.filter(session_id=stack.session_id).values_list("from_state", "to_state"))
    assert history[-2:] == [("running", "compensating"), ("compensating", "running")]

    # The run goes on from step 3: a new call at step 4 runs, and a later fail walks what is left.
    assert intercept(acme, stack.session_id, "send_email", {"to": "new@x.io"}, 4).status_code == 201
    stack.fail()
    assert stack.session.state == "compensated"
    assert len(receiver.applied) == 7 and not receiver.duplicates


def test_a_reviewer_may_rewind_and_the_preview_writes_nothing(acme, stack_of, receiver):
    stack = stack_of(3)
    before = snapshot(stack.session_id)

    preview = acme.reviewer.get(f"/api/v1/sessions/{stack.session_id}/rewind?to_step=1")

    assert preview.status_code == 200, preview.content
    assert [item["step_index"] for item in preview.json()["to_undo"]] == [3, 2]
    assert snapshot(stack.session_id) == before and receiver.log == []
    response = rewind(acme, stack.session_id, acme.reviewer, to_step=1, reason="reviewer says so")
    assert response.status_code == 200, response.content
    assert receiver.order == [stack.entries[2], stack.entries[1]]
    assert Rewind.objects.get().by.endswith("reviewer")


def test_a_viewer_may_not_rewind(acme, stack_of, receiver):
    stack = stack_of(2)
    before = snapshot(stack.session_id)

    assert rewind(acme, stack.session_id, acme.viewer, to_step=0).status_code == 403
    assert snapshot(stack.session_id) == before


def test_a_savepoint_marks_the_current_step_and_a_rewind_goes_back_to_it_by_name(acme, stack_of, receiver):
    stack = stack_of(2)
    response = acme.api.post(f"/api/v1/sessions/{stack.session_id}/savepoints", {"name": "drafted"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["name"] == "drafted" and response.json()["step_index"] == 2
    for step in (3, 4):
        assert intercept(acme, stack.session_id, "send_email", {"to": f"late{step}@x.io"}, step).status_code == 201
    acme.api.post(f"/api/v1/sessions/{stack.session_id}/savepoints", {"name": "late"}, format="json")

    response = rewind(acme, stack.session_id, to="drafted", reason="back to the draft")

    assert response.status_code == 200, response.content
    assert response.json()["to_step"] == 2 and response.json()["savepoint"] == "drafted"
    assert [d.body["args"]["to"] for d in receiver.log] == ["late4@x.io", "late3@x.io"]
    assert stack.session.step_index == 2
    # The savepoint after the step named steps that no longer happened: dropped.
    assert list(Savepoint.objects.filter(session_id=stack.session_id).values_list("name", flat=True)) == ["drafted"]
    unknown = rewind(acme, stack.session_id, to="late")
    assert unknown.status_code == 404 and unknown.json()["error"] == "savepoint_not_found"


def test_an_irreversible_call_in_the_way_is_named_and_nothing_is_written(acme, stack_of, receiver):
    stack = stack_of(2)
    register_irreversible(acme)
    approve_rule(acme, "send_invoice")
    answer = intercept(acme, stack.session_id, "send_invoice", {"amount": 10}, 3)
    assert answer.status_code == 202, answer.content
    invoice = answer.json()["effect"]["id"]
    assert acme.api.post(f"/api/v1/effects/{invoice}/start").status_code == 200
    assert acme.api.post(f"/api/v1/effects/{invoice}/commit", {"result": {}}, format="json").status_code == 200
    assert intercept(acme, stack.session_id, "send_email", {"to": "after@x.io"}, 4).status_code == 201
    before = snapshot(stack.session_id)

    refused = rewind(acme, stack.session_id, to_step=1, reason="undo the invoice too")

    assert refused.status_code == 409
    body = refused.json()
    assert body["error"] == "irreversible_in_the_way"
    assert [(i["tool"], i["step_index"], i["effect"]) for i in body["irreversible"]] == [("send_invoice", 3, invoice)]
    assert body["irreversible"][0]["at"] and "send_invoice at step 3" in body["message"]
    assert snapshot(stack.session_id) == before and receiver.log == []

    preview = acme.api.get(f"/api/v1/sessions/{stack.session_id}/rewind?to_step=1").json()
    assert [i["tool"] for i in preview["irreversible_in_the_way"]] == ["send_invoice"]

    # With consent: the invoice is left done, and listed; everything else after step 1 is undone.
    response = rewind(acme, stack.session_id, to_step=1, reason="keep the invoice", leave_irreversible=True)
    assert response.status_code == 200, response.content
    assert [i["tool"] for i in response.json()["left_done"]] == ["send_invoice"]
    assert len(receiver.applied) == 2 and receiver.log[0].body["args"] == {"to": "after@x.io"}
    assert Effect.objects.get(pk=invoice).state == "committed"
    detail = acme.api.get(f"/api/v1/sessions/{stack.session_id}").json()
    assert [i["tool"] for i in detail["rewinds"][0]["left_done"]] == ["send_invoice"]
    transition = SessionTransition.objects.filter(session_id=stack.session_id, to_state="compensating").get()
    assert "not undone by the rewind: send_invoice at step 3" in transition.reason
    assert Event.objects.get(kind="session.rewound").data["left_done"][0]["tool"] == "send_invoice"


def test_after_a_rewind_an_identical_call_runs_again_while_a_retry_replays(acme, stack_of, receiver):
    stack = stack_of(3)
    third = Effect.objects.get(pk=stack.effects[2])
    kept = intercept(acme, stack.session_id, "send_email", {"to": "user1@x.io"}, 1)
    assert kept.status_code == 200 and kept.json()["decision"] == "replay"

    assert rewind(acme, stack.session_id, to_step=2, reason="again").status_code == 200

    again = intercept(acme, stack.session_id, "send_email", {"to": "user3@x.io"}, 3)
    assert again.status_code == 201, again.content
    assert again.json()["decision"] == "execute" and again.json()["effect"]["id"] != str(third.pk)
    retry = intercept(acme, stack.session_id, "send_email", {"to": "user3@x.io"}, 3)
    assert retry.status_code == 200 and retry.json()["decision"] == "replay"
    assert retry.json()["effect"]["id"] == again.json()["effect"]["id"]
    # A call kept by the rewind still replays; so does an idempotency key, scoped the same way.
    assert intercept(acme, stack.session_id, "send_email", {"to": "user1@x.io"}, 1).json()["decision"] == "replay"
    keyed = intercept(acme, stack.session_id, "send_email", {"to": "k@x.io"}, 4, idempotency_key="k-1")
    assert keyed.status_code == 201
    assert rewind(acme, stack.session_id, to_step=3).status_code == 200
    rekeyed = intercept(acme, stack.session_id, "send_email", {"to": "k@x.io"}, 4, idempotency_key="k-1")
    assert rekeyed.status_code == 201 and rekeyed.json()["effect"]["id"] != keyed.json()["effect"]["id"]
    assert intercept(acme, stack.session_id, "send_email", {"to": "k@x.io"}, 4,
                     idempotency_key="k-1").json()["decision"] == "replay"


def test_a_pending_approval_after_the_step_is_withdrawn_and_says_so(acme, stack_of, receiver):
    stack = stack_of(2)
    register_irreversible(acme)
    answer = intercept(acme, stack.session_id, "send_invoice", {"amount": 10}, 3)
    assert answer.status_code == 202 and stack.session.state == "awaiting_approval"
    approval = ApprovalRequest.objects.get(effect_id=answer.json()["effect"]["id"])

    response = rewind(acme, stack.session_id, to_step=1, reason="not this way")

    assert response.status_code == 200, response.content
    assert [i["tool"] for i in response.json()["withdrawn"]] == ["send_invoice"]
    approval.refresh_from_db()
    assert approval.state == "expired" and "rewound to step 1" in approval.decision_reason
    assert Effect.objects.get(pk=approval.effect_id).state == "expired"
    withdrawn = Event.objects.get(kind="approval.expired")
    assert withdrawn.data["withdrawn"] is True
    assert stack.session.state == "running" and receiver.order == [stack.entries[1]]
    assert acme.reviewer.get("/api/v1/approvals?state=pending").json()["approvals"] == []


def test_budgets_are_not_refunded(acme, stack_of, receiver):
    stack = stack_of(4)
    before = Session.objects.get(pk=stack.session_id)
    acme.api.post(f"/api/v1/sessions/{stack.session_id}/safe-calls",
                  {"safe_calls": [{"tool": "read_file", "step_index": 5}]}, format="json")
    charged = Session.objects.get(pk=stack.session_id)
    assert charged.tool_calls == before.tool_calls + 1

    assert rewind(acme, stack.session_id, to_step=1).status_code == 200

    after = stack.session
    assert (after.tool_calls, after.cost, after.tool_counts) == (charged.tool_calls, charged.cost,
                                                                 charged.tool_counts)
    # The steps are run again, and charged again: the SAFE call at step 5 counts a second time.
    acme.api.post(f"/api/v1/sessions/{stack.session_id}/safe-calls",
                  {"safe_calls": [{"tool": "read_file", "step_index": 5}]}, format="json")
    assert stack.session.tool_calls == charged.tool_calls + 1
    assert Rewind.objects.get().safe_calls[0]["tool"] == "read_file"


def test_another_orgs_run_is_a_404(acme, outsider, stack_of, receiver):
    stack = stack_of(2)
    before = snapshot(stack.session_id)

    for client in (outsider.api, outsider.admin):
        response = rewind(outsider, stack.session_id, client, to_step=0)
        assert response.status_code == 404 and response.json()["error"] == "session_not_found"
        assert client.get(f"/api/v1/sessions/{stack.session_id}/rewind?to_step=0").status_code == 404
        assert client.post(f"/api/v1/sessions/{stack.session_id}/savepoints", {"name": "x"},
                           format="json").status_code == 404
    assert snapshot(stack.session_id) == before and receiver.log == []


@pytest.mark.parametrize("body", [{"to_step": 3}, {"to_step": 99}, {"to_step": -1}])
def test_a_step_outside_the_run_is_a_400(acme, stack_of, receiver, body):
    stack = stack_of(2)
    before = snapshot(stack.session_id)

    response = rewind(acme, stack.session_id, **body)

    assert response.status_code == 400, response.content
    assert response.json()["error"] == "step_outside_run" and "outside the run" in response.json()["message"]
    assert snapshot(stack.session_id) == before and receiver.log == []


@pytest.mark.parametrize("body", [{}, {"to_step": 1, "to": "x"}, {"to_step": "one"}, {"to_step": 1, "extra": 1},
                                  {"to_step": 1, "leave_irreversible": "maybe"}])
def test_bad_bodies_are_a_400_and_write_nothing(acme, stack_of, receiver, body):
    stack = stack_of(2)
    before = snapshot(stack.session_id)

    response = rewind(acme, stack.session_id, **body)

    assert response.status_code == 400, response.content
    assert response.json()["error"] == "invalid"
    assert snapshot(stack.session_id) == before


def test_a_halted_run_cannot_be_rewound(acme, stack_of, receiver):
    # A reviewer's no ends the run for good: going back before the rejected call does not undo it.
    stack = stack_of(2)
    register_irreversible(acme)
    answer = intercept(acme, stack.session_id, "send_invoice", {"amount": 10}, 3)
    approval = ApprovalRequest.objects.get(effect_id=answer.json()["effect"]["id"])
    assert acme.reviewer.post(f"/api/v1/approvals/{approval.pk}/reject", {"reason": "no"},
                              format="json").status_code == 200
    assert stack.session.state == "halted"
    before = snapshot(stack.session_id)

    response = rewind(acme, stack.session_id, to_step=1)

    assert response.status_code == 409 and response.json()["error"] == "session_state_conflict"
    assert "or a completed one, can be rewound" in response.json()["message"]
    assert acme.api.get(f"/api/v1/sessions/{stack.session_id}/rewind?to_step=1").status_code == 409
    assert snapshot(stack.session_id) == before and receiver.log == []


def test_a_completed_run_is_reopened_by_a_rewind_and_its_budget_verdict_is_not_given_twice(acme, stack_of,
                                                                                             receiver):
    # A framework resumes a finished thread from an earlier checkpoint (LangGraph's time travel): the
    # completed run goes back to the step, runs again from there, and ends again.
    acme.admin.patch("/api/v1/agents/cleanup/budget", {"max_tool_calls_per_run": 3, "on_exceeded": "pause"},
                     format="json")
    stack = stack_of(3)
    refused = intercept(acme, stack.session_id, "send_email", {"to": "over@x.io"}, 4)
    assert refused.status_code == 429, refused.content
    assert acme.api.post(f"/api/v1/sessions/{stack.session_id}/complete", {}, format="json").status_code == 200
    assert acme.api.get("/api/v1/agents/cleanup/budget").json()["state"] == "suspended"
    assert acme.admin.post("/api/v1/agents/cleanup/resume", {"note": "reviewed"}, format="json").status_code == 200
    ended = stack.session
    assert (ended.state, ended.ended_at is not None) == ("completed", True)
    assert Event.objects.filter(kind="budget.exceeded").count() == 1

    preview = acme.api.get(f"/api/v1/sessions/{stack.session_id}/rewind?to_step=1")
    assert preview.status_code == 200 and [i["step_index"] for i in preview.json()["to_undo"]] == [3, 2]
    response = rewind(acme, stack.session_id, to_step=1, reason="time travel to step 1")

    assert response.status_code == 200, response.content
    assert receiver.order == [stack.entries[2], stack.entries[1]] and not receiver.duplicates
    reopened = stack.session
    assert (reopened.state, reopened.step_index, reopened.ended_at) == ("running", 1, None)
    assert Event.objects.get(kind="session.rewound").data["reopened"] is True
    history = list(SessionTransition.objects.filter(session_id=stack.session_id).values_list("from_state",
                                                                                           "to_state"))
    assert history[-2:] == [("completed", "compensating"), ("compensating", "running")]
    # It runs again like any run (over its cap still: budgets are not refunded), and ends again,
    # without a second on_exceeded: the agent stays active.
    assert intercept(acme, stack.session_id, "send_email", {"to": "again@x.io"}, 2).status_code == 429
    assert acme.api.post(f"/api/v1/sessions/{stack.session_id}/complete", {}, format="json").status_code == 200
    assert stack.session.state == "completed" and stack.session.ended_at is not None
    assert Event.objects.filter(kind="budget.exceeded").count() == 1
    assert acme.api.get("/api/v1/agents/cleanup/budget").json()["state"] == "active"


def test_a_rewind_to_the_current_step_undoes_nothing(acme, stack_of, receiver):
    stack = stack_of(2)

    response = rewind(acme, stack.session_id, to_step=2)

    assert response.status_code == 200 and response.json()["to_undo"] == []
    assert stack.session.state == "running" and receiver.log == []
