"""The account cleanup of the reference guide (irreversible-cap-guide.txt), end to end
against a real undolog server, with the SDK and a scripted agent instead of a model.

1. A cap of 2 irreversible calls per run: two accounts deleted, the third refused with the
   budget message, the agent paused after the run (the guide's step 3).
2. The same run with a reviewer in front of every deletion: one approved, one denied
   (the guide's step 5).
3. Compensable notices: the run fails and the worker recalls the two notices already sent.

``framework="langgraph"`` plays the same script through a LangGraph agent (frameworks.py).
``rewind=True`` plays the guide's rewind demo instead (its step 7), made real: a LangGraph agent
soft-deletes two accounts, posts a notice and sends an email; going back in its thread undoes
the deletions and the notice (the email is named as not undone), and the agent remembers nothing.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from undolog import RewindRefused, Session, UndoLogClient, WaitInfo, spec_of
from undolog.testing import ScriptedAgent, Transcript

from . import ops
from .ops import INACTIVE, REWIND_TOOLS, TOOLS, ExportServiceDown, Ops, Recalls
from .people import Person, Reviewer
from .server import Server

DELETE_ALL = [("delete_account", {"account_id": a}) for a in INACTIVE]
CAP = 2


class Demo:
    def __init__(self, server: Server, var_dir: Path, *, interactive: bool = False,
                 say: Callable[[str], None] = print, framework: str = "scripted",
                 rewind: bool = False) -> None:
        creds = server.credentials
        self.server, self.interactive, self.say = server, interactive, say
        self.framework, self.rewinding = framework, rewind
        # Unattended, no call waits more than a minute for a decision; a person may take longer.
        self.client = UndoLogClient(server.url, creds["agent_key"], on_wait=self.waiting,
                                    poll_wait=5, approval_timeout=None if interactive else 60)
        self.admin = Person(server.url, creds["admin_token"], creds["org"])
        self.alice = Person(server.url, creds["reviewer_token"], creds["org"])
        self.ops = Ops(var_dir / "accounts.json", say)
        ops.use(self.ops)
        self.recalls = Recalls(self.ops, creds["webhook_secret"])
        self.waited: set[str] = set()
        self.sessions: list[Session] = []
        self.graph = None
        if framework == "langgraph":  # imported only when asked: it needs undolog[langchain]
            from .frameworks import GraphAgent

            self.graph = GraphAgent(self.client, TOOLS, say)

    def close(self) -> None:
        self.recalls.close()
        self.client.close()
        self.admin.close()
        self.alice.close()

    # -- the story -------------------------------------------------------------------

    def run(self) -> None:
        self.setup()
        if self.rewinding:
            self.rewind()
        else:
            self.cap()
            self.approvals()
            self.undo()
        self.left()

    def setup(self) -> None:
        where = "its own server" if self.server.own else "the server already running"
        self.say(f"undolog demo: the account cleanup of the irreversible-cap guide, on {where} "
                 f"at {self.server.url}")
        org = self.server.credentials["org"]
        self.say(f"  org {org} (the demo's own: the tour's org demo is left alone) · "
                 "agent cleanup (a fresh key) · admin sets budgets · reviewer alice decides")
        if not self.rewinding:
            self.say("  The accounts (a file, like the guide's reset_db.py) are reset to the\n"
                     "  guide's five before parts 1 and 2, so each starts from the same data;\n"
                     "  part 3 carries on from part 2.")
        if self.graph is not None:
            self.say("  the agent: a LangGraph agent (create_agent, a checkpointer) driven by "
                     "LangChain's fake chat model,\n  its plain tools tiered by UndologMiddleware")
        if self.client.get_budget("cleanup")["state"] != "active":
            self.admin.post("/api/v1/agents/cleanup/resume", {"note": "the demo starts over"})
        limits = {"max_irreversible_per_run": CAP, "on_exceeded": "pause"}
        self.admin.patch("/api/v1/agents/cleanup/budget", {**limits, "mode": "enforce"})
        self.say(f"  PATCH /api/v1/agents/cleanup/budget {json.dumps(limits)}")
        self.client.register_compensation("recall_notice", "1.0.0", "webhook", self.recalls.url)
        for tool in self.client.register(*TOOLS):
            self.say(f"  registered {tool['name']:<22} {tool['tier']:<12} "
                     f"weight {tool['cost_weight']:g}")
        self.say("  recall_notice (the undo of notify_owner): a webhook this demo serves at "
                 f"{self.recalls.url}")

    def cap(self) -> None:
        self.heading(f"1. A cap of {CAP} irreversible calls per run")
        self.say("Nobody watches this run: delete_account and email_owner auto-approve when\n"
                 "their 1 s approval deadline passes, so the budget is the only guard\n"
                 "(the guide's step 3).")
        self.ops.reset()
        self.say("  (accounts reset: acct-101, -102, -103 inactive; acct-200, -201 active)")
        self.client.register(*(unattended(tool) for tool in (ops.delete_account, ops.email_owner)))
        transcript, session = self.play([
            [("list_inactive_accounts", {})],
            DELETE_ALL,
            [("email_owner", {"account_id": "acct-103", "message": "Your account goes away."})],
            "Deleted acct-101 and acct-102; acct-103 is still inactive: the budget refused it.",
        ])
        self.report(transcript, session)
        self.admin.post("/api/v1/agents/cleanup/resume", {"note": "run reviewed"})
        self.say(f"  POST /api/v1/agents/cleanup/resume -> agent {self.agent_state()}")

    def approvals(self) -> None:
        self.heading("2. A reviewer in front of every deletion, inside the same cap")
        self.ops.reset()
        self.say("  (accounts reset to the guide's five: part 1's deletions are put back)")
        self.client.register(ops.delete_account, ops.email_owner)  # as declared: a person decides
        reviewer = None
        if self.interactive:
            self.say(f"Decide in the dashboard, {self.server.url}/ (log in as admin / admin):\n"
                     "approve the deletion of acct-101, deny acct-102 with a reason.")
        else:
            self.say("alice approves the first request and denies the second, through the "
                     "reviewer API.")
            answers = [("approve", None), ("reject", "acct-102 has an open invoice")]
            reviewer = Reviewer(self.alice, answers, self.say)
        script = [[("list_inactive_accounts", {})], DELETE_ALL,
                  "acct-101 deleted; acct-102 denied by the reviewer."]
        transcript, session = self.play(script, reviewer)
        self.report(transcript, session)
        budget = self.client.get_budget("cleanup")
        self.say(f"  budget: {budget['usage']['irreversible_run']} of "
                 f"{budget['limits']['max_irreversible_per_run']} irreversible calls used this run "
                 "(the denied deletion counts)")
        self.say("  A denial halts the run in undolog, so acct-103 never reached the reviewer "
                 "either.")

    def undo(self) -> None:
        self.heading("3. Undo: compensable notices, recalled when the run fails")
        self.say("The agent tells the owners of the accounts still inactive, in the app, that\n"
                 "their account goes away in 30 days (notify_owner, COMPENSABLE), then exports\n"
                 "their data; the export service is down.")
        left = [a for a in INACTIVE if a in self.ops.accounts()][:CAP]  # what the agent would list
        notice = "Your account will be deleted in 30 days."
        script = [[("list_inactive_accounts", {})],
                  [("notify_owner", {"account_id": a, "message": notice}) for a in left],
                  [("export_account", {"account_id": left[0]})],
                  "never reached"]
        try:
            self.play(script)
        except ExportServiceDown as exc:
            self.say(f"  the run failed: ExportServiceDown: {exc}")
        session = self.sessions[-1]
        self.say(f"  session: {session.state}; the worker walks its undo stack, newest first")
        outcome = session.wait_compensated(timeout=30)
        self.say(f"  wait_compensated() -> {outcome['state']}")
        for entry in outcome["undo_stack"]:
            self.say(f"  undo stack: step {entry['step_index']} {entry['fn_name']}"
                     f"({entry['args']}) {entry['state']} after {entry['attempts']} attempt(s)")
        self.say(f"  outbox: {sorted(self.ops.outbox) or 'empty'} ({len(left)} notices sent, "
                 f"{len(self.recalls.handled)} recalled)")

    def rewind(self) -> None:
        self.heading("Rewind: the agent's memory and the world, back to the same step")
        self.say("The guide's rewind restores the agent's memory, not the deleted rows (its\n"
                 "rewind_demo.py). Here a LangGraph agent (create_agent, a checkpointer) cleans\n"
                 "up with tools that can be undone: soft_delete_account (restore_account puts\n"
                 "an account back) and notify_owner (recall_notice); and one that cannot:\n"
                 "email_owner.")
        from .frameworks import GraphAgent  # it needs undolog[langchain]

        self.ops.reset()
        self.say("  (accounts reset to the guide's five)")
        self.client.register_compensation("restore_account", "1.0.0", "webhook",
                                          self.recalls.restore_url)
        self.client.register(*REWIND_TOOLS)
        graph = GraphAgent(self.client, REWIND_TOOLS, self.say)
        notice = "Your account will be deleted in 30 days."
        script = [[("list_inactive_accounts", {})],
                  [("soft_delete_account", {"account_id": "acct-101"}),
                   ("soft_delete_account", {"account_id": "acct-102"})],
                  [("notify_owner", {"account_id": "acct-103", "message": notice})],
                  [("email_owner", {"account_id": "acct-103", "message": notice})],
                  "Deleted acct-101 and acct-102; the owner of acct-103 has a notice and an email."]
        then = ["Starting over: acct-101, acct-102 and acct-103 are inactive; nothing is deleted."]
        reviewer = Reviewer(self.alice, [("approve", None)], self.say)
        _, session = self.play_graph(script, reviewer, graph=graph, then=then)
        self.snapshot("after the run   ", graph, session.id)

        self.say("Back to the thread's first checkpoint (get_state_history, then invoke with its\n"
                 "config), inside thread_session:")
        first = _only_the_ask
        try:
            graph.travel(first)
        except RewindRefused as exc:
            self.say(f"  refused: 409 {exc.code}: {exc.message}")
        self.say("  again, with leave_irreversible=True (the email stays sent):")
        run, _ = graph.travel(first, leave_irreversible=True)
        answer = run.rewound or {}
        undone = len(answer.get("to_undo", []))
        self.say(f"  rewind: run {str(run.session.id)[:8]} from step {answer.get('from_step')} "
                 f"back to step {answer.get('resumes_at')}: {undone} calls undone, newest first, "
                 "before the graph went on")
        for item in answer.get("left_done", []):
            self.say(f"  not undone by the rewind: {item['tool']} at step {item['step_index']} "
                     "(a sent email cannot be recalled)")
        self.snapshot("after the rewind", graph, run.session.id)
        remembered = [m for m in graph.memory() if getattr(m, "tool_calls", None)]
        self.say(f"  the agent remembers {len(remembered)} tool calls; it says: "
                 f"{graph.memory()[-1].content!r}")

    def snapshot(self, label: str, graph: Any, session_id: str) -> None:
        """As the guide's snapshot(): the conversation, the run's tool calls, the accounts."""
        run = self.client.get_session(session_id)
        self.say(f"  {label}: conversation={len(graph.memory())} messages, tool calls this run="
                 f"{run['budget']['tool_calls']} (not refunded), accounts={self.ops.live()}, "
                 f"notices={sorted(self.ops.outbox) or 'none'}")

    def left(self) -> None:
        self.heading("What is left")
        self.say(f"accounts left: {sorted(self.ops.accounts())}")
        self.say(f"notices outstanding: {sorted(self.ops.outbox) or 'none'}")
        self.say(f"agent cleanup: {self.agent_state()}")
        self.say("runs: " + " · ".join(f"{s.id[:8]} {s.state}" for s in self.sessions))

    # -- helpers -----------------------------------------------------------------------

    def play(self, script: list[Any],
             reviewer: Reviewer | None = None) -> tuple[Transcript, Session]:
        """One run of the scripted agent in a session of its own."""
        if self.graph is not None:
            return self.play_graph(script, reviewer)
        agent = ScriptedAgent(script, tools=TOOLS)
        try:
            with self.client.session(agent="cleanup") as session:
                self.sessions.append(session)
                if reviewer is not None:
                    reviewer.session_id = session.id
                    reviewer.start()
                transcript = agent.run_sync()
        finally:
            if reviewer is not None:
                reviewer.stop()
        return transcript, session

    def play_graph(self, script: list[Any], reviewer: Reviewer | None, *, graph: Any = None,
                   then: list[Any] | None = None) -> tuple[Transcript, Session]:
        """One run of the LangGraph agent: one thread, one session (resumed after a pause)."""

        def opened(session: Session) -> None:
            self.sessions.append(session)
            if reviewer is not None:
                reviewer.session_id = session.id
                reviewer.start()

        try:
            transcript, session = (graph or self.graph).play(script, opened, then=then or ())
        finally:
            if reviewer is not None:
                reviewer.stop()
        self.sessions[-1] = session  # the resumed run's Session knows how it ended
        return transcript, session

    def report(self, transcript: Transcript, session: Session) -> None:
        """As the guide's report(): refusals, the tool calls, the answer, states, accounts."""
        for refusal in self.admin.refusals(session.id):
            self.say(f"  permission_denied: kind={refusal['kind']} tool={refusal['tool_name']} "
                     f"decided_by={refusal['decided_by']} reason={refusal['reason']!r}")
        events = self.admin.get("/api/v1/events", session=session.id, kind="budget.exceeded")
        for event in events["events"]:
            data = event["data"]
            self.say(f"  budget.exceeded: {data['limit']} (limit={data['limit_value']}, "
                     f"current={data['current']}) -> action={data['action']}")
        for call in transcript.calls:
            refused = f"  [refused: {type(call.error).__name__}]" if call.refused else ""
            result = call.result if call.refused else repr(call.result)
            self.say(f"  tool call: {call.tool} {call.args} -> {result}{refused}")
        self.say(f"  agent: {transcript.answer}")
        self.say(f"  session: {session.state} | agent: {self.agent_state()}")
        self.say(f"  accounts left: {sorted(self.ops.accounts())}")

    def waiting(self, info: WaitInfo) -> None:
        """The SDK's on_wait: one line per call that waits for a decision."""
        if info.effect_id in self.waited or info.state != "pending":
            return
        self.waited.add(info.effect_id)
        left = ""
        if info.timeout_at:
            deadline = dt.datetime.fromisoformat(info.timeout_at)
            seconds = (deadline - dt.datetime.now(dt.timezone.utc)).total_seconds()
            left = f", deadline in {max(0, round(seconds))} s"
        self.say(f"  undolog: {info.tool} waits for a decision (long poll{left})")

    def agent_state(self) -> str:
        budget = self.client.get_budget("cleanup")
        reason = f" ({budget['suspend_reason']})" if budget.get("suspend_reason") else ""
        return f"{budget['state']}{reason}"

    def heading(self, title: str) -> None:
        self.say(f"\n── {title} " + "─" * max(0, 76 - len(title)))


def _only_the_ask(snapshot: Any) -> bool:
    """The checkpoint where the agent's memory is the request alone, its first turn next."""
    return len(snapshot.values.get("messages", [])) == 1 and bool(snapshot.next)


def unattended(tool: Any) -> Any:
    """The tool's spec, auto-approved once its 1 s deadline passes: nobody is watching."""
    spec = spec_of(tool)
    return replace(spec, approval=replace(spec.approval, timeout_s=1, auto_approve_on_timeout=True))
