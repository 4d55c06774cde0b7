"""Several workers walking one stack at once (real threads, each with its own database
connection): every entry is compensated once, newest first."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from effects.models import Session, UndoAttempt
from lifecycle import undo

pytestmark = pytest.mark.django_db(transaction=True)


def test_concurrent_walkers_never_run_an_entry_twice_nor_out_of_order(stack_of, receiver):
    receiver.behaviour = lambda d: (200, 0.01)
    stack = stack_of(12)
    Session.objects.get(pk=stack.session_id).move({"running"}, "compensating", actor="test")
    start, errors = threading.Barrier(6), []

    def worker() -> None:
        try:
            start.wait()
            while Session.objects.filter(pk=stack.session_id, state="compensating").exists():
                undo.walk(stack.session_id)  # a walker that finds the top entry claimed steps back
        except Exception as exc:  # surfaced below: a thread's exception would vanish otherwise
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert stack.session.state == "compensated"
    assert receiver.order == list(reversed(stack.entries))
    assert set(receiver.deliveries.values()) == {1} and not receiver.duplicates
    assert UndoAttempt.objects.filter(entry__session_id=stack.session_id).count() == 12
