"""The walk: LIFO, exactly once per entry, what it compensates and what it skips (eager mode)."""

from __future__ import annotations

import pytest

from effects.models import Effect, Session, SessionTransition, UndoEntry
from lifecycle import undo
from lifecycle.tasks import walk_undo_stack
from tests.conftest import intercept, open_session
from tests.effects.conftest import register_undo

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]


def test_it_compensates_ten_effects_newest_first(stack_of, receiver):
    stack = stack_of(10)

    response = stack.fail()

    assert response.status_code == 200
    assert response.json()["session"]["state"] in ("compensating", "compensated")
    assert receiver.order == list(reversed(stack.entries))
    assert stack.session.state == "compensated"
    assert set(UndoEntry.objects.filter(session_id=stack.session_id).values_list("state", flat=True)) == \
        {"compensated"}
    assert set(Effect.objects.filter(session_id=stack.session_id).values_list("state", flat=True)) == \
        {"compensated"}
    assert list(SessionTransition.objects.filter(session_id=stack.session_id).values_list("to_state", flat=True)) \
        == ["failed", "compensating", "compensated"]


def test_it_posts_the_documented_payload_signed_and_keyed_by_the_entry(acme, stack_of, receiver):
    stack = stack_of(1)

    stack.fail()

    (delivery,) = receiver.log
    entry = stack.entry(0)
    assert delivery.verified
    assert delivery.key == str(entry.pk)
    assert delivery.body == {"fn_name": "undo_send_email", "fn_version": "1.0.0", "args": {"to": "user1@x.io"},
                             "effect_id": stack.effects[0], "session_id": stack.session_id, "attempt": 1}
    assert delivery.headers["Undolog-Signature"].startswith("t=")
    attempt = entry.attempt_log.get()
    assert (attempt.number, attempt.outcome, attempt.status_code) == (1, "success", 200)


def test_it_records_the_effects_history_through_compensating(stack_of):
    stack = stack_of(1)

    stack.fail()

    effect = Effect.objects.get(pk=stack.effects[0])
    assert [t.to_state for t in effect.transitions.all()] == ["committed", "compensating", "compensated"]
    assert effect.transitions.last().actor == "undo-walk"


def test_it_ends_compensated_at_once_when_there_is_nothing_to_undo(acme, receiver):
    register_undo(acme, receiver.url)
    session_id = open_session(acme)

    response = acme.api.post(f"/api/v1/sessions/{session_id}/fail", {"error": "boom"}, format="json")

    assert response.status_code == 200
    assert response.json()["session"]["state"] == "compensated"
    assert receiver.log == []


def test_it_compensates_an_effect_whose_tool_may_have_acted_before_it_raised(acme, stack_of, receiver):
    stack = stack_of(3, commit=False)
    acme.api.post(f"/api/v1/effects/{stack.effects[1]}/fail", {"error": "SMTP said 451"}, format="json")

    stack.fail()

    assert receiver.order == list(reversed(stack.entries))  # executing, failed, executing: all started
    assert stack.session.state == "compensated"


def test_it_skips_an_entry_whose_effect_never_started(stack_of, receiver):
    stack = stack_of(3)
    # Not reachable through the intercept today (compensable effects start as executing);
    # the walk must still never compensate an effect that cannot have acted.
    Effect.objects.filter(pk=stack.effects[1]).update(state="rejected")

    stack.fail()

    assert receiver.order == [stack.entries[2], stack.entries[0]]
    assert stack.entry(1).state == "skipped"
    assert stack.session.state == "compensated"


def test_it_refuses_a_late_commit_of_an_effect_it_compensated(acme, stack_of):
    stack = stack_of(1, commit=False)
    stack.fail()

    response = acme.api.post(f"/api/v1/effects/{stack.effects[0]}/commit", {"result": {}}, format="json")

    assert response.status_code == 409
    assert Effect.objects.get(pk=stack.effects[0]).state == "compensated"


def test_it_rolls_back_a_session_waiting_for_approval(acme, stack_of, receiver):
    stack = stack_of(2)
    acme.api.post("/api/v1/tools", {"tools": [
        {"name": "delete_account", "tier": "irreversible", "approval": {"reason": "gone for good"}}]},
        format="json")
    assert intercept(acme, stack.session_id, "delete_account", {"account_id": "a"}, 3).status_code == 202

    response = stack.fail("the reviewer rejected it")

    assert response.status_code == 200
    assert stack.session.state == "compensated"
    assert receiver.order == list(reversed(stack.entries))


def test_it_rolls_back_a_halted_session(stack_of, receiver):
    stack = stack_of(1)
    Session.objects.filter(pk=stack.session_id).update(state="halted")

    assert stack.fail().status_code == 200

    assert stack.session.state == "compensated"


def test_it_refuses_to_fail_a_session_twice(stack_of, receiver):
    stack = stack_of(1)
    stack.fail()

    response = stack.fail()

    assert response.status_code == 409
    assert response.json()["error"] == "session_state_conflict"
    assert receiver.deliveries[stack.entries[0]] == 1


def test_it_changes_nothing_when_a_walk_message_arrives_twice(stack_of, receiver):
    stack = stack_of(2)
    stack.fail()

    walk_undo_stack.delay(stack.session_id)
    undo.walk(stack.session_id)

    assert sum(receiver.deliveries.values()) == 2
    assert stack.session.state == "compensated"


def test_it_walks_at_least_one_entry_per_task_and_then_yields(stack_of, receiver):
    stack = stack_of(3)
    Session.objects.get(pk=stack.session_id).move({"running"}, "compensating", actor="test")

    again = undo.walk(stack.session_id, budget_s=0)

    assert again is not None  # "enqueue me again now"
    assert receiver.order == [stack.entries[2]]
    assert undo.walk(stack.session_id) is None
    assert receiver.order == list(reversed(stack.entries))


def test_it_leaves_a_session_alone_that_is_not_compensating(stack_of, receiver):
    stack = stack_of(1)

    assert undo.walk(stack.session_id) is None
    assert undo.walk("00000000-0000-0000-0000-000000000000") is None
    assert receiver.log == []


def test_the_claims_quick_commit_stays_inside_its_own_statement(stack_of, receiver):
    """The claim commits without waiting for its WAL flush (lifecycle/undo.py); the connection the
    rest of the process shares must still commit durably afterwards."""
    from django.db import connection

    stack = stack_of(3)
    stack.fail()

    assert receiver.order == list(reversed(stack.entries))
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            assert cursor.fetchone()[0] == "on"
