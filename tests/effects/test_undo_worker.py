"""The walk on a real Celery worker against the real broker, and what happens when that worker
is killed with SIGKILL in the middle of a compensation webhook."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from django.conf import settings

from effects.models import Session, UndoAttempt, UndoEntry
from tests.processes import celery_worker

pytestmark = pytest.mark.django_db(transaction=True)

# Short leases and a brisk sweep, so a dead worker's claim is taken over within seconds.
FAST = {"UNDOLOG_UNDO_STALL_S": "1", "UNDOLOG_UNDO_SWEEP_S": "1"}


def wait_for_state(session_id: str, state: str, timeout: float = 40) -> None:
    deadline = time.monotonic() + timeout
    current = None
    while time.monotonic() < deadline:
        current = Session.objects.filter(pk=session_id).values_list("state", flat=True).first()
        if current == state:
            return
        time.sleep(0.1)
    raise AssertionError(f"session {session_id} is {current}, not {state}, after {timeout} s")


def worker_log(name: str) -> Path:
    path = Path(settings.VAR_DIR) / f"test-worker-{name}-{os.getpid()}-{time.monotonic_ns()}.log"
    return path


def test_a_real_worker_walks_the_stack_back_with_countdown_retries(stack_of, receiver):
    stack = stack_of(5, retry_backoff_ms=200)
    top = stack.entries[4]
    receiver.behaviour = lambda d: (503 if d.key == top and d.n <= 2 else 200, 0.0)

    with celery_worker(log=worker_log("e2e"), **FAST):
        assert stack.fail().status_code == 200
        wait_for_state(stack.session_id, "compensated")

    assert receiver.order == list(reversed(stack.entries))
    assert [a.outcome for a in UndoAttempt.objects.filter(entry_id=top).order_by("number")] == \
        ["retry", "retry", "success"]
    assert receiver.deliveries[top] == 3 and not receiver.duplicates


def test_a_worker_killed_mid_webhook_loses_no_compensation_and_doubles_none(stack_of, receiver):
    stack = stack_of(5, timeout_ms=5000, max_retries=3)
    in_flight = stack.entries[3]  # the second entry the walk reaches (newest first)

    def slow_receiver(delivery):
        # Every undo takes a moment; the one we kill the worker on takes long enough to be caught.
        return 200, (4.0 if delivery.key == in_flight and delivery.n == 1 else 0.2)

    receiver.behaviour = slow_receiver

    with celery_worker(log=worker_log("doomed"), **FAST) as doomed:
        assert stack.fail().status_code == 200
        receiver.wait_for(lambda r: r.deliveries[in_flight] == 1, timeout=30)
        os.killpg(doomed.pid, signal.SIGKILL)
        doomed.wait(timeout=10)

    entry = UndoEntry.objects.get(pk=in_flight)
    assert (entry.state, entry.attempts) == ("running", 1)  # claimed by the dead worker, not finished
    assert Session.objects.get(pk=stack.session_id).state == "compensating"

    with celery_worker(beat=True, log=worker_log("successor"), **FAST):
        wait_for_state(stack.session_id, "compensated")

    # As the receiver saw it: every compensation applied exactly once, newest first.
    assert receiver.order == list(reversed(stack.entries))
    assert set(receiver.applied) == set(stack.entries)
    # The one in flight when the worker died was delivered again (its fate was unknown), with the
    # same Idempotency-Key, so the receiver acknowledged it without undoing twice.
    assert receiver.deliveries[in_flight] == 2 and dict(receiver.duplicates) == {in_flight: 1}
    assert all(receiver.deliveries[key] == 1 for key in stack.entries if key != in_flight)
    log = [(a.number, a.outcome) for a in UndoAttempt.objects.filter(entry_id=in_flight).order_by("number")]
    assert log == [(1, "lost"), (2, "success")]
    assert set(UndoEntry.objects.filter(session_id=stack.session_id).values_list("state", flat=True)) == \
        {"compensated"}


def test_ctrl_c_on_the_launcher_mid_compensation_lets_the_worker_finish_it_without_a_traceback(stack_of, receiver,
                                                                                               tmp_path):
    """`make run`, a compensation's webhook in flight, Ctrl-C: the launcher's shutdown is the
    worker's warm shutdown (SIGTERM to its main process only), so the pool finishes the webhook
    and records it, instead of dying mid-task with a WorkerLostError traceback."""
    import subprocess
    import sys

    from tests.processes import BASE_DIR, child_env, free_port

    stack = stack_of(3, timeout_ms=8000, max_retries=3)
    in_flight = stack.entries[2]  # the newest: the walk's first
    receiver.behaviour = lambda d: (200, 3.0 if d.key == in_flight and d.n == 1 else 0.1)
    log_path = tmp_path / "launcher.log"
    env = child_env(UNDOLOG_VAR_DIR=str(tmp_path), PORT=str(free_port()), WORKER_CONCURRENCY="2",
                    UNDOLOG_DEMO_KEY_FILE=str(tmp_path / "no.key"), **FAST)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with log_path.open("wb") as out:
        launcher = subprocess.Popen([sys.executable, "-m", "undolog_site.launcher"], cwd=BASE_DIR, env=env,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while "undolog is running" not in log_path.read_text(errors="replace"):
            assert launcher.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        assert stack.fail().status_code == 200
        receiver.wait_for(lambda r: r.deliveries[in_flight] == 1, timeout=30)
        launcher.send_signal(signal.SIGINT)  # Ctrl-C reaches the launcher alone: its children lead their own groups
        assert launcher.wait(timeout=90) == 0
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()

    log = log_path.read_text(errors="replace")
    assert "Traceback" not in log and "WorkerLostError" not in log, log[-4000:]
    entry = UndoEntry.objects.get(pk=in_flight)
    outcomes = list(UndoAttempt.objects.filter(entry_id=in_flight).order_by("number").values_list("outcome", flat=True))
    assert (entry.state, outcomes) == ("compensated", ["success"]), (entry.state, outcomes)
    assert receiver.deliveries[in_flight] == 1 and not receiver.duplicates
