"""`make demo` works start to finish, unattended: it starts its own server (SQLite and the
embedded Redis under var/, uvicorn, a worker with beat), plays the three parts of the
account cleanup, and stops everything it started."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
from django.conf import settings

from tests.processes import BASE_DIR
from undolog_site import embedded_redis

GUIDE_REFUSAL = ("tool call: delete_account {'account_id': 'acct-103'} -> Budget limit max_irreversible_per_run "
                 "reached (limit 2); tool call 'delete_account' was not executed. Stop calling tools and give "
                 "your final answer.  [refused: BudgetExceededError]")

IN_ORDER = [
    # 1. the cap
    "ops: deleted acct-101",
    "ops: deleted acct-102",
    "permission_denied: kind=budget tool=delete_account decided_by=budget "
    "reason='budget limit max_irreversible_per_run reached (3 > 2)'",
    "budget.exceeded: max_irreversible_per_run (limit=2, current=3) -> action=pause",
    GUIDE_REFUSAL,
    "session: completed | agent: suspended (budget)",
    "accounts left: ['acct-103', 'acct-200', 'acct-201']",
    "POST /api/v1/agents/cleanup/resume -> agent active",
    # 2. approvals
    "reviewer asked: delete_account({'account_id': 'acct-101'}) -> approve",
    "ops: deleted acct-101",
    "reviewer asked: delete_account({'account_id': 'acct-102'}) -> deny",
    "permission_denied: kind=approval tool=delete_account decided_by=alice reason='acct-102 has an open invoice'",
    "tool call: delete_account {'account_id': 'acct-102'} -> DENIED: acct-102 has an open invoice",
    "session: halted | agent: active",
    "accounts left: ['acct-102', 'acct-103', 'acct-200', 'acct-201']",
    "budget: 2 of 2 irreversible calls used this run (the denied deletion counts)",
    # 3. undo
    "ops: notice to ben@example.com about acct-102 sent",
    "ops: notice to cho@example.com about acct-103 sent",
    "the run failed: ExportServiceDown: export service unavailable (HTTP 503)",
    "undo: recall_notice(account_id='acct-103') -> withdrew the notice to cho@example.com [signature ok",
    "undo: recall_notice(account_id='acct-102') -> withdrew the notice to ben@example.com [signature ok",
    "wait_compensated() -> compensated",
    "outbox: empty (2 notices sent, 2 recalled)",
    # what is left
    "accounts left: ['acct-102', 'acct-103', 'acct-200', 'acct-201']",
    "agent cleanup: active",
    "stopped the demo's server",
]


def test_it_runs_the_whole_demo_unattended_in_well_under_a_minute():
    done, var_dir = play_demo()
    assert_the_story(done.stdout)
    assert_everything_stopped(done.stdout, var_dir)


# The same story through a LangGraph agent: each held deletion pauses the graph (interrupt)
# and the run resumes once it is decided; everything else reads the same.
PAUSES = [
    "langgraph: the graph paused at delete_account({'account_id': 'acct-101'}) (interrupt)",
    "ops: deleted acct-101",
    "langgraph: the graph paused at delete_account({'account_id': 'acct-102'}) (interrupt)",
    "ops: deleted acct-102",
    "tool call: delete_account {'account_id': 'acct-102'} -> DENIED: acct-102 has an open invoice",
]


def test_it_plays_the_story_through_a_langgraph_agent():
    # The story takes as long as the scripted one (about 6 s); importing LangChain and
    # LangGraph adds seconds on a loaded machine. The bound catches a hang (a missed resume).
    done, var_dir = play_demo("--framework", "langgraph", limit=90)
    assert "the agent: a LangGraph agent (create_agent, a checkpointer)" in done.stdout
    assert_the_story(done.stdout)
    in_order(done.stdout, PAUSES)
    assert done.stdout.count("(interrupt)") == 4  # two deletions per part, paused and resumed
    assert_everything_stopped(done.stdout, var_dir)


# The guide's rewind demo (its step 7), made real through a LangGraph thread: going back to the
# thread's first checkpoint undoes the soft deletions and the notice, newest first, before the graph
# goes on; the irreversible email is named (refused without consent, then left done); the agent
# remembers nothing of the deletions, and the accounts are back.
REWIND = [
    "ops: soft-deleted acct-101 (restorable)",
    "ops: soft-deleted acct-102 (restorable)",
    "ops: notice to cho@example.com about acct-103 sent",
    "reviewer asked: email_owner({'account_id': 'acct-103'",
    "ops: emailed the owner of acct-103",
    "accounts=['acct-103', 'acct-200', 'acct-201'], notices=['acct-103']",
    "refused: 409 irreversible_in_the_way: Irreversible calls after step 0 cannot be undone: email_owner at step 5",
    "undo: recall_notice(account_id='acct-103') -> withdrew the notice to cho@example.com [signature ok",
    "undo: restore_account(account_id='acct-102') -> restored acct-102 [signature ok",
    "undo: restore_account(account_id='acct-101') -> restored acct-101 [signature ok",
    "back to step 0: 3 calls undone, newest first, before the graph went on",
    "not undone by the rewind: email_owner at step 5 (a sent email cannot be recalled)",
    "after the rewind: conversation=2 messages, tool calls this run=5 (not refunded), "
    "accounts=['acct-101', 'acct-102', 'acct-103', 'acct-200', 'acct-201'], notices=none",
    "the agent remembers 0 tool calls; it says: 'Starting over:",
    "stopped the demo's server",
]


def test_it_replays_the_guides_rewind_demo_through_a_langgraph_thread():
    done, var_dir = play_demo("--rewind", limit=90)
    in_order(done.stdout, REWIND)
    assert done.stdout.count("undo: ") == 3  # each compensation once
    assert "── 1. A cap" not in done.stdout  # the rewind demo alone
    assert_everything_stopped(done.stdout, var_dir)


def play_demo(*args: str, limit: float = 45) -> tuple[subprocess.CompletedProcess, Path]:
    var_dir = Path(settings.VAR_DIR) / f"test-demo-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_")}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sdk.demo", "--own-server", "--var-dir", str(var_dir), *args],
                          cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert took < limit, took
    return done, var_dir


def in_order(stdout: str, expected_lines: list[str]) -> None:
    lines = stdout.splitlines()
    at = 0
    for expected in expected_lines:  # each key line, in this order
        found = next((n for n in range(at, len(lines)) if expected in lines[n]), None)
        assert found is not None, f"missing after line {at}: {expected!r}\n{stdout}"
        at = found + 1


def assert_the_story(stdout: str) -> None:
    in_order(stdout, IN_ORDER)
    assert stdout.count("ops: deleted") == 3  # two in part 1, one in part 2
    assert stdout.count("reviewer asked:") == 2  # the cap kept the third from the reviewer


def assert_everything_stopped(stdout: str, var_dir: Path) -> None:
    """Everything the demo started is gone: the server's port is closed, the Redis socket silent."""
    url = re.search(r"on its own server at (http://\S+)", stdout).group(1)
    try:
        httpx.get(f"{url}/healthz", timeout=1)
        raise AssertionError("the demo's server still answers")
    except httpx.ConnectError:
        pass
    assert not embedded_redis.answers(var_dir / "redis.sock")
    shutil.rmtree(var_dir, ignore_errors=True)


