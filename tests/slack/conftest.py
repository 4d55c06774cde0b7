"""Slack fixtures: a local fake of Slack's Web API (a real HTTP server) for the whole package,
and a real Celery worker with beat pointed at it (the worker posts and updates messages)."""

from __future__ import annotations

import pytest

from tests.processes import celery_worker
from tests.slack.fakeslack import FakeSlack

BOT_TOKEN = "xoxb-111-222-fakebottoken"
SIGNING_SECRET = "8f742231b10e8888abcd99aaabbb85a5"


@pytest.fixture(scope="package")
def fake_slack() -> FakeSlack:
    fake = FakeSlack(BOT_TOKEN)
    yield fake
    fake.close()


@pytest.fixture(autouse=True)
def _slack_here(fake_slack, settings):
    """This process's WebClient (users.info, views.open from the interaction endpoint) goes to the fake."""
    settings.UNDOLOG_SLACK_API_URL = fake_slack.url
    fake_slack.calls.clear()
    fake_slack.users.clear()


@pytest.fixture(scope="package")
def worker(django_db_setup, fake_slack):
    from undolog_site.celery import app

    app.control.purge()
    with celery_worker(beat=True, concurrency=2, UNDOLOG_SLACK_API_URL=fake_slack.url) as process:
        yield process
