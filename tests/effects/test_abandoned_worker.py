"""Abandoned runs on the real processes: a run that goes quiet for real (no clock tricks) is
failed by the beat's sweep and walked back by the worker, its compensations reaching a real
receiver once each, newest first."""

from __future__ import annotations

import pytest

from effects.models import Session
from orgs.models import Event
from tests.effects.conftest import build_stack
from tests.effects.test_undo_worker import wait_for_state, worker_log
from tests.processes import celery_worker

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_beat_abandons_a_run_that_went_quiet_and_the_worker_walks_it_back(acme, receiver):
    from undolog_site.celery import app

    app.control.purge()
    response = acme.admin.patch("/api/v1/agents/cleanup/settings", {"run_idle_timeout_s": 2}, format="json")
    assert response.status_code == 200, response.content
    stack = build_stack(acme, receiver.url, 3)

    with celery_worker(beat=True, log=worker_log("abandon"), UNDOLOG_ABANDON_SWEEP_S="1"):
        wait_for_state(stack.session_id, "compensated", timeout=40)

    session = Session.objects.get(pk=stack.session_id)
    assert session.error.startswith("abandoned: no call for ")
    assert Event.objects.filter(kind="session.abandoned", session_id=session.pk).count() == 1
    assert receiver.order == list(reversed(stack.entries))
    assert not receiver.duplicates
