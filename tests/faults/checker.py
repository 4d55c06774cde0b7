"""The nemesis's checker: what every acknowledged answer promised, held against the final state.

It reads the client's side of the history (every request and its answer, `nemesis.History`), the
webhook receiver's log (every delivery, when it arrived and ended and how it was answered) and the
database once the walks have settled, and states each promise as a rule. A rule the database
enforces by itself (a unique constraint: one effect per call signature) is not one of them: its
violation would be a 500, which rule `answers` catches.

The invariants, as checked (each violation carries its evidence):

- `answers`: no answer is a 5xx but 503 `database_unavailable`.
- `503 changed nothing`: an intercept answered 503, sent again, is answered as a first call
  (201/202), never as a replay of a call the 503 recorded (unless a broken connection, which may
  have recorded it, came between).
- `replay answers the first`: the answers to one call name one effect, at most one of them a
  first answer (201/202); a call's first answer is a replay only after an attempt that may have
  recorded it (a broken connection, a 503).
- `executed once`: no effect is answered `execute` twice.
- `execute names its undo entry`: every 201 `execute` names an undo entry that exists, of that effect.
- `acknowledged commit kept`: every commit answered 200 is in the database with its result, the
  effect committed (or undone since, when its run was rolled back).
- `failed run rolled back`: every run whose rollback was acknowledged (`/fail` 200, a reject
  `?rollback=true` 200, a fleet rollback 200 that took it) ends compensated, or
  `compensation_failed` with the entry that stopped the walk escalated with its reason (the older
  ones waiting for that person); every other entry compensated (or skipped: its effect never
  started), and no compensable effect of the run without an undo entry.
- `completed run kept`: every `/complete` 200 ends completed, nothing of it undone (unless a fleet
  rollback took it later).
- `rejection halts`: a reject 200 (the deciding one) leaves the effect rejected and its run halted.
  A decision whose answer a fault lost (no answer: a broken connection, a timeout, a request still
  out at the run's end; or a 503 saying its outcome is unknown) may have been applied: where no
  decision was answered 200 and the request ended as such a decision says, that one is the
  deciding one, held to the same (`decisions_answer_lost` counts them).
- `expiry expires`: a held call nobody decided ends expired, its run halted. "Nobody decided": no
  decision answered 200, and none whose answer was lost that the request's final state matches.
  A call that ended rejected with no reject sent, or only one answered "nothing was changed" or
  4xx, is a violation.
- `cap`: no run has more irreversible effects than its cap, answered or recorded; the run's
  counter equals its irreversible effects (no double charge, no lost one); a run refused over the
  cap has used its slot.
- `decided once`: at most one decision answered 200 per approval, and it is the recorded one.
- compensations, from the receiver's log: `delivery of an entry that ran` (no delivery for an
  unknown entry, a skipped one, or one whose effect never started), `only rolled-back runs undone`
  (no delivery for a run nobody asked to roll back), `newest first` (a run's entries applied
  newest step first), `one delivery in flight per key` (no delivery of a key arrives while an
  earlier one of it is in flight: not answered yet, its sender still waiting, its connection open.
  The receiver reads that from the kernel at each arrival, not from its own timestamps: a thread of
  the receiver starved under load stamps late, and a sender that timed out and hung up is no
  longer waiting however late the receiver answers; `resent_after_sender_gave_up` counts those;
  nor is one that TCP delivered after its own sender had hung up, `delivered_after_sender_gave_up`), and
  `redelivery explained`: a second delivery of a key is allowed only where the one before was cut
  short: the receiver answered 5xx, dropped the connection, stalled past the timeout or answered
  after its sender had given up (`redeliveries_after_receiver`), or a fault that can cut a
  delivery short was under way between the two (from its start to `FAULT_REACH_S` after its heal:
  a worker killed, stopped, cut from the receiver, its link down or restarted; a failover;
  `redeliveries_after_fault`). Any other is a violation.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import psycopg

ROLLED_BACK_END = ("compensated", "compensation_failed")
ROLLED_BACK = ("failed", "compensating", "compensated", "compensation_failed")
NEVER_STARTED = ("pending", "approved", "rejected", "expired")
# How long after its heal a fault may still cut a delivery short: the lease (the function's
# timeout plus UNDOLOG_UNDO_STALL_S), the sweep's period, a restarted worker's start.
FAULT_REACH_S = 10.0
# The faults that can cut a delivery short: those that strike a worker mid-attempt (killed,
# stopped, cut from the receiver, its link down, restarted for its clock) and the failovers (the
# record of an attempt, or its claim, lost with the old primary). A web node's, beat's or Redis's
# fault cannot: a redelivery under one of those alone is a violation.
CUTS_DELIVERIES = {("worker-receiver", "worker"), ("link-down", "worker"), ("sigkill", "worker"),
                   ("sigstop", "worker"), ("clock", "worker"), ("failover", "primary"),
                   ("partition", "primary")}


def _load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _session_of(entry: dict) -> str | None:
    parts = entry["path"].split("/")
    return parts[4] if len(parts) > 4 and parts[3] == "sessions" else None


def check(history_path: Path, receiver_path: Path, url: str, *, faults: list[dict], irreversible: set[str],
          cap: int, fleet_agent: str) -> dict:
    """The run's report: its figures and its violations (the history, the receiver's log and the
    database as the walks left it)."""
    return judge(_load(history_path), _load(receiver_path), read_state(url), faults=faults,
                 irreversible=irreversible, cap=cap, fleet_agent=fleet_agent)


def read_state(url: str) -> dict[str, dict]:
    """The final state the rules hold the answers against: effects, undo entries, runs, approvals."""
    with psycopg.connect(url, connect_timeout=5) as db:
        effects = {str(r[0]): {"session": str(r[1]), "state": r[2], "result": r[3], "tool": r[4], "step": r[5]}
                   for r in db.execute("SELECT id, session_id, state, result, tool_name, step_index "
                                       "FROM effects_effect")}
        entries = {str(r[0]): {"session": str(r[1]), "state": r[2], "effect": str(r[3]), "step": r[4],
                               "error": r[5] or ""}
                   for r in db.execute("""SELECT u.id, u.session_id, u.state, u.effect_id, e.step_index, u.last_error
                                          FROM effects_undoentry u JOIN effects_effect e ON e.id = u.effect_id""")}
        sessions = {str(r[0]): {"state": r[1], "irreversible": r[2], "agent": r[3], "error": r[4] or ""}
                    for r in db.execute("""SELECT s.id, s.state, s.irreversible_calls, a.name, s.error
                                           FROM effects_session s JOIN orgs_agent a ON a.id = s.agent_id""")}
        approvals = {str(r[0]): {"state": r[1], "effect": str(r[2]), "session": str(r[3]), "due": r[4]}
                     for r in db.execute("SELECT id, state, effect_id, session_id, timeout_at < now() "
                                         "FROM approvals_approvalrequest")}
    return {"effects": effects, "entries": entries, "sessions": sessions, "approvals": approvals}


def judge(history: list[dict], deliveries: list[dict], state: dict[str, dict], *, faults: list[dict],
          irreversible: set[str], cap: int, fleet_agent: str) -> dict:
    """Every rule over the client's history, the receiver's log and the final state (`read_state`)."""
    effects, entries, sessions, approvals = (state[k] for k in ("effects", "entries", "sessions", "approvals"))
    violations: list[dict] = []

    def violation(rule: str, **evidence) -> None:
        violations.append({"rule": rule, "evidence": evidence})

    entries_of: dict[str, list[str]] = defaultdict(list)
    for key, row in entries.items():
        entries_of[row["session"]].append(key)

    # ---- answers
    for e in history:
        if e["status"] >= 500 and not (e["status"] == 503 and e["answer"].get("error") == "database_unavailable"):
            violation("answers", request=e)

    # ---- intercepts: first answers, replays, 503s, executes and their undo entries
    created_at: dict[str, float] = {}  # session -> when its creation was acknowledged
    by_call: dict[tuple, list[dict]] = defaultdict(list)
    executes: Counter[str] = Counter()
    executed: dict[str, str] = {}  # effect -> its undo entry, as answered
    admitted: dict[str, set[str]] = defaultdict(set)  # run -> irreversible effects answered 201/202
    refused_over_cap: set[str] = set()
    held: dict[str, dict] = {}  # effect -> (session, tool) of an irreversible call answered 202 held
    for e in history:
        if e["method"] == "POST" and e["path"] == "/api/v1/sessions" and e["status"] == 201:
            created_at[e["answer"]["id"]] = e["t1"]
        if not e["path"].endswith("/intercept"):
            continue
        session = _session_of(e)
        by_call[(session, json.dumps(e["body"], sort_keys=True))].append(e)
        tool = e["body"]["tool"]
        if e["status"] == 201 and e["answer"].get("decision") == "execute":
            effect = e["answer"]["effect"]["id"]
            executes[effect] += 1
            entry = (e["answer"].get("undo_entry") or {}).get("id")
            executed[effect] = entry
            row = entries.get(entry or "")
            if row is None or row["effect"] != effect:
                violation("execute names its undo entry", request=e, entry=row)
        if tool in irreversible and e["status"] in (201, 202):
            admitted[session].add(e["answer"]["effect"]["id"])
            if e["status"] == 202 and e["answer"].get("decision") == "await_approval" \
                    and not e["answer"].get("approval", {}).get("decided_by"):
                held[e["answer"]["effect"]["id"]] = {"session": session, "tool": tool,
                                                     "approval": e["answer"]["approval"]["id"]}
        if tool in irreversible and e["status"] == 429:
            refused_over_cap.add(session)
    for effect, count in executes.items():
        if count > 1:
            violation("executed once", effect=effect, executes=count)
    replays = 0
    for attempts in by_call.values():
        served = [e for e in attempts if e["status"] in (200, 201, 202)]
        firsts = [e for e in served if e["status"] in (201, 202)]
        replays += sum(1 for e in served if e["answer"].get("decision") == "replay")
        if len({e["answer"].get("effect", {}).get("id") for e in served}) > 1 or len(firsts) > 1:
            violation("replay answers the first", answers=[(e["status"], e["answer"]) for e in served])
        if served and served[0]["status"] == 200 and served[0]["answer"].get("decision") == "replay":
            before = [a for a in attempts if a["t1"] <= served[0]["t0"]]
            if not any(a["status"] in (0, 503) for a in before):
                # The first answer this call got is a replay, and no attempt before it can have
                # recorded it: the call was recorded without being answered `execute` (or held).
                violation("replay answers the first", why="a replay of a call never answered",
                          answers=[(a["status"], a["answer"]) for a in attempts])
            # A 503 that says the outcome is unknown (its connection broke under a write) may have
            # recorded it, as may a broken connection; any other 503 said "nothing was changed".
            if any(a["status"] == 503 and a["answer"].get("outcome") != "unknown" for a in before) \
                    and not any(a["status"] == 0 or a["answer"].get("outcome") == "unknown" for a in before):
                violation("503 changed nothing", answers=[(a["status"], a["answer"]) for a in attempts])

    # ---- what the client asked of each run, and when
    rollback_asked: set[str] = set()  # any request that may roll it back was sent
    rolled_back_acked: set[str] = set()  # one was acknowledged: it must end rolled back
    completed_acked: set[str] = set()
    commits_acked: dict[str, dict] = {}
    decided: dict[str, list[dict]] = defaultdict(list)  # approval -> its decisions answered 200
    # approval -> its decisions whose answer a fault lost (a broken connection, a timeout, a 503
    # saying the outcome is unknown): each may have been applied. A 503 that says nothing was
    # changed, and any 4xx, applied nothing.
    unanswered: dict[str, list[dict]] = defaultdict(list)
    decision_attempts: dict[str, list[dict]] = defaultdict(list)  # every one, whatever its answer
    fleet: list[tuple[float, float]] = []
    for e in history:
        session = _session_of(e)
        if e["method"] != "POST":
            continue
        if session and e["path"].endswith("/fail"):
            rollback_asked.add(session)
            if e["status"] == 200:
                rolled_back_acked.add(session)
        elif session and e["path"].endswith("/complete") and e["status"] == 200:
            completed_acked.add(session)
        elif e["path"].endswith("/commit") and e["status"] == 200:
            commits_acked[e["path"].split("/")[4]] = e
        elif "/api/v1/approvals/" in e["path"] and ("/approve" in e["path"] or "/reject" in e["path"]):
            approval = e["path"].split("/")[4]
            verb = "approve" if "/approve" in e["path"] else "reject"
            rollback = "rollback=true" in e["path"]
            row = approvals.get(approval)
            if rollback and row:
                rollback_asked.add(row["session"])
            decision_attempts[approval].append({"verb": verb, "request": e})
            if e["status"] == 200:
                decided[approval].append({"verb": verb, "rollback": rollback, "request": e})
            elif e["status"] == 0 or (e["status"] == 503 and e["answer"].get("outcome") == "unknown"):
                unanswered[approval].append({"verb": verb, "rollback": rollback, "request": e})
        elif e["path"].endswith("/rollback") and "/agents/" in e["path"]:
            fleet.append((e["t0"], e["t1"], e["status"]))
    fleet_runs = {s for s, row in sessions.items() if row["agent"] == fleet_agent}
    for t0, _t1, status in fleet:
        for session in fleet_runs:
            if created_at.get(session, float("inf")) < t0:
                rollback_asked.add(session)
                if status == 200:
                    rolled_back_acked.add(session)
    if any(t0 for t0, _t1, _s in fleet):
        # A run of the fleet's agent may be taken by a rollback whose answer was lost, or one under way.
        first_fleet = min(t0 for t0, _t1, _s in fleet)
        rollback_asked |= {s for s in fleet_runs if created_at.get(s, 0) >= first_fleet}

    # ---- decisions
    # The deciding decision of each approval: the one answered 200; else, where no decision was
    # answered 200, one whose answer was lost and whose verb the request's final state names (it
    # was applied; its answer never came back). An approval decided with neither is no decision of
    # the client's: rule `expiry expires` holds it.
    deciding: dict[str, dict] = {}
    for approval, wins in decided.items():
        row = approvals.get(approval)
        if len(wins) > 1:
            violation("decided once", approval=approval, answers=[w["request"]["answer"] for w in wins])
        win = wins[0]
        expected = "approved" if win["verb"] == "approve" else "rejected"
        if row is None or row["state"] != expected:
            violation("decided once", approval=approval, decision=win["verb"], row=row)
            continue
        deciding[approval] = win
    answer_lost = 0
    for approval, attempts in unanswered.items():
        row = approvals.get(approval)
        verb = {"approved": "approve", "rejected": "reject"}.get(row["state"]) if row else None
        applied = [a for a in attempts if a["verb"] == verb]
        if approval in decided or not applied:
            continue
        answer_lost += 1
        # Rolled back only if every such attempt asked for it; otherwise a plain reject may be the
        # one applied, and the run either halts or was rolled back.
        deciding[approval] = {**applied[0], "rollback": all(a["rollback"] for a in applied), "answered": False}
    for approval, win in deciding.items():
        row = approvals[approval]
        if win["verb"] == "reject":
            effect = effects.get(row["effect"], {})
            run = sessions.get(row["session"], {})
            if effect.get("state") != "rejected":
                violation("rejection halts", approval=approval, effect=effect, answered=win.get("answered", True))
            if win["rollback"]:
                rolled_back_acked.add(row["session"])
            elif row["session"] not in rollback_asked and run.get("state") != "halted":
                violation("rejection halts", approval=approval, session=run, answered=win.get("answered", True))

    # ---- expiry
    for effect, call in held.items():
        if call["approval"] in decided or call["approval"] in deciding \
                or not approvals.get(call["approval"], {}).get("due"):
            continue  # decided (answered, or applied with its answer lost), or its deadline is still ahead
        row, run = effects.get(effect, {}), sessions.get(call["session"], {})
        if call["session"] in rollback_asked:
            continue
        if row.get("state") != "expired" or run.get("state") != "halted":
            violation("expiry expires", effect=effect, row=row, session=run, tool=call["tool"],
                      approval=approvals.get(call["approval"]), decisions=[
                          (a["verb"], a["request"]["status"], a["request"]["answer"])
                          for a in decision_attempts[call["approval"]]])

    # ---- runs the client rolled back, and the ones it completed
    for session in rolled_back_acked:
        run = sessions.get(session)
        if run is None or run["state"] not in ROLLED_BACK_END:
            violation("failed run rolled back", session=session, row=run)
            continue
        # A walk that escalates stops there: the entries older than the escalated one wait for the
        # person (pending); every newer one is undone.
        escalated = [entries[k]["step"] for k in entries_of[session]
                     if entries[k]["state"] == "compensation_failed" and entries[k]["error"]]
        if run["state"] == "compensation_failed" and not escalated:
            violation("failed run rolled back", session=session, why="compensation_failed with no escalated entry")
        waits_below = max(escalated, default=-1)
        kept = {entries[k]["effect"] for k in entries_of[session]}
        for effect_id, effect in effects.items():
            if effect["session"] == session and effect["tool"] not in irreversible and effect_id not in kept:
                violation("failed run rolled back", session=session, effect=effect_id, row=effect,
                          why="an effect of the run with no undo entry: nothing can undo it")
        for key in entries_of[session]:
            row = entries[key]
            effect = effects[row["effect"]]
            if row["state"] == "compensated" or (row["state"] == "skipped" and effect["state"] in NEVER_STARTED):
                continue
            if row["state"] == "compensation_failed" and row["error"]:
                continue  # escalated to a person, with its reason
            if row["state"] == "pending" and row["step"] < waits_below:
                continue
            violation("failed run rolled back", session=session, session_state=run["state"], entry=key, row=row,
                      effect=effect, executed=executed.get(row["effect"]) == key)

    for session in completed_acked - rollback_asked:
        run = sessions.get(session)
        undone = [k for k in entries_of[session] if entries[k]["state"] not in ("pending", "skipped")]
        if run is None or run["state"] != "completed" or undone:
            violation("completed run kept", session=session, row=run, undone=undone)

    # ---- acknowledged commits
    for effect, e in commits_acked.items():
        row = effects.get(effect)
        session = row["session"] if row else None
        kept = row is not None and (row["state"] == "committed" or (
            session in rollback_asked and row["state"] in ("compensating", "compensated", "compensation_failed")))
        if not kept or row["result"] != e["body"]["result"]:
            violation("acknowledged commit kept", request=e, row=row)

    # ---- caps and counters
    irreversible_effects: dict[str, int] = Counter(row["session"] for row in effects.values()
                                                    if row["tool"] in irreversible)
    for session, run in sessions.items():
        count = irreversible_effects.get(session, 0)
        if count > cap or len(admitted.get(session, ())) > cap:
            violation("cap", session=session, effects=count, answered=sorted(admitted.get(session, ())))
        if run["irreversible"] != count:
            violation("cap", session=session, counter=run["irreversible"], effects=count,
                      why="the run's counter is not its irreversible calls")
        if session in refused_over_cap and count < cap and run["irreversible"] < cap:
            violation("cap", session=session, why="refused over a cap it had not reached", effects=count)

    # ---- compensations at the receiver
    by_key: dict[str, list[dict]] = defaultdict(list)
    for d in sorted(deliveries, key=lambda d: d["arrived"]):
        by_key[d["key"]].append(d)
    applied_at: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    after_receiver = after_fault = gave_up = abandoned = 0
    windows = [(f["at"], f["healed"] + FAULT_REACH_S) for f in faults
               if (f["kind"], f.get("role", "worker")) in CUTS_DELIVERIES]
    for key, sent in by_key.items():
        row = entries.get(key)
        if row is None:
            violation("delivery of an entry that ran", key=key, delivery=sent[0])
            continue
        effect = effects[row["effect"]]
        if row["state"] == "skipped" or effect["state"] in NEVER_STARTED:
            violation("delivery of an entry that ran", key=key, entry=row, effect=effect)
        if row["session"] not in rollback_asked:
            violation("only rolled-back runs undone", key=key, session=sessions.get(row["session"]))
        first_applied = next((d for d in sent if d["applied"]), None)
        if first_applied is not None:
            applied_at[row["session"]].append((first_applied["arrived"], row["step"], key))
        for delivery in sent:
            # Read by the receiver at the delivery's arrival, from the kernel: an earlier delivery
            # of the key, not answered yet, whose sender still waited for it (its connection open).
            # A delivery whose own sender had hung up on arrival (`abandoned`: TCP brought it after
            # its sender gave up) has nobody waiting: it is not in flight, on either side of a pair.
            ns = {d["n"] for d in delivery.get("in_flight_with", ())}
            waited = [d for d in sent if d["n"] in ns and not d.get("abandoned")]
            if waited and not delivery.get("abandoned"):
                violation("one delivery in flight per key", key=key, delivery=delivery, in_flight=waited)
            gave_up += bool(delivery.get("gave_up_on"))
            abandoned += bool(delivery.get("abandoned"))
        for before, after in zip(sent, sent[1:], strict=False):
            if before["outcome"] in ("5xx", "drop", "stall") or before["n"] in after.get("gave_up_on", ()):
                # The receiver failed it, or answered it after its sender had given up (timed out).
                after_receiver += 1
            elif any(start <= after["arrived"] and before["arrived"] <= stop for start, stop in windows):
                after_fault += 1
            else:
                violation("redelivery explained", key=key, first=before, second=after, entry=row)
    for session, applied in applied_at.items():
        steps = [step for _, step, _ in sorted(applied)]
        if steps != sorted(steps, reverse=True):
            violation("newest first", session=session, steps_in_order=steps)

    statuses = Counter(e["status"] for e in history)
    outcomes = Counter(d["outcome"] for d in deliveries)
    return {
        "requests": len(history), "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "acknowledged_commits": len(commits_acked), "executes": len(executes), "replays": replays,
        "effects": len(effects), "sessions": len(sessions), "rollbacks_acknowledged": len(rolled_back_acked),
        "completions_acknowledged": len(completed_acked), "fleet_rollbacks": sum(1 for *_, s in fleet if s == 200),
        "approvals_decided": len(decided),
        "rejections": sum(1 for w in decided.values() if w[0]["verb"] == "reject"),
        "expired": sum(1 for e in effects.values() if e["state"] == "expired"),
        "refused_over_cap": sum(1 for e in history if e["path"].endswith("/intercept") and e["status"] == 429),
        "deliveries": len(deliveries), "deliveries_by_outcome": dict(outcomes),
        "compensations_applied": sum(1 for d in deliveries if d["applied"]),
        "redeliveries": after_receiver + after_fault, "redeliveries_after_receiver": after_receiver,
        "redeliveries_after_fault": after_fault, "resent_after_sender_gave_up": gave_up,
        "delivered_after_sender_gave_up": abandoned,
        "decisions_answer_lost": answer_lost,
        "violations": violations,
    }


def main() -> int:
    """`python -m tests.faults.checker WORK`: judge a kept run again (`make nemesis
    NEMESIS_ARGS=--keep` keeps its work directory: history, receiver's log, final state, faults)."""
    import sys

    from tests.faults import nemesis

    work = Path(sys.argv[1])
    state = json.loads((work / "state.json").read_text())
    report = judge(_load(work / "history.jsonl"), _load(work / "receiver.jsonl"), state,
                   faults=json.loads((work / "faults.json").read_text()), **nemesis.checker_options())
    print(json.dumps({k: v for k, v in report.items() if k != "violations"}, default=str))
    print(f"violations: {len(report['violations'])} {dict(Counter(v['rule'] for v in report['violations']))}")
    for v in report["violations"]:
        print(f"  {v['rule']}: {json.dumps(v['evidence'], default=str)[:3000]}")
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
