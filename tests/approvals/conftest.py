"""Approvals fixtures: one real worker with beat and one real ASGI server for the whole run
(each costs seconds to start), a real local webhook receiver, and helpers to hold a call."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.conf import settings

from tests.approvals.receiver import Receiver
from tests.conftest import Persona, intercept, open_session, register_standard_tools
from tests.processes import asgi_server, celery_worker

# The fast approval path (lifecycle/intercept/two_statements.py) is PostgreSQL's: prepared statements and one
# locking read. On SQLite there is no such path to test (the pipeline answers, as every other test
# here proves), so its file is collected by the PostgreSQL run only (CI runs both).
collect_ignore = [] if settings.DATABASES["default"]["ENGINE"].endswith("postgresql") else [
    "test_fast_approval.py", "test_irreversible_race.py"]
MAIL_DIR = Path(settings.VAR_DIR) / "test-mail"


@pytest.fixture(scope="package")
def worker(django_db_setup):
    """A real Celery worker with embedded beat (the real CELERY_BEAT_SCHEDULE) on the test broker.

    Package-scoped: it must be gone before other packages' tests start workers of their own,
    or it would take their tasks (a worker-crash test must own the only worker).

    Retries start at 100 ms so the retry tests stay fast; mail goes to files we can read.
    """
    from undolog_site.celery import app

    app.control.purge()  # messages a previous run left in the test broker
    shutil.rmtree(MAIL_DIR, ignore_errors=True)
    with celery_worker(beat=True, concurrency=4, UNDOLOG_WEBHOOK_RETRY_BASE_MS="100",
                       EMAIL_BACKEND="django.core.mail.backends.filebased.EmailBackend",
                       EMAIL_FILE_PATH=str(MAIL_DIR)) as process:
        yield process


@pytest.fixture(scope="package")
def server(django_db_setup) -> str:
    """The real ASGI app under uvicorn; its base URL."""
    with asgi_server() as base:
        yield base


@pytest.fixture
def receiver():
    receiver = Receiver()
    yield receiver
    receiver.close()



def register(persona: Persona, *tools: dict) -> None:
    response = persona.api.post("/api/v1/tools", {"tools": list(tools)}, format="json")
    assert response.status_code == 200, response.content


def irreversible(name: str, **approval) -> dict:
    return {"name": name, "tier": "irreversible",
            "approval": {"reason": f"{name} cannot be taken back", "risk_tags": ["data-loss"],
                         "estimated_impact": "account {account_id} and its data", **approval}}


def hold(persona: Persona, tool: str = "delete_account", args: dict | None = None, step: int = 1,
         session: str | None = None, **extra) -> dict:
    """Open a session (unless given) and intercept an irreversible call: the 202 body."""
    if session is None:
        register_standard_tools(persona)
        session = open_session(persona)
    response = intercept(persona, session, tool, args or {"account_id": "acct-101"}, step, **extra)
    assert response.status_code == 202, response.content
    return {**response.json(), "session": session}
