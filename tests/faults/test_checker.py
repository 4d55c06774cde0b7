"""The nemesis checker's rules on small histories of their own (tests/faults/checker.py's `judge`,
given the final state as `read_state` reads it): a decision whose answer a fault lost, and the
receiver's word on two deliveries of one key in flight at once. Each rule is shown both ways: it
passes what the system may do and fails what it may not."""

from __future__ import annotations

from tests.faults import checker

RUN, CALL, APPROVAL = "run-held", "effect-held", "approval-held"
WALKED, UNDONE, ENTRY = "run-walked", "effect-undone", "entry-undone"
HELD_CALL = {"tool": "delete_account", "args": {"account_id": "a-1"}, "step_index": 1}


def request(method: str, path: str, status: int, answer: dict, body: dict | None = None, t: float = 1.0) -> dict:
    return {"who": "test", "node": "web1", "method": method, "path": path, "body": body, "status": status,
            "answer": answer, "t0": t, "t1": t + 0.01}


def held(effect_state: str = "rejected", run_state: str = "halted", approval_state: str = "rejected") -> dict:
    """The final state of one run whose irreversible call was held for a person, past its deadline."""
    return {"effects": {CALL: {"session": RUN, "state": effect_state, "result": None, "tool": "delete_account",
                               "step": 1}},
            "entries": {},
            "sessions": {RUN: {"state": run_state, "irreversible": 1, "agent": "agent-0", "error": ""}},
            "approvals": {APPROVAL: {"state": approval_state, "effect": CALL, "session": RUN, "due": True}}}


def history_of_held(*decisions: dict) -> list[dict]:
    answer = {"decision": "await_approval", "effect": {"id": CALL, "state": "pending"},
              "approval": {"id": APPROVAL, "decided_by": None}}
    return [request("POST", "/api/v1/sessions", 201, {"id": RUN}),
            request("POST", f"/api/v1/sessions/{RUN}/intercept", 202, answer, HELD_CALL), *decisions]


def decision(verb: str, status: int, answer: dict | None = None) -> dict:
    return request("POST", f"/api/v1/approvals/{APPROVAL}/{verb}", status, answer or {}, {"reason": "r"}, t=2.0)


LOST = {"transport": "RemoteProtocolError"}
UNKNOWN = {"error": "database_unavailable", "outcome": "unknown", "message": "it may have been recorded"}
NOTHING_CHANGED = {"error": "database_unavailable", "message": "nothing was changed"}


def judge(history: list[dict], state: dict, deliveries: list[dict] | None = None) -> dict:
    return checker.judge(history, deliveries or [], state, faults=[], irreversible={"delete_account"}, cap=1,
                         fleet_agent="agent-5")


def rules(report: dict) -> list[str]:
    return [v["rule"] for v in report["violations"]]


def test_a_reject_answered_200_decides_the_held_call():
    report = judge(history_of_held(decision("reject", 200, {"approval": {"state": "rejected"}})), held())

    assert rules(report) == []
    assert report["decisions_answer_lost"] == 0


def test_a_reject_whose_answer_was_lost_explains_a_call_that_ended_rejected():
    for answer_lost in (decision("reject", 0, LOST), decision("reject", 503, UNKNOWN)):
        retried = decision("reject", 409, {"error": "already_decided", "state": "rejected"})

        report = judge(history_of_held(answer_lost, retried), held())

        assert rules(report) == [], answer_lost
        assert report["decisions_answer_lost"] == 1


def test_a_call_that_ended_rejected_with_no_reject_sent_did_not_expire():
    report = judge(history_of_held(), held())

    assert rules(report) == ["expiry expires"]


def test_a_reject_that_changed_nothing_or_was_refused_does_not_explain_a_rejection():
    for attempt in (decision("reject", 503, NOTHING_CHANGED), decision("reject", 409, {"error": "conflict"})):
        report = judge(history_of_held(attempt), held())

        assert rules(report) == ["expiry expires"], attempt
        assert report["decisions_answer_lost"] == 0


