"""The README's five-minute tour, pasted into a shell as written (the key filled in), against a
server on a port that is not 8000: `API` comes from `PORT`, each step answers as its comment says,
and the run ends with the call a reviewer approved."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from tests.conftest import make_persona
from tests.processes import BASE_DIR
from tests.sdk.conftest import reviewer

pytestmark = pytest.mark.django_db(transaction=True)

README = (BASE_DIR / "README.md").read_text()


def tour() -> str:
    section = README.split("## A five-minute tour (curl)", 1)[1]
    return section.split("```sh\n", 1)[1].split("\n```", 1)[0]


def test_the_tour_runs_as_written_on_the_port_make_run_was_given(server):
    persona = make_persona("demo", agent_name="demo-agent")
    script = tour()
    assert re.search(r"^KEY=ul_\.\.\.", script, re.M) and "8000" not in script.replace("${PORT:-8000}", "")
    script = re.sub(r"^KEY=ul_\.\.\.", f"KEY={persona.key}", script, flags=re.M)
    port = server.rsplit(":", 1)[1]
    assert port != "8000"
    person = reviewer(persona, server, ("approve", ""), delay=0.3)
    done = subprocess.run(["bash", "-c", script], env={**os.environ, "PORT": port}, capture_output=True, text=True,
                          timeout=90)
    person.finish()

    assert done.returncode == 0, done.stderr[-2000:]
    answers = [json.loads(line) for line in re.findall(r"^\{.*\}$", done.stdout.replace("}{", "}\n{"), re.M)]
    replay, decided, run = answers[-3], answers[-2], answers[-1]
    assert replay["decision"] == "replay"
    assert decided["effect"]["approval"]["state"] == "approved"  # nested under effect, as the tour says
    assert {e["tool"]: e["state"] for e in run["effects"]} == {"send_email": "committed", "delete_account": "approved"}
