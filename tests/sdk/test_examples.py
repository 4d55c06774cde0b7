"""The complete examples of sdk/README.md run as written (they are sdk/examples/*.py, quoted
whole in the README) against the real server, a reviewer approving through the API."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from effects.models import Effect, Session
from tests.processes import BASE_DIR
from tests.sdk.conftest import reviewer

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = BASE_DIR / "sdk" / "examples"
README = (BASE_DIR / "sdk" / "README.md").read_text()


@pytest.mark.parametrize("example, held", [
    ("langgraph_cleanup.py", "waiting for a reviewer: delete_account({'account_id': 'acct-101'})"),
    ("openai_agents_cleanup.py", 'waiting for a reviewer: delete_account({"account_id": "acct-101"})'),
])
def test_the_readme_example_runs_and_waits_for_the_reviewer(acme, server, example, held):
    source = (EXAMPLES / example).read_text()
    assert source.strip() in README, f"sdk/README.md does not quote {example} as it is"
    person = reviewer(acme, server, ("approve", ""), delay=0.2)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_")},
           "UNDOLOG_URL": server, "UNDOLOG_API_KEY": acme.key}
    done = subprocess.run([sys.executable, str(EXAMPLES / example)], cwd=BASE_DIR, env=env,
                          capture_output=True, text=True, timeout=60)
    person.finish()

    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == held
    assert lines[1] == "acct-101 is gone."
    session_id = lines[2].split()[1].rstrip(":")
    assert lines[2].endswith(": completed") and Session.objects.get(pk=session_id).state == "completed"
    assert sorted(Effect.objects.filter(session_id=session_id).values_list("tool_name", "state")) == [
        ("delete_account", "committed"), ("notify_owner", "committed")]
