"""The intercept pipeline's answers, as DESIGN.md's table gives them."""

from __future__ import annotations

from effects.models import Effect, EffectTransition, SafeCall, Session, UndoEntry
from tests.conftest import intercept, open_session


def test_it_admits_a_compensable_call_and_pushes_its_undo_entry_first(acme, session_id):
    response = intercept(acme, session_id, "send_email", {"to": "a@x.io", "subject": "hi"}, 3)

    assert response.status_code == 201
    body = response.json()
    assert body["decision"] == "execute"
    effect = Effect.objects.get(pk=body["effect"]["id"])
    assert effect.state == "executing"
    assert set(body["effect"]) >= {"id", "tool", "state", "step_index", "call_signature", "args", "result", "error"}
    entry = UndoEntry.objects.get(effect=effect)
    assert entry.args == {"to": "a@x.io"}
    assert (entry.fn_name, entry.fn_version, entry.state) == ("undo_send_email", "1.0.0", "pending")


def test_it_holds_an_irreversible_call_for_approval(acme, session_id):
    response = intercept(acme, session_id, "delete_account", {"account_id": "acct-101"}, 1,
                         reasoning="acct-101 has been inactive for a year")

    assert response.status_code == 202
    body = response.json()
    assert body["decision"] == "await_approval"
    assert body["effect"]["state"] == "pending"
    assert set(body["approval"]) >= {"id", "timeout_at"}
    assert Session.objects.get(pk=session_id).state == "awaiting_approval"
    approval = Effect.objects.get(pk=body["effect"]["id"]).approval
    assert approval.estimated_impact == "account acct-101 and its data"
    assert approval.agent_context["reasoning"][-1]["text"] == "acct-101 has been inactive for a year"


def test_it_answers_409_while_the_session_waits_for_a_reviewer(acme, session_id):
    intercept(acme, session_id, "delete_account", {"account_id": "acct-101"}, 1)

    response = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 2)

    assert response.status_code == 409
    assert response.json()["error"] == "session_awaiting_approval"
    assert response.json()["approval"]["id"]


def test_it_replays_a_committed_effect_without_running_it_again(acme, session_id):
    first = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1).json()
    commit = acme.api.post(f"/api/v1/effects/{first['effect']['id']}/commit", {"result": {"id": "m-1"}},
                           format="json")
    assert commit.status_code == 200

    again = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1)

    assert again.status_code == 200
    assert again.json()["decision"] == "replay"
    assert again.json()["effect"]["result"] == {"id": "m-1"}
    assert Effect.objects.filter(session_id=session_id).count() == 1
    assert UndoEntry.objects.filter(session_id=session_id).count() == 1


def test_it_refuses_an_idempotency_key_reused_with_other_args(acme, session_id):
    intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1, idempotency_key="k-1")

    response = intercept(acme, session_id, "send_email", {"to": "b@x.io"}, 2, idempotency_key="k-1")

    assert response.status_code == 409
    assert response.json()["error"] == "idempotency_key_reused"
    assert Effect.objects.count() == 1


def test_it_replays_an_idempotency_key_with_the_same_args(acme, session_id):
    first = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1, idempotency_key="k-1").json()

    again = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1, idempotency_key="k-1")

    assert again.status_code == 200
    assert again.json()["effect"]["id"] == first["effect"]["id"]


def test_it_answers_404_for_an_unregistered_tool(acme, session_id):
    response = intercept(acme, session_id, "drop_tables", {}, 1)

    assert response.status_code == 404
    assert response.json()["error"] == "tool_not_registered"
    assert not Effect.objects.exists()


def test_it_answers_400_for_a_safe_tool(acme, session_id):
    response = intercept(acme, session_id, "list_inactive_accounts", {}, 1)

    assert response.status_code == 400
    assert response.json()["error"] == "safe_tool_not_intercepted"


def test_it_answers_409_when_the_session_is_not_running(acme, session_id):
    acme.api.post(f"/api/v1/sessions/{session_id}/complete")

    response = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1)

    assert response.status_code == 409
    assert response.json() == {"error": "session_not_running", "state": "completed",
                               "message": "The session is completed; open a new session.",
                               "request_id": response["X-Request-ID"]}


def test_it_answers_423_when_the_agent_is_suspended(acme, session_id):
    acme.agent.suspend("budget")

    response = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1)

    assert response.status_code == 423
    assert response.json()["error"] == "agent_suspended"
    assert response.json()["reason"] == "budget"
    assert acme.api.post("/api/v1/sessions", {"agent": "cleanup"}, format="json").status_code == 423


def test_it_records_reported_safe_calls_once_even_when_a_request_is_retried(acme, session_id):
    safe = [{"tool": "list_inactive_accounts", "step_index": 1, "args": {}}]
    intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 2, safe_calls=safe)
    intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 2, safe_calls=safe)

    assert SafeCall.objects.filter(session_id=session_id).count() == 1
    session = Session.objects.get(pk=session_id)
    assert session.tool_calls == 2  # one SAFE call, one send_email
    assert session.step_index == 2


def test_it_records_every_transition_with_its_actor(acme, session_id):
    body = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1).json()
    acme.api.post(f"/api/v1/effects/{body['effect']['id']}/commit", {"result": {"ok": True}}, format="json")

    transitions = list(EffectTransition.objects.filter(effect_id=body["effect"]["id"]))

    assert [(t.from_state, t.to_state, t.actor) for t in transitions] == [("executing", "committed", "agent:cleanup")]