def test_an_approve_whose_answer_was_lost_does_not_explain_a_rejection():
    report = judge(history_of_held(decision("approve", 0, LOST)), held())

    assert rules(report) == ["expiry expires"]


def test_a_reject_whose_answer_was_lost_is_held_to_what_a_reject_does():
    report = judge(history_of_held(decision("reject", 0, LOST)), held(run_state="awaiting_approval"))

    assert rules(report) == ["rejection halts"]


def test_a_held_call_nobody_decided_ends_expired_its_run_halted():
    assert rules(judge(history_of_held(), held("expired", "halted", "expired"))) == []
    assert rules(judge(history_of_held(), held("expired", "awaiting_approval", "expired"))) == ["expiry expires"]


def walked() -> dict:
    """A run rolled back (its /fail answered 200) whose one entry was compensated."""
    return {"effects": {UNDONE: {"session": WALKED, "state": "compensated", "result": {}, "tool": "send_email",
                                 "step": 1}},
            "entries": {ENTRY: {"session": WALKED, "state": "compensated", "effect": UNDONE, "step": 1, "error": ""}},
            "sessions": {WALKED: {"state": "compensated", "irreversible": 0, "agent": "agent-0", "error": ""}},
            "approvals": {}}


def delivery(n: int, arrived: float, ended: float, outcome: str = "ok", **seen) -> dict:
    return {"key": ENTRY, "n": n, "attempt": n, "arrived": arrived, "ended": ended, "outcome": outcome,
            "applied": n == 1, "in_flight_with": [], "gave_up_on": [], **seen}


FAILED = [request("POST", f"/api/v1/sessions/{WALKED}/fail", 200, {"session": {"state": "compensating"}})]


def test_a_delivery_that_arrived_while_its_keys_first_sender_waited_is_two_in_flight():
    second = delivery(2, 1.02, 1.08, in_flight_with=[{"n": 1, "arrived": 1.0}])

    report = judge(FAILED, walked(), [delivery(1, 1.0, 1.05, "5xx"), second])

    assert rules(report) == ["one delivery in flight per key"]
    assert [d["n"] for d in report["violations"][0]["evidence"]["in_flight"]] == [1]


def test_a_resend_after_its_sender_gave_up_is_no_overlap_though_the_receiver_answered_later():
    # The receiver's thread for the first ran late (under load): by its clock the two overlap, but
    # the first one's sender had timed out and hung up when the second arrived.
    second = delivery(2, 2.40, 2.45, gave_up_on=[1])

    report = judge(FAILED, walked(), [delivery(1, 1.0, 2.40002), second])

    assert rules(report) == []
    assert (report["redeliveries_after_receiver"], report["resent_after_sender_gave_up"]) == (1, 1)


def test_a_redelivery_after_an_answer_nothing_cut_short_is_unexplained():
    report = judge(FAILED, walked(), [delivery(1, 1.0, 1.05), delivery(2, 1.5, 1.55)])

    assert rules(report) == ["redelivery explained"]


def test_a_delivery_tcp_brought_after_its_sender_gave_up_is_not_in_flight():
    # Attempt 1, sent into a cut and given up, retransmitted by the kernel once the cut healed,
    # arrives while attempt 3 is answered: nobody waits for attempt 1, on either side of the pair.
    cut = [{"kind": "worker-receiver", "role": "worker", "at": 0.0, "healed": 0.9}]
    ghost_second = [delivery(1, 1.0, 1.05), delivery(2, 1.04, 1.1, in_flight_with=[{"n": 1, "arrived": 1.0}],
                                                     abandoned=True)]
    ghost_first = [delivery(1, 1.0, 1.05, abandoned=True), delivery(2, 1.02, 1.08,
                                                                    in_flight_with=[{"n": 1, "arrived": 1.0}])]

    for deliveries in (ghost_second, ghost_first):
        report = checker.judge(FAILED, deliveries, walked(), faults=cut, irreversible={"delete_account"}, cap=1,
                               fleet_agent="agent-5")

        assert rules(report) == []
        assert report["delivered_after_sender_gave_up"] == 1
