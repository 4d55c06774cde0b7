"""Exactly once across a crash: a run that died is resumed by id, and the calls it had
committed replay their stored results instead of running again."""

from __future__ import annotations

import contextvars
import os
import subprocess
import sys

import pytest

from effects.models import Effect, SafeCall, Session
from tests.processes import BASE_DIR
from tests.sdk.agent_tools import RAN, delete_account, list_inactive_accounts, send_email
from tests.sdk.conftest import reviewer

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = ("ana@example.com", "ben@example.com", "cho@example.com")


def crash_mid_run(server: str, key: str, side_effects) -> str:
    child = subprocess.run([sys.executable, "-m", "tests.sdk.crashing_agent", server, key], cwd=BASE_DIR,
                           capture_output=True, text=True, timeout=60,
                           env={**_env(), "SIDE_EFFECTS": str(side_effects)})
    assert child.returncode == 3, child.stderr
    return child.stdout.strip()


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_")}


def test_it_replays_what_a_crashed_run_committed_without_running_it_again(acme, server, client, tmp_path,
                                                                           monkeypatch):
    side_effects = tmp_path / "side-effects.txt"
    session_id = crash_mid_run(server, acme.key, side_effects)
    assert Session.objects.get(pk=session_id).state == "running"
    assert side_effects.read_text().splitlines() == ["send_email ana@example.com", "send_email ben@example.com"]
    before = {e.args["to"]: e.result for e in Effect.objects.filter(session_id=session_id)}

    monkeypatch.setenv("SIDE_EFFECTS", str(side_effects))
    with client.resume_session(session_id) as s:
        list_inactive_accounts()
        results = [send_email(to) for to in SCRIPT]

    # Only the call the crash cut off ran; the others came back from the effect log.
    assert side_effects.read_text().splitlines() == [f"send_email {to}" for to in SCRIPT]
    assert results[:2] == [before["ana@example.com"], before["ben@example.com"]]
    assert results[2] == {"message_id": "<cho@example.com>", "subject": "Your account"}
    effects = Effect.objects.filter(session_id=session_id).order_by("step_index")
    assert [(e.args["to"], e.state) for e in effects] == [(to, "committed") for to in SCRIPT]
    # A run numbers its calls from 1 (step 0 is the run before any call), and the resumed run
    # numbers its steps after the highest the server had seen (3): the SAFE call is step 4, the
    # replays take 5 and 6, the new call 7.
    assert [e.step_index for e in effects] == [2, 3, 7]
    assert list(SafeCall.objects.filter(session_id=session_id).values_list("step_index", flat=True)) == [1, 4]
    assert s.state == "completed"


def test_it_replays_an_approved_and_committed_irreversible_call_without_asking_again(acme, server, client):
    person = reviewer(acme, server, ("approve", ""))

    def run_that_dies() -> str:
        session = client.session(agent="cleanup").__enter__()
        delete_account("acct-101")
        return session.id  # never left: the process is gone, the session stays running

    session_id = contextvars.copy_context().run(run_that_dies)
    person.finish()
    assert Session.objects.get(pk=session_id).state == "running"

    with client.resume_session(session_id) as again:
        assert delete_account("acct-101") == "deleted acct-101"

    assert RAN == ["delete_account acct-101"]
    assert Effect.objects.filter(session_id=session_id).count() == 1
    assert len(person.asked) == 1  # nobody was asked twice
    assert again.state == "completed"
