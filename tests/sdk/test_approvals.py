"""An irreversible call decided by a person through the reviewer REST API: a rejection is
`ApprovalRejected` with its reason and reviewer, an expiry `ApprovalExpired`, and two callers
waiting on the same approval never both run the tool (`POST /effects/{id}/start`)."""

from __future__ import annotations

import threading

import pytest
from undolog import ApprovalExpired, ApprovalRejected, refusal_as_tool_result
from undolog.testing import ScriptedAgent

from effects.models import Effect, EffectTransition, Session
from tests.conftest import open_session
from tests.sdk.agent_tools import RAN, delete_account, purge_backups
from tests.sdk.conftest import CountingTransport, Person, agent_client, reviewer, token_of

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_rejection_raises_approval_rejected_with_the_reason_and_the_reviewer(acme, server, client):
    person = reviewer(acme, server, ("reject", "acct-102 has an open invoice"), delay=0.3)
    with client.session(agent="cleanup") as s, pytest.raises(ApprovalRejected) as rejected:
        delete_account("acct-102")
    person.finish()

    assert (rejected.value.reason, rejected.value.reviewer) == ("acct-102 has an open invoice", "acme-reviewer")
    assert refusal_as_tool_result(rejected.value) == "DENIED: acct-102 has an open invoice"
    assert RAN == []
    # The run is halted on the server; the SDK's /complete is answered 409 and not raised.
    assert s.state == "halted" == Session.objects.get(pk=s.id).state
    assert Effect.objects.get(session_id=s.id).state == "rejected"


def test_a_scripted_agent_reads_the_denial_as_its_tool_result(acme, server, client):
    person = reviewer(acme, server, ("approve", ""), ("reject", "acct-102 has an open invoice"))
    script = [[("delete_account", {"account_id": "acct-101"}), ("delete_account", {"account_id": "acct-102"})],
              "Deleted acct-101; acct-102 was denied."]
    with client.session(agent="cleanup"):
        transcript = ScriptedAgent(script, tools=[delete_account]).run_sync()
    person.finish()

    assert [(c.result, c.refused) for c in transcript.calls] == [
        ("deleted acct-101", False), ("DENIED: acct-102 has an open invoice", True)]
    assert RAN == ["delete_account acct-101"]


def test_an_expired_request_raises_approval_expired(acme, server, worker, client):
    with client.session(agent="cleanup") as s, pytest.raises(ApprovalExpired, match="expired before a decision"):
        purge_backups("acct-101")  # a 1 s deadline, swept by the worker's beat

    assert RAN == []
    assert Effect.objects.get(session_id=s.id).state == "expired"
    assert s.state == "halted"


def test_two_callers_waiting_on_one_approval_run_it_once(acme, server, client):
    session_id = open_session(acme)  # one run, resumed by two callers (say, a retried worker)
    waiting = threading.Barrier(3)
    wire = CountingTransport()  # shared: what both callers sent
    results: dict[str, object] = {}

    def caller(name: str) -> None:
        def on_wait(info) -> None:
            if name not in results:
                results[name] = None
                waiting.wait(10)

        with agent_client(acme, server, on_wait=on_wait, transport=wire).resume_session(session_id):
            results[name] = delete_account("acct-101")

    first = threading.Thread(target=caller, args=("first",))
    first.start()
    person = Person(server, token_of(acme.reviewer))
    approval = person.next_pending(set())
    second = threading.Thread(target=caller, args=("second",))  # its intercept replays the pending effect
    second.start()
    waiting.wait(10)  # both are in their long poll now
    assert person.decide(approval["id"], "approve").status_code == 200
    first.join(30)
    second.join(30)

    assert RAN == ["delete_account acct-101"]
    assert results["first"] == results["second"] == "deleted acct-101"
    [effect] = Effect.objects.filter(session_id=session_id)
    starts = EffectTransition.objects.filter(effect=effect, from_state="approved", to_state="executing")
    assert starts.count() == 1
    # Whoever woke second either lost the /start (409) or saw it executing and waited.
    assert sorted(status for _, path, status in wire.answers if path.endswith("/start")) in ([200], [200, 409])
    assert effect.state == "committed"


class Gated(CountingTransport):
    """Holds requests whose path ends with a gated suffix until its event is set; sets the
    `after` event of a suffix once its answer is back. Makes a race come out one way."""

    def __init__(self, hold: dict[str, threading.Event] | None = None,
                 after: dict[str, threading.Event] | None = None) -> None:
        super().__init__()
        self.hold, self.after = hold or {}, after or {}

    def handle_request(self, request):
        for suffix, event in self.hold.items():
            if request.url.path.endswith(suffix):
                assert event.wait(15), f"{suffix} held too long"
        response = super().handle_request(request)
        for suffix, event in self.after.items():
            if request.url.path.endswith(suffix):
                event.set()
        return response


def test_the_caller_that_loses_the_start_returns_the_winners_result(acme, server, client):
    session_id = open_session(acme)
    b_saw_approved, a_running = threading.Event(), threading.Event()
    wire_a = Gated(hold={"/start": b_saw_approved})
    wire_b = Gated(hold={"/start": a_running}, after={"/intercept": b_saw_approved})
    results: dict[str, object] = {}

    def slow_delete(account_id: str) -> str:
        a_running.set()
        threading.Event().wait(0.3)  # still executing when B's /start arrives
        return delete_account.__wrapped__(account_id)

    from undolog import ToolTier, undolog_tool

    tool = undolog_tool(slow_delete, tier=ToolTier.IRREVERSIBLE, name="delete_account",
                        reason="Deletes an account for good")

    def caller(name: str, wire: Gated) -> None:
        with agent_client(acme, server, transport=wire).resume_session(session_id):
            results[name] = tool("acct-101")

    a = threading.Thread(target=caller, args=("a", wire_a))
    a.start()
    person = Person(server, token_of(acme.reviewer))
    assert person.decide(person.next_pending(set())["id"], "approve").status_code == 200
    b = threading.Thread(target=caller, args=("b", wire_b))  # replays the approved effect
    b.start()
    a.join(30)
    b.join(30)

    assert results == {"a": "deleted acct-101", "b": "deleted acct-101"}
    assert RAN == ["delete_account acct-101"]
    assert [s for _, p, s in wire_a.answers if p.endswith("/start")] == [200]
    assert [s for _, p, s in wire_b.answers if p.endswith("/start")] == [409]
    assert not [p for _, p, _ in wire_b.answers if p.endswith("/commit")]
