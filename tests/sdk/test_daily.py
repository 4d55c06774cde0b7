"""The SDK against the real server, as a newcomer runs it: no `agent=` (the key says which),
the approval page's URL in the log while it waits, and "rolling back N calls" when a run fails."""

from __future__ import annotations

import logging

import pytest

from effects.models import Session
from tests.sdk.agent_tools import delete_account, send_email
from tests.sdk.conftest import reviewer

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_session_without_agent_is_the_keys_agent(acme, server, client, monkeypatch):
    monkeypatch.delenv("UNDOLOG_AGENT", raising=False)

    with client.session() as s:
        send_email("owner@example.com")

    assert s.agent == "cleanup"
    assert Session.objects.get(pk=s.id).agent == acme.agent
    assert Session.objects.get(pk=s.id).state == "completed"


def test_it_logs_the_approval_pages_url_while_it_waits(acme, server, client, caplog):
    person = reviewer(acme, server, ("approve", ""), delay=0.3)

    with caplog.at_level(logging.INFO, logger="undolog"), client.session() as s:
        delete_account("acct-101")
    person.finish()

    approval = person.asked[0]["id"]
    waiting = [r.getMessage() for r in caplog.records if "waits for a reviewer" in r.getMessage()]
    assert waiting and f"{server}/approvals/{approval}/" in waiting[0]
    assert s.state == "completed"


def test_a_failed_run_says_it_rolls_back_how_many_calls(acme, server, client, caplog):
    with caplog.at_level(logging.WARNING, logger="undolog"), pytest.raises(RuntimeError), client.session() as s:
        send_email("a@example.com")
        send_email("b@example.com")
        raise RuntimeError("the model gave up")

    messages = [r.getMessage() for r in caplog.records]
    assert any(f"run {s.id} failed (RuntimeError: the model gave up): rolling back 2 calls" in m
               and f"{server}/sessions/{s.id}/" in m for m in messages), messages
