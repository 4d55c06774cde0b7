"""Retries with full-jitter backoff, permanent failures, timeouts, and escalation to a person."""

from __future__ import annotations

import random
import socket
import statistics

import pytest

from effects.models import Effect, UndoAttempt
from lifecycle import attempts
from orgs.models import Event
from tests.receiver import scripted

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]


class CeilingJitter(random.Random):
    """Always draws the top of the range, so the backoff's growth shows without noise."""

    def uniform(self, a: float, b: float) -> float:
        return b


def attempts_of(entry) -> list[UndoAttempt]:
    return list(UndoAttempt.objects.filter(entry=entry).order_by("number"))


def test_it_retries_with_growing_backoff_until_the_handler_succeeds(stack_of, receiver, monkeypatch):
    monkeypatch.setattr(attempts, "jitter", CeilingJitter())
    receiver.behaviour = scripted(500, 503)
    stack = stack_of(1, retry_backoff_ms=40)

    stack.fail()

    entry = stack.entry(0)
    log = attempts_of(entry)
    assert [(a.number, a.outcome, a.status_code) for a in log] == [(1, "retry", 500), (2, "retry", 503),
                                                                    (3, "success", 200)]
    assert [a.retry_delay_ms for a in log] == [40, 80, None]
    assert (entry.state, entry.attempts) == ("compensated", 3)
    assert stack.session.state == "compensated"
    gaps = [(b.at - a.at) * 1000 for a, b in zip(receiver.log, receiver.log[1:], strict=False)]
    assert gaps[0] >= 40 and gaps[1] >= 80  # the retries waited their backoff
    assert receiver.deliveries[entry_key := str(entry.pk)] == 3 and list(receiver.applied) == [entry_key]


def test_it_sends_the_attempt_number_and_the_same_idempotency_key_each_time(stack_of, receiver):
    receiver.behaviour = scripted(500)
    stack = stack_of(1)

    stack.fail()

    assert [d.body["attempt"] for d in receiver.log] == [1, 2]
    assert {d.key for d in receiver.log} == {stack.entries[0]}


def test_it_escalates_after_exactly_max_retries_plus_one_attempts(acme, stack_of, receiver):
    receiver.behaviour = scripted(then=500)
    stack = stack_of(3, max_retries=2)

    stack.fail()

    top = stack.entry(2)
    assert receiver.deliveries[str(top.pk)] == 3
    assert [a.outcome for a in attempts_of(top)] == ["retry", "retry", "retry"]
    assert attempts_of(top)[-1].retry_delay_ms is None
    assert (top.state, top.last_status_code) == ("compensation_failed", 500)
    assert Effect.objects.get(pk=stack.effects[2]).state == "compensation_failed"
    assert stack.session.state == "compensation_failed"
    # The walk stopped there: nothing below the failed entry was touched.
    for n in (0, 1):
        assert (stack.entry(n).state, stack.entry(n).attempts) == ("pending", 0)
        assert Effect.objects.get(pk=stack.effects[n]).state == "committed"
        assert receiver.deliveries[stack.entries[n]] == 0
    event = Event.objects.get(org=acme.org, kind="compensation.failed")
    assert event.session_id is not None and str(event.session_id) == stack.session_id
    assert event.data["undo_entry"] == str(top.pk)
    assert (event.data["tool"], event.data["fn_name"], event.data["attempts"]) == ("send_email", "undo_send_email", 3)
    assert event.data["status_code"] == 500 and "HTTP 500" in event.data["error"]


def test_it_gives_up_at_once_on_a_permanent_4xx(stack_of, receiver):
    receiver.behaviour = scripted(then=404)
    stack = stack_of(2)

    stack.fail()

    top = stack.entry(1)
    assert receiver.deliveries[str(top.pk)] == 1
    assert [(a.outcome, a.status_code) for a in attempts_of(top)] == [("permanent", 404)]
    assert top.state == "compensation_failed"
    assert stack.entry(0).state == "pending"


@pytest.mark.parametrize("status", [408, 429, 502])
def test_it_retries_408_429_and_5xx(stack_of, receiver, status):
    receiver.behaviour = scripted(status)
    stack = stack_of(1)

    stack.fail()

    assert [a.outcome for a in attempts_of(stack.entry(0))] == ["retry", "success"]


def test_it_times_out_a_slow_receiver_and_retries(stack_of, receiver):
    receiver.behaviour = lambda d: (200, 1.5 if d.n == 1 else 0)
    stack = stack_of(1, timeout_ms=200)

    stack.fail()

    first, second = attempts_of(stack.entry(0))
    assert (first.outcome, first.status_code) == ("retry", None)
    assert "timed out after 0.2 s" in first.error
    assert first.duration_ms < 1000
    assert second.outcome == "success"
    # The first delivery reached the receiver before the timeout; its key dedupes the second.
    assert receiver.duplicates[stack.entries[0]] == 1 and len(receiver.applied) == 1


def test_it_retries_a_refused_connection_and_then_escalates(acme):
    from tests.effects.conftest import build_stack

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/undo"  # nothing listens once closed
    stack = build_stack(acme, closed, 1, max_retries=1)

    stack.fail()

    log = attempts_of(stack.entry(0))
    assert [a.outcome for a in log] == ["retry", "retry"]
    assert "ConnectError" in log[0].error
    assert stack.session.state == "compensation_failed"


def test_it_treats_a_target_refused_by_the_ssrf_rule_as_permanent(stack_of, receiver, settings):
    stack = stack_of(1)
    settings.UNDOLOG_ALLOW_PRIVATE_WEBHOOKS = False

    stack.fail()

    (attempt,) = attempts_of(stack.entry(0))
    assert attempt.outcome == "permanent" and "private or loopback" in attempt.error
    assert receiver.log == []


def test_its_backoff_is_full_jitter_below_a_doubling_ceiling():
    draws = {n: [attempts.backoff_ms(n, 100) for _ in range(2000)] for n in (1, 2, 3)}

    for n, values in draws.items():
        ceiling = 100 * 2 ** (n - 1)
        assert min(values) >= 0 and max(values) <= ceiling
        assert ceiling * 0.4 < statistics.mean(values) < ceiling * 0.6  # uniform over [0, ceiling]
        assert min(values) < ceiling * 0.05  # full jitter reaches down to zero
    assert statistics.mean(draws[3]) > statistics.mean(draws[2]) > statistics.mean(draws[1])


def test_its_backoff_is_capped(settings):
    settings.UNDOLOG_UNDO_MAX_BACKOFF_S = 2

    assert max(attempts.backoff_ms(30, 1000) for _ in range(200)) <= 2000
