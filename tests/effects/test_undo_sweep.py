"""The beat sweep: walks that are due or stalled are found from the rows and enqueued again;
walks that some worker is moving are left alone (eager mode; the worker tests do it for real)."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from effects import handlers
from effects.models import Effect, Session, UndoAttempt, UndoEntry
from lifecycle import attempts, undo
from lifecycle.tasks import sweep_undo_walks
from orgs.models import Event
from undolog_site.celery import app

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]


def compensating(stack) -> Session:
    """The session as fail() leaves it, but with the walk's message lost."""
    session = stack.session
    session.move({"running"}, "compensating", actor="test")
    return session


def age(session_id: str, seconds: float = 120) -> None:
    Session.objects.filter(pk=session_id).update(updated=timezone.now() - timedelta(seconds=seconds))


def claimed_by_a_dead_worker(entry: UndoEntry, *, lease_left_s: float = -1) -> None:
    """What a worker leaves behind when it dies mid-attempt: a running claim and its lease."""
    now = timezone.now()
    assert entry.claim(timedelta(seconds=30))
    UndoEntry.objects.filter(pk=entry.pk).update(claimed_at=now - timedelta(seconds=60),
                                                 lease_until=now + timedelta(seconds=lease_left_s))
    Effect.objects.get(pk=entry.effect_id).start_compensating("undo-walk")


def test_it_takes_over_a_claim_whose_worker_died(stack_of, receiver):
    stack = stack_of(2)
    compensating(stack)
    claimed_by_a_dead_worker(stack.entry(1))

    assert sweep_undo_walks.delay().get() == 1

    entry = stack.entry(1)
    log = list(UndoAttempt.objects.filter(entry=entry).order_by("number"))
    assert [(a.number, a.outcome) for a in log] == [(1, "lost"), (2, "success")]
    assert log[0].duration_ms >= 59_000 and "worker died" in log[0].error
    assert receiver.order == [stack.entries[1], stack.entries[0]]
    assert receiver.log[0].body["attempt"] == 2
    assert stack.session.state == "compensated"


def test_it_leaves_a_live_claim_alone(stack_of, receiver):
    stack = stack_of(1)
    age(compensating(stack).pk)
    claimed_by_a_dead_worker(stack.entry(0), lease_left_s=30)

    assert undo.due_sessions() == []
    assert undo.walk(stack.session_id) is None
    assert receiver.log == [] and stack.entry(0).state == "running"


def test_a_worker_whose_clock_runs_ahead_cannot_take_over_a_live_claim(stack_of, receiver):
    # The nemesis's clock fault: leases are the database's, so a worker 90 s ahead (here: this
    # process's clock, the only thing faked) sees an expired lease that is still live.
    stack = stack_of(1)
    compensating(stack)
    claimed_by_a_dead_worker(stack.entry(0), lease_left_s=30)
    ahead = timezone.now() + timedelta(seconds=90)

    with mock.patch("django.utils.timezone.now", return_value=ahead):
        assert undo.walk(stack.session_id) is None

    entry = stack.entry(0)
    assert receiver.log == [] and (entry.state, entry.attempts) == ("running", 1)


@pytest.mark.parametrize("claimer", ["walk", "entry"])  # the walk's claim (one statement on PostgreSQL); the model's
def test_a_claimer_whose_clock_runs_behind_still_gets_a_live_lease(stack_of, claimer):
    stack = stack_of(1)
    compensating(stack)
    entry = stack.entry(0)
    lease = timedelta(milliseconds=entry.fn.timeout_ms, seconds=django_settings.UNDOLOG_UNDO_STALL_S)
    behind = timezone.now() - timedelta(seconds=90)

    with mock.patch("django.utils.timezone.now", return_value=behind):
        assert (attempts.claim(entry, behind) == 1) if claimer == "walk" else entry.claim(lease)

    entry = stack.entry(0)
    assert entry.state == "running"
    # Counted from the database's now, not from the claimer's 90 s in the past: others see it live.
    assert abs(entry.lease_until - (timezone.now() + lease)) < timedelta(seconds=5)
    assert abs(entry.claimed_at - timezone.now()) < timedelta(seconds=5)


