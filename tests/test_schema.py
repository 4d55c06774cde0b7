"""The OpenAPI schema is the contract: schemathesis drives the live server (uvicorn, the test
database) from the schema, as an agent and as a reviewer, and checks every answer against
it: no 5xx, every status, content type, header and body as documented, and the auth and
method checks. Bounded: each configuration gets at most RUN_S seconds."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from rest_framework.authtoken.models import Token

from tests.conftest import make_persona, open_session, register_standard_tools
from tests.processes import asgi_server

RUN_S = 45
# Left out, and why: positive_data_acceptance expects every schema-valid body to be accepted,
# but some rules span fields (a compensable tool needs a compensation, a python handler a
# dotted target) and no JSON Schema here says so; negative_data_rejection is the fuzzer's
# guess at validation, and this suite pins validation in tests/*/test_bad_input.py and the
# like. Every response-conformance check runs.
EXCLUDED = "positive_data_acceptance,negative_data_rejection"


@pytest.fixture(scope="module")
def server(django_db_setup):
    # Fuzzed webhook URLs must not send the server resolving random host names.
    with asgi_server(UNDOLOG_ALLOW_PRIVATE_WEBHOOKS="1") as base:
        yield base


@pytest.fixture
def acme(transactional_db):
    persona = make_persona("acme")
    register_standard_tools(persona)
    open_session(persona)  # so the reads have rows to answer with
    return persona


def schemathesis(base: str, authorization: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).with_name("st")), "run", f"{base}/api/schema/",
         "-H", f"Authorization: {authorization}",
         "--checks", "all", "--exclude-checks", EXCLUDED, "--phases", "examples,coverage,fuzzing",
         "--max-examples", "10", "--seed", "14", "--workers", "1", "--max-time", str(RUN_S),
         "--request-timeout", "10", "--no-color"],
        capture_output=True, text=True, timeout=RUN_S + 60, cwd=cwd)  # its .schemathesis/ cache stays in cwd


def summary(run: subprocess.CompletedProcess) -> str:
    return run.stdout[run.stdout.rfind("SUMMARY"):] if "SUMMARY" in run.stdout else run.stdout[-3000:] + run.stderr


@pytest.mark.parametrize("who", ["agent", "reviewer"])
def test_it_answers_as_its_schema_says_to_schemathesis(acme, server, who, tmp_path):
    token = Token.objects.get(user=acme.reviewer.user).key
    authorization = f"Bearer {acme.key}" if who == "agent" else f"Token {token}"

    run = schemathesis(server, authorization, tmp_path)

    print(summary(run))  # the run's summary in the test log (pytest -s, or on failure)
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-3000:]
    selected = re.search(r"Selected: (\d+)/(\d+)", run.stdout)
    tested = re.search(r"Tested: (\d+)", run.stdout)
    assert selected and tested and int(tested[1]) == int(selected[2]) > 40, summary(run)  # every operation ran