def test_it_answers_409_when_an_effect_is_committed_twice(acme, session_id):
    body = intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1).json()
    url = f"/api/v1/effects/{body['effect']['id']}/commit"
    assert acme.api.post(url, {"result": 1}, format="json").status_code == 200

    second = acme.api.post(url, {"result": 2}, format="json")

    assert second.status_code == 409
    assert Effect.objects.get(pk=body["effect"]["id"]).result == 1


def test_another_agents_session_is_404(acme, outsider, session_id):
    response = intercept(outsider, session_id, "send_email", {"to": "a@x.io"}, 1)

    assert response.status_code == 404
    assert response.json()["error"] == "session_not_found"


def test_a_second_session_starts_at_step_zero(acme, tools):
    assert acme.api.post("/api/v1/sessions", {"agent": "cleanup"}, format="json").json()["step_index"] == 0
    assert open_session(acme) != open_session(acme)


def test_safe_calls_after_the_last_intercept_are_charged_on_complete(acme, session_id):
    intercept(acme, session_id, "send_email", {"to": "a@x.io"}, 1)

    response = acme.api.post(f"/api/v1/sessions/{session_id}/complete",
                             {"safe_calls": [{"tool": "list_inactive_accounts", "step_index": 2, "args": {}}]},
                             format="json")

    assert response.status_code == 200
    assert response.json()["session"]["state"] == "completed"
    session = Session.objects.get(pk=session_id)
    assert (session.tool_calls, session.step_index) == (2, 2)
    assert SafeCall.objects.filter(session=session).count() == 1


def test_only_the_first_caller_may_start_an_approved_effect(acme, session_id):
    effect_id = intercept(acme, session_id, "delete_account", {"account_id": "a1"}, 1).json()["effect"]["id"]
    Effect.objects.get(pk=effect_id).approve("reviewer")

    first = acme.api.post(f"/api/v1/effects/{effect_id}/start")
    second = acme.api.post(f"/api/v1/effects/{effect_id}/start")

    assert first.status_code == 200
    assert first.json()["effect"]["state"] == "executing"
    assert second.status_code == 409
    assert second.json()["error"] == "effect_state_conflict"


def test_the_signature_and_digest_are_the_canonical_json_of_the_call_however_the_args_are_written(acme, session_id):
    """The fast path writes the args' canonical JSON once and builds the signature around it: the
    result must stay what hashing canonical_json([session, tool, args]) gives (stored signatures
    from before must keep matching their replays)."""
    from effects.models import canonical_json, sha256
    from lifecycle.intercept.call import parse

    args = {"to": "zoë@x.io", "cc": ["ß", {"z": 1, "a": [None, True, 1.5]}], "subject": "\u2028hi \"there\""}
    response = intercept(acme, session_id, "send_email", dict(reversed(list(args.items()))), 1)

    effect = Effect.objects.get(pk=response.json()["effect"]["id"])
    assert effect.call_signature == sha256(canonical_json([session_id, "send_email", args]))
    assert effect.args_digest == sha256(canonical_json(args))
    assert parse({"tool": "send_email", "args": args, "step_index": 1}).args_digest == effect.args_digest


def test_integers_past_64_bits_in_args_results_and_compensations_are_kept_exactly(acme, session_id):
    """The API's JSON parser takes integers of any size; orjson, which the fast path writes
    with, refuses those past 64 bits. A call holding one, a tool whose compensation holds one,
    and the commit and replay of such calls must answer as any other, with the numbers intact."""
    big = 2**70 + 1
    registered = acme.api.post("/api/v1/tools", {"tools": [{
        "name": "charge_card", "tier": "compensable",
        "compensation": {"fn_name": "undo_send_email", "fn_version": "1.0.0",
                         "args": {"to": "{to}", "ledger": big}}}]}, format="json")
    assert registered.status_code == 200, registered.content

    # a plain call whose undo entry holds the big number (the fast path can take it)
    plain = intercept(acme, session_id, "charge_card", {"to": "a@x.io"}, 1)
    assert plain.status_code == 201, plain.content
    assert plain.json()["undo_entry"]["args"] == {"to": "a@x.io", "ledger": big}
    committed = acme.api.post(f"/api/v1/effects/{plain.json()['effect']['id']}/commit", {"result": big}, format="json")
    assert committed.status_code == 200, committed.content
    assert committed.json()["effect"]["result"] == big

    # a call whose own args hold it (taken by the full pipeline), then committed and replayed
    held = intercept(acme, session_id, "charge_card", {"to": "b@x.io", "amount": big}, 2)
    assert held.status_code == 201, held.content
    effect_id = held.json()["effect"]["id"]
    committed = acme.api.post(f"/api/v1/effects/{effect_id}/commit", {}, format="json")
    assert committed.status_code == 200, committed.content
    assert committed.json()["effect"]["args"] == {"to": "b@x.io", "amount": big}
    replayed = intercept(acme, session_id, "charge_card", {"to": "b@x.io", "amount": big}, 2)
    assert replayed.status_code == 200, replayed.content
    assert replayed.json()["decision"] == "replay"
    assert replayed.json()["effect"]["args"]["amount"] == big
    assert UndoEntry.objects.get(effect_id=effect_id).args == {"to": "b@x.io", "ledger": big}