def test_it_escalates_a_stalled_claim_that_used_the_last_attempt(acme, stack_of, receiver):
    stack = stack_of(2, max_retries=0)
    compensating(stack)
    claimed_by_a_dead_worker(stack.entry(1))

    sweep_undo_walks.delay()

    entry = stack.entry(1)
    assert (entry.state, entry.attempts) == ("compensation_failed", 1)
    assert [a.outcome for a in UndoAttempt.objects.filter(entry=entry)] == ["lost"]
    assert stack.session.state == "compensation_failed"
    assert Event.objects.get(org=acme.org, kind="compensation.failed").data["undo_entry"] == str(entry.pk)
    assert receiver.log == []


def test_it_picks_up_a_retry_whose_countdown_message_was_lost(stack_of, receiver):
    stack = stack_of(1)
    compensating(stack)
    UndoEntry.objects.filter(pk=stack.entries[0]).update(
        attempts=1, next_attempt_at=timezone.now() - timedelta(seconds=django_settings.UNDOLOG_UNDO_STALL_S + 1))

    assert undo.due_sessions() == [stack.session.pk]
    sweep_undo_walks.delay()

    assert stack.entry(0).state == "compensated"
    assert receiver.log[0].body["attempt"] == 2


def test_it_leaves_a_retry_to_its_countdown_while_that_can_still_fire(stack_of):
    stack = stack_of(1)
    age(compensating(stack).pk)

    for offset in (-1, +60):  # just due (the countdown is about to run it), or not due yet
        UndoEntry.objects.filter(pk=stack.entries[0]).update(next_attempt_at=timezone.now() + timedelta(seconds=offset))
        assert undo.due_sessions() == []


def test_it_picks_up_a_walk_that_sat_still_between_two_entries(stack_of, receiver):
    stack = stack_of(2)
    compensating(stack)
    assert undo.due_sessions() == []  # just failed: its own message is on the way

    age(stack.session_id)

    assert undo.due_sessions() == [stack.session.pk]
    sweep_undo_walks.delay()
    assert receiver.order == list(reversed(stack.entries))


def test_it_closes_a_session_whose_walker_died_after_the_last_entry(stack_of):
    stack = stack_of(1)
    compensating(stack)
    UndoEntry.objects.filter(pk=stack.entries[0]).update(state="compensated")
    age(stack.session_id)

    sweep_undo_walks.delay()

    assert stack.session.state == "compensated"


def test_it_leaves_sessions_waiting_for_a_person_alone(stack_of, receiver):
    receiver.behaviour = lambda d: (500, 0)
    stack = stack_of(1, max_retries=0)
    stack.fail()
    age(stack.session_id)

    assert undo.due_sessions() == []


def test_a_worker_whose_claim_was_taken_over_cannot_record_its_result(stack_of):
    stack = stack_of(1)
    compensating(stack)
    slow = stack.entry(0)
    claimed_by_a_dead_worker(slow)  # attempt 1, its lease already ran out
    taker = stack.entry(0)
    assert taker.claim(timedelta(seconds=30))  # attempt 2

    attempts.record(slow, 1, handlers.Result(ok=True, permanent=False, error="", duration_ms=5, status_code=200))

    entry = stack.entry(0)
    assert (entry.state, entry.attempts) == ("running", 2)
    assert not UndoAttempt.objects.filter(entry=entry).exists()


def test_two_workers_reading_the_same_entry_cannot_both_claim_it(stack_of):
    stack = stack_of(1)
    first, second = stack.entry(0), stack.entry(0)

    assert first.claim(timedelta(seconds=30))
    assert not second.claim(timedelta(seconds=30))
    assert stack.entry(0).attempts == 1


def test_the_sweep_is_on_the_beat_schedule():
    entry = django_settings.CELERY_BEAT_SCHEDULE["undo-sweep"]

    assert entry["task"] == "effects.tasks.sweep_undo_walks" and entry["task"] in app.tasks
    assert entry["schedule"] <= 10
    assert app.tasks["effects.tasks.walk_undo_stack"].acks_late
    assert app.tasks["effects.tasks.walk_undo_stack"].reject_on_worker_lost
