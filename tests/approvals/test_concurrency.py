"""Twenty reviewers decide the same request at once, each in its own thread and connection:
exactly one decision lands, every other reviewer gets 409 already_decided."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from approvals.models import ApprovalRequest
from effects.models import EffectTransition, SessionTransition
from orgs.models import Event
from tests.approvals.conftest import hold
from tests.conftest import make_persona

REVIEWERS = 20


@pytest.mark.django_db(transaction=True)
def test_it_lets_exactly_one_of_twenty_concurrent_reviewers_decide():
    acme = make_persona("acme")
    body = hold(acme)
    reviewers = [acme.person(f"reviewer-{n}", "reviewer") for n in range(REVIEWERS)]
    start = threading.Barrier(REVIEWERS)
    answers: list[tuple[int, str, dict]] = []
    lock = threading.Lock()

    def decide(n: int) -> None:
        # Half approve, half reject (and roll back): every combination must still give one decision.
        verb, data = ("approve", {}) if n % 2 else ("reject", {"reason": f"no from {n}"})
        try:
            start.wait()
            response = reviewers[n].post(f"/api/v1/approvals/{body['approval']['id']}/{verb}", data, format="json")
            with lock:
                answers.append((response.status_code, verb, response.json()))
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(n,)) for n in range(REVIEWERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    codes = sorted(code for code, _, _ in answers)
    assert codes == [200] + [409] * (REVIEWERS - 1), answers
    assert {body["error"] for code, _, body in answers if code == 409} == {"already_decided"}
    winner = next((verb, body) for code, verb, body in answers if code == 200)
    approval = ApprovalRequest.objects.get(pk=body["approval"]["id"])
    assert approval.state == ("approved" if winner[0] == "approve" else "rejected")
    assert approval.decided_by_label == winner[1]["approval"]["decided_by"]
    assert EffectTransition.objects.filter(effect_id=body["effect"]["id"]).count() == 1
    assert SessionTransition.objects.filter(session_id=body["session"], from_state="awaiting_approval").count() == 1
    assert Event.objects.filter(kind="approval.decided").count() == 1
