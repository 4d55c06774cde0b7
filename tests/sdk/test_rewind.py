"""`run.savepoint(name)` and `run.rewind(to=…)` through the real server and a real worker: the
receiver sees the later calls undone newest first, the run goes on at the step, and the SDK's
step index follows."""

from __future__ import annotations

import asyncio

import pytest
from undolog import RewindRefused

from effects.models import Effect
from tests.receiver import Receiver
from tests.sdk.agent_tools import RAN, send_email

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def receiver(acme, client):
    with Receiver(secrets=[acme.org.webhook_secret]) as receiver:
        client.register_compensation("undo_send_email", "1.0.0", "webhook", receiver.url)
        yield receiver


def test_a_run_rewinds_to_a_savepoint_and_goes_on_from_there(acme, server, worker, client, receiver):
    with client.session(agent="cleanup") as run:
        send_email("ana@example.com")
        point = run.savepoint("drafted")
        send_email("ben@example.com")
        send_email("cy@example.com")

        answer = run.rewind(to="drafted", reason="wrong recipients")

        assert run.state == "running" and answer["resumes_at"] == point["step_index"] == 1
        assert [item["step_index"] for item in answer["to_undo"]] == [3, 2]
        assert [d.body["args"]["to"] for d in receiver.log] == ["cy@example.com", "ben@example.com"]
        # An identical call runs again (a new call), numbered after the step the run went back to.
        send_email("cy@example.com")
    assert RAN == ["send_email ana@example.com", "send_email ben@example.com", "send_email cy@example.com",
                   "send_email cy@example.com"]
    live = Effect.objects.filter(session_id=run.id, state="committed").order_by("step_index")
    assert [(e.step_index, e.args["to"]) for e in live] == [(1, "ana@example.com"), (2, "cy@example.com")]
    assert run.state == "completed"


def test_an_irreversible_call_in_the_way_is_named_and_the_async_rewind_leaves_it_done(
        acme, server, worker, client, receiver):
    assert acme.admin.post("/api/v1/rules", {"name": "let-delete", "condition": 'tool.name == "delete_account"',
                                             "outcome": "approve"}, format="json").status_code == 201
    from tests.sdk.agent_tools import delete_account

    async def run_it():
        async with client.session(agent="cleanup") as run:
            await asyncio.to_thread(send_email, "ana@example.com")
            await asyncio.to_thread(delete_account, "acct-101")
            with pytest.raises(RewindRefused) as refused:
                await run.arewind(0)
            assert refused.value.code == "irreversible_in_the_way"
            assert [i["tool"] for i in refused.value.irreversible] == ["delete_account"]
            answer = await run.arewind(0, reason="keep the deletion", leave_irreversible=True)
            assert [i["tool"] for i in answer["left_done"]] == ["delete_account"]
            return run

    run = asyncio.run(run_it())
    assert [d.body["args"]["to"] for d in receiver.log] == ["ana@example.com"]
    assert run.state == "completed"
