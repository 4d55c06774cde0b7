"""A fleet rollback on real Celery workers against the real broker, and a worker killed with
SIGKILL in the middle of it: each compensation still applied once, each run newest first."""

from __future__ import annotations

import os
import signal
from collections import defaultdict
from datetime import timedelta

import pytest
from django.utils import timezone

from effects.models import Session, UndoAttempt, UndoEntry
from tests.conftest import eventually
from tests.effects.conftest import build_stack
from tests.effects.test_undo_worker import FAST, worker_log
from tests.processes import celery_worker

pytestmark = pytest.mark.django_db(transaction=True)


def runs_of(acme, receiver, runs: int, entries: int) -> dict[str, list[str]]:
    """`runs` completed runs of `entries` committed calls each: run → its entries, oldest first."""
    stacks = {}
    for _ in range(runs):
        stack = build_stack(acme, receiver.url, entries, timeout_ms=2000)
        assert acme.api.post(f"/api/v1/sessions/{stack.session_id}/complete").status_code == 200
        stacks[stack.session_id] = stack.entries
    return stacks


def applied_by_run(receiver) -> dict[str, list[str]]:
    runs: dict[str, list[str]] = defaultdict(list)
    for key in receiver.order:
        runs[receiver.applied[key].body["session_id"]].append(key)
    return dict(runs)


def all_compensated(stacks) -> bool:
    return set(Session.objects.filter(pk__in=list(stacks)).values_list("state", flat=True)) == {"compensated"}


def test_a_rollback_on_real_workers_walks_every_run_back(acme, receiver):
    stacks = runs_of(acme, receiver, 6, 3)

    with celery_worker(log=worker_log("fleet"), **FAST):
        response = acme.admin.post("/api/v1/agents/cleanup/rollback",
                                   {"since": (timezone.now() - timedelta(minutes=5)).isoformat(), "reason": "incident"},
                                   format="json")
        assert response.json()["runs"] == 6 and response.json()["entries"] == 18
        eventually(lambda: all_compensated(stacks), timeout=60)

    assert applied_by_run(receiver) == {run: list(reversed(entries)) for run, entries in stacks.items()}
    assert not receiver.duplicates


def test_a_worker_killed_mid_rollback_loses_no_compensation_and_doubles_none(acme, receiver):
    stacks = runs_of(acme, receiver, 8, 3)
    receiver.behaviour = lambda delivery: (200, 0.3)  # slow enough to be caught with some in flight

    with celery_worker(log=worker_log("fleet-doomed"), **FAST) as doomed:
        acme.admin.post("/api/v1/agents/cleanup/rollback",
                        {"since": (timezone.now() - timedelta(minutes=5)).isoformat(), "reason": "incident"},
                        format="json")
        receiver.wait_for(lambda r: len(r.log) >= 10, timeout=60)
        os.killpg(doomed.pid, signal.SIGKILL)
        doomed.wait(timeout=10)

    assert not all_compensated(stacks)
    in_flight = set(UndoEntry.objects.filter(session_id__in=list(stacks), state="running").values_list("pk", flat=True))
    assert in_flight  # claimed by the dead worker, never recorded
    receiver.behaviour = lambda delivery: (200, 0.0)

    with celery_worker(beat=True, log=worker_log("fleet-successor"), **FAST):
        eventually(lambda: all_compensated(stacks), timeout=90)

    # As the receiver saw it: every compensation applied exactly once, each run newest first.
    assert applied_by_run(receiver) == {run: list(reversed(entries)) for run, entries in stacks.items()}
    every = [key for entries in stacks.values() for key in entries]
    assert set(receiver.applied) == set(every)
    # Only what was in flight when the worker died was delivered again (same Idempotency-Key: deduped).
    assert set(receiver.duplicates) <= {str(pk) for pk in in_flight}
    assert all(receiver.deliveries[key] == 1 for key in every if key not in {str(pk) for pk in in_flight})
    lost = UndoAttempt.objects.filter(entry_id__in=in_flight, outcome="lost").count()
    assert lost == len(in_flight)
    assert set(UndoEntry.objects.filter(session_id__in=list(stacks)).values_list("state", flat=True)) == {"compensated"}
