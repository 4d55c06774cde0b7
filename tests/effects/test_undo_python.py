"""Python compensation handlers: run in the worker, `PermanentCompensationError` stops retries."""

from __future__ import annotations

import pytest

from effects.models import UndoAttempt
from tests.effects import undo_handlers
from tests.effects.conftest import build_stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]

HERE = "tests.effects.undo_handlers"


@pytest.fixture(autouse=True)
def _clear_calls():
    undo_handlers.calls.clear()


def outcomes(stack) -> list[tuple[str, str]]:
    return [(a.outcome, a.error) for a in UndoAttempt.objects.filter(entry_id=stack.entries[0]).order_by("number")]


def test_it_calls_the_handler_with_the_args_and_a_context(acme):
    stack = build_stack(acme, f"{HERE}.restore", 2, handler="python")

    stack.fail()

    assert [args for args, _ in undo_handlers.calls] == [{"to": "user2@x.io"}, {"to": "user1@x.io"}]
    context = undo_handlers.calls[0][1]
    assert context.idempotency_key == stack.entries[1]
    assert (context.effect_id, context.session_id, context.attempt) == (stack.effects[1], stack.session_id, 1)
    assert (context.fn_name, context.fn_version, context.org_id) == ("undo_send_email", "1.0.0", str(acme.org.id))
    assert stack.session.state == "compensated"


def test_it_stops_retrying_on_a_permanent_compensation_error(acme):
    stack = build_stack(acme, f"{HERE}.gone_for_good", 1, handler="python")

    stack.fail()

    assert outcomes(stack) == [("permanent", "PermanentCompensationError: the mailbox no longer exists")]
    assert stack.session.state == "compensation_failed"


def test_it_retries_any_other_exception(acme):
    stack = build_stack(acme, f"{HERE}.flaky", 1, handler="python")

    stack.fail()

    assert [o for o, _ in outcomes(stack)] == ["retry", "retry", "success"]
    assert outcomes(stack)[0][1] == "ConnectionError: mail server unreachable"


def test_it_interrupts_a_handler_past_its_timeout(acme):
    stack = build_stack(acme, f"{HERE}.slow_then_fast", 1, handler="python", timeout_ms=200)

    stack.fail()

    first, second = outcomes(stack)
    assert first == ("retry", "timed out after 0.2 s")
    assert second == ("success", "")
    assert UndoAttempt.objects.get(entry_id=stack.entries[0], number=1).duration_ms < 1000


def test_it_gives_up_at_once_when_the_handler_cannot_be_imported(acme):
    stack = build_stack(acme, f"{HERE}.missing", 1, handler="python")

    stack.fail()

    ((outcome, error),) = outcomes(stack)
    assert outcome == "permanent" and error.startswith(f"cannot import {HERE}.missing")