def test_make_demo_then_make_demo_js_find_make_run_on_its_port_and_keep_to_an_org_of_their_own():
    """`PORT=… make run` in one terminal, `PORT=… make demo` then `PORT=… make demo-js` in another:
    each demo attaches to that server (no server of its own), plays in its own org, and leaves the
    tour's org alone. After `make demo` the admin belongs to two orgs: the TypeScript demo names its
    org (X-Undolog-Org) as the Python one does, and a rerun revokes its previous agent key."""
    import signal
    import sqlite3

    from sdk.demo.server import free_port, is_up

    var_dir = Path(settings.VAR_DIR) / f"test-make-run-{os.getpid()}"
    shutil.rmtree(var_dir, ignore_errors=True)
    port = free_port()
    # Not the test run's database or broker: `make test DATABASE_URL=…` hands its variables to
    # every make below it through MAKEFLAGS, so those go too.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("UNDOLOG_") and k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE",
                                                          "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.update(UNDOLOG_VAR_DIR=str(var_dir), PORT=str(port))
    var_dir.mkdir(parents=True)
    with (var_dir / "make-run.log").open("wb") as log:
        run = subprocess.Popen(["make", "-s", "run"], cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not is_up(f"http://127.0.0.1:{port}"):
            assert run.poll() is None and time.monotonic() < deadline, (var_dir / "make-run.log").read_text()
            time.sleep(0.2)
        done = subprocess.run(["make", "-s", "demo"], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                              timeout=120)
        done_js = [subprocess.run(["make", "-s", "demo-js"], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                                  timeout=120) for _ in range(2)]
    finally:
        os.killpg(run.pid, signal.SIGTERM)
        run.wait(timeout=30)
    with sqlite3.connect(var_dir / "undolog.sqlite3") as db:
        tools = dict(db.execute("SELECT o.slug, count(t.id) FROM orgs_organization o "
                                "LEFT JOIN effects_tool t ON t.org_id = o.id GROUP BY o.slug").fetchall())
        live_keys = db.execute("SELECT k.name, count(*) FROM orgs_agentkey k JOIN orgs_agent a ON a.id = k.agent_id "
                               "JOIN orgs_organization o ON o.id = a.org_id WHERE o.slug = 'cleanup-demo' "
                               "AND k.revoked_at IS NULL GROUP BY k.name").fetchall()
    shutil.rmtree(var_dir, ignore_errors=True)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"on the server already running at http://127.0.0.1:{port}" in done.stdout
    assert "starting one of its own" not in done.stdout
    assert "org cleanup-demo (the demo's own: the tour's org demo is left alone)" in done.stdout
    assert "reset to the guide's five" in done.stdout
    assert "wait_compensated() -> compensated" in done.stdout
    assert tools["demo"] == 0 and tools["cleanup-demo"] >= 5, tools
    for run_js in done_js:
        assert run_js.returncode == 0, run_js.stdout[-3000:] + run_js.stderr[-3000:]
        assert "the server already running" in run_js.stdout and "a server of its own" not in run_js.stdout
        assert "403" not in run_js.stdout + run_js.stderr
    assert sorted(live_keys) == [("make demo", 1), ("make demo-js", 1)]  # the rerun revoked its first key
