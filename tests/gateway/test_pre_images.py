"""Undo by pre-image through the gateway (issue 42), against the official filesystem MCP server
from the npm registry (tests/gateway/npm): a real MCP client → `undolog gateway` (a real
process, `preset = "filesystem"`) → @modelcontextprotocol/server-filesystem → a scratch
directory, with the real undolog server and worker.

Every file byte for byte what it was after a rollback; a file someone changed after the run
wrote it is not overwritten (a person decides, with both digests); a pre-image over its bound
holds the call for a person."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import anyio
import pytest

from approvals.models import ApprovalRequest
from effects.models import Effect, PreImage, Session, UndoEntry
from tests.processes import BASE_DIR

pytestmark = [pytest.mark.django_db(transaction=True)]

NPM = BASE_DIR / "tests" / "gateway" / "npm"
FILESYSTEM = NPM / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"


@pytest.fixture(scope="session")
def filesystem_server() -> Path:
    """The official server, installed from the lock file (`make gateway-npm` does the same)."""
    if not FILESYSTEM.exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NPM, check=True,
                       timeout=300)
    return FILESYSTEM


@pytest.fixture
def files(tmp_path, harness, filesystem_server):
    """The gateway fronting the filesystem server on a scratch directory with three files."""
    root = (tmp_path / "project").resolve()
    root.mkdir()
    (root / "a.txt").write_bytes("line one\nline two é\n".encode())
    (root / "b.md").write_bytes(b"# Title\r\n\r\nold paragraph\r\n")  # CRLF, kept byte for byte
    (root / "c.txt").write_bytes(b"to be moved\n")
    gateway = harness(approval_wait_s=2)
    gateway.config.write_text(gateway.config.read_text().split("[servers.tracker]")[0] + f"""
[servers.files]
command = {json.dumps([shutil.which("node"), str(filesystem_server), str(root)])}
preset = "filesystem"
""")
    gateway.root = root
    return gateway


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def digest_of(content: str) -> str:
    body = json.dumps({"content": content}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def text(result) -> str:
    return "\n".join(block.text for block in result.content)


def session_of(persona) -> Session:
    return Session.objects.filter(org=persona.org).order_by("-created").first()


async def wait_for(check, timeout: float = 40):
    with anyio.fail_after(timeout):  # the database is read from a thread: Django is sync here
        while not (value := await anyio.to_thread.run_sync(check)):
            await anyio.sleep(0.1)
    return value


def state_of(persona) -> str:
    session = session_of(persona)
    return session.state if session else ""


def test_a_rollback_leaves_every_file_byte_for_byte_as_it_was(files, acme):
    root, before = files.root, snapshot(files.root)

    async def scenario():
        async with files.client() as client:
            tiers = {t.name for t in (await client.list_tools()).tools}
            assert {"write_file", "edit_file", "move_file", "create_directory", "read_text_file"} <= tiers
            calls = [
                ("write_file", {"path": str(root / "a.txt"), "content": "rewritten by the agent\n"}),
                ("write_file", {"path": str(root / "new.txt"), "content": "a new file\n"}),
                ("edit_file", {"path": str(root / "b.md"), "edits": [{"oldText": "old paragraph",
                                                                      "newText": "new paragraph"}]}),
                ("create_directory", {"path": str(root / "archive")}),
                ("move_file", {"source": str(root / "c.txt"), "destination": str(root / "archive" / "c.txt")}),
                ("write_file", {"path": str(root / "archive" / "notes.txt"), "content": "x"}),
            ]
            for name, args in calls:
                result = await client.call_tool(name, args)
                assert not result.is_error, (name, text(result))
            assert snapshot(root) != before
            failed = await client.call_tool("undolog_fail_run", {"reason": "the agent edited the wrong project"})
            assert not failed.is_error, text(failed)
            await wait_for(lambda: state_of(acme) == "compensated" or state_of(acme) == "compensation_failed")

    anyio.run(scenario)

    session = session_of(acme)
    assert session.state == "compensated", "; ".join(f"{e.fn_name} {e.state} {e.last_error}" for e in
                                                     UndoEntry.objects.filter(session=session))
    assert snapshot(root) == before  # new files and directories gone, the moved file back, CRLF kept
    assert set(Effect.objects.filter(session=session).values_list("state", flat=True)) == {"compensated"}
    assert PreImage.objects.filter(session=session).count() == 6


def test_a_file_changed_by_someone_else_after_the_runs_write_goes_to_a_person(files, acme):
    root = files.root

    async def scenario():
        async with files.client() as client:
            result = await client.call_tool("write_file", {"path": str(root / "a.txt"), "content": "the run's text\n"})
            assert not result.is_error, text(result)
            (root / "a.txt").write_text("a person's later edit\n")  # not through the gateway
            await client.call_tool("undolog_fail_run", {"reason": "rolled back"})
            await wait_for(lambda: state_of(acme) == "compensation_failed")

    anyio.run(scenario)

    assert (root / "a.txt").read_text() == "a person's later edit\n"  # not overwritten
    entry = UndoEntry.objects.get(session=session_of(acme))
    assert entry.state == "compensation_failed"
    assert digest_of("the run's text\n") in entry.last_error  # what this run wrote
    assert digest_of("a person's later edit\n") in entry.last_error  # what is there now
    assert "later edit" not in entry.last_error


def test_a_pre_image_over_the_bound_holds_the_call_for_a_person(files, acme):
    root = files.root
    big = "0123456789abcdef" * 20_000  # 320,000 bytes: over the preset's 256 KiB
    (root / "big.txt").write_text(big)

    async def scenario():
        async with files.client() as client:
            result = await client.call_tool("write_file", {"path": str(root / "big.txt"), "content": "short"})
            assert result.is_error and "approval" in text(result), text(result)

    anyio.run(scenario)

    assert (root / "big.txt").read_text() == big  # it has not run
    effect = Effect.objects.get(session=session_of(acme))
    assert effect.state == "pending"
    approval = ApprovalRequest.objects.get(effect=effect)
    assert "over its bound of 262144" in approval.why[0]["message"]
    kept = PreImage.objects.get(entry__effect=effect)
    assert kept.held and kept.value() == {"content": big}  # its undo is kept before it may run


# ---------------------------------------------------------------- one SAFE read a call


def logged(command: list[str], log: Path) -> list[str]:
    """The upstream's command with what the gateway sends it copied to `log` (JSON-RPC lines)."""
    return ["sh", "-c", 'tee -a "$0" | exec "$@"', str(log), *command]


def tool_calls(log: Path) -> list[str]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [m["params"]["name"] for m in lines if m.get("method") == "tools/call"]


EDITS = [  # the file before, and the edits: the server's exact, line-ending and indentation rules
    (b"alpha\nbeta\ngamma\n", [{"oldText": "beta", "newText": "BETA"}]),
    (b"# Title\r\n\r\nold paragraph\r\n", [{"oldText": "old paragraph", "newText": "new\r\nparagraph"}]),
    (b"def f():\n    if x:\n        return 1\n",
     [{"oldText": "if x:\n    return 1", "newText": "if y:\n    return 2\n    # done"}]),
    (b"def f():\n\tif x:\n\t\treturn 1\n", [{"oldText": "  if x:\n      return 1", "newText": "if y:\n  return 2"}]),
    (b"class A:\n    def f(self):\n        return 1\n",
     [{"oldText": "def f(self):\n  return 1", "newText": "def g(self):\n      return 2\n  # relative"}]),
    (b"price: 10\n", [{"oldText": "10", "newText": "$& and $$ and $` and $' and $1"}]),
    (b"a\nb\nc\nb\n", [{"oldText": "b", "newText": "B"}, {"oldText": "c\nb", "newText": "C"}]),
    (b"unchanged\n", [{"oldText": "unchanged", "newText": "dry"}], True),
]


def test_an_edit_reads_the_file_once_and_its_after_image_is_what_the_server_wrote(files, acme):
    """The after-image of an edit is worked out before the call (gateway/after.py): for each of the
    server's editing rules, its digest is the digest of the file as the real server left it, and
    the upstream sees one read_text_file per edit_file, none after it."""
    root, log = files.root, files.root.parent / "upstream.log"
    config = files.config.read_text()
    server_command = json.loads(config.split("[servers.files]\ncommand = ")[1].split("\n")[0])
    files.config.write_text(config.replace(json.dumps(server_command), json.dumps(logged(server_command, log))))

    async def scenario():
        async with files.client() as client:
            for n, (content, edits, *dry) in enumerate(EDITS):
                path = root / f"edit{n}.txt"
                path.write_bytes(content)
                args = {"path": str(path), "edits": edits, **({"dryRun": True} if dry else {})}
                result = await client.call_tool("edit_file", args)
                assert not result.is_error, (n, text(result))

    anyio.run(scenario)

    kept = list(PreImage.objects.filter(session=session_of(acme)).order_by("entry__step_index"))
    assert len(kept) == len(EDITS)
    for n, pre in enumerate(kept):
        after = (root / f"edit{n}.txt").read_bytes().decode()
        assert pre.after_digest == digest_of(after), (n, after)
        assert pre.before_digest == digest_of(EDITS[n][0].decode())
    assert tool_calls(log) == ["read_text_file", "edit_file"] * len(EDITS)


# ---------------------------------------------------------------- the memory server's graph

MEMORY = NPM / "node_modules" / "@modelcontextprotocol" / "server-memory" / "dist" / "index.js"


def graph(path: Path) -> tuple[list, list]:
    """The graph file as sets: entities (with their observations, in order) and relations."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    key = lambda row: json.dumps(row, sort_keys=True)  # noqa: E731
    entities = sorted((r for r in rows if r["type"] == "entity"), key=key)
    relations = sorted((r for r in rows if r["type"] == "relation"), key=key)
    return entities, relations


def test_a_rollback_puts_the_memory_graph_back(tmp_path, harness, filesystem_server, acme):
    store = tmp_path / "memory.jsonl"
    store.write_text("\n".join(json.dumps(row) for row in [
        {"type": "entity", "name": "Ana", "entityType": "person", "observations": ["likes tea", "works at Acme"]},
        {"type": "entity", "name": "Acme", "entityType": "company", "observations": []},
        {"type": "relation", "from": "Ana", "to": "Acme", "relationType": "works_at"},
    ]) + "\n")
    before = graph(store)
    gateway = harness()
    gateway.config.write_text(gateway.config.read_text().split("[servers.tracker]")[0] + f"""
[servers.memory]
command = {json.dumps([shutil.which("node"), str(MEMORY)])}
env = {{ MEMORY_FILE_PATH = {json.dumps(str(store))} }}
preset = "memory"
""")

    async def scenario():
        async with gateway.client() as client:
            calls = [
                ("create_entities", {"entities": [{"name": "Ben", "entityType": "person", "observations": ["new"]},
                                                  {"name": "Ana", "entityType": "person", "observations": []}]}),
                ("add_observations", {"observations": [{"entityName": "Ana", "contents": ["moved to Lyon"]}]}),
                ("create_relations", {"relations": [{"from": "Ben", "to": "Ana", "relationType": "knows"}]}),
                ("delete_observations", {"deletions": [{"entityName": "Ana", "observations": ["likes tea"]}]}),
                ("delete_entities", {"entityNames": ["Acme"]}),
            ]
            for name, args in calls:
                result = await client.call_tool(name, args)
                assert not result.is_error, (name, text(result))
            assert graph(store) != before
            await client.call_tool("undolog_fail_run", {"reason": "wrong memories"})
            await wait_for(lambda: state_of(acme) in ("compensated", "compensation_failed"))

    anyio.run(scenario)

    session = session_of(acme)
    assert session.state == "compensated", "; ".join(f"{e.fn_name} {e.state} {e.last_error}" for e in
                                                     UndoEntry.objects.filter(session=session))
    assert graph(store) == before


# ---------------------------------------------------------------- the README's example, as it is

README = BASE_DIR / "README.md"


def readme_example() -> tuple[str, str]:
    """The README's pre-image example, cut where its rollback begins: (up to the rewind, the rest)."""
    text = README.read_text()
    block = text.split("<!-- example: pre-image-edits", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    cut = block.index('await session.call_tool("undolog_fail_run"')
    return block[:cut], block[cut:]


class Checked:
    """The client session, failing the test on any tool result that is an error."""

    def __init__(self, session) -> None:
        self.session = session

    async def call_tool(self, name: str, args: dict):
        result = await self.session.call_tool(name, args)
        assert not result.is_error, (name, text(result))
        return result


async def run_block(code: str, root: Path, session) -> None:
    """The block run as a reader would paste it, its top-level awaits included."""
    import ast

    compiled = compile(code.replace("/home/me/project", str(root)), "README.md", "exec",
                       flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    pending = eval(compiled, {"session": Checked(session)})
    if pending is not None:
        await pending


def test_the_readme_example_undoes_a_coding_agents_edits_by_a_rewind_and_by_a_rollback(tmp_path, harness,
                                                                                        filesystem_server, acme):
    root = (tmp_path / "project").resolve()
    root.mkdir()
    (root / "app.py").write_bytes(b"print('v1')\n")
    (root / "README.md").write_bytes(b"# Project v1\r\n\r\nSome text.\r\n")
    before = snapshot(root)
    gateway = harness()
    gateway.config.write_text(gateway.config.read_text().split("[servers.tracker]")[0] + f"""
[servers.files]
command = {json.dumps([shutil.which("node"), str(filesystem_server), str(root)])}
preset = "filesystem"
""")
    to_rewind, to_roll_back = readme_example()
    seen = {}

    async def scenario():
        async with gateway.client() as client:
            await run_block(to_rewind, root, client)
            seen["after the rewind"] = snapshot(root)
            await run_block(to_roll_back, root, client)
            await wait_for(lambda: state_of(acme) in ("compensated", "compensation_failed"))

    anyio.run(scenario)

    assert seen["after the rewind"] == {**before, "app.py": b"print('v2')\n"}  # README.md with its CRLF
    session = session_of(acme)
    assert session.state == "compensated", "; ".join(f"{e.fn_name} {e.state} {e.last_error}" for e in
                                                     UndoEntry.objects.filter(session=session))
    assert snapshot(root) == before
    assert session.rewinds == 1


GRAPH_CALLS = [  # each memory tool, on entities that exist and do not, with duplicates and no-ops
    ("create_entities", {"entities": [{"name": "Ben", "entityType": "person", "observations": ["new"]},
                                      {"name": "Ana", "entityType": "robot", "observations": ["ignored"]}]}),
    ("add_observations", {"observations": [{"entityName": "Ana", "contents": ["moved", "likes tea", "moved"]}]}),
    ("create_relations", {"relations": [{"from": "Ben", "to": "Ana", "relationType": "knows"},
                                        {"from": "Ana", "to": "Acme", "relationType": "works_at"},
                                        {"from": "Ghost", "to": "Ana", "relationType": "haunts"}]}),
    ("delete_observations", {"deletions": [{"entityName": "Ana", "observations": ["likes tea", "never said"]},
                                           {"entityName": "Nobody", "observations": ["x"]}]}),
    ("delete_relations", {"relations": [{"from": "Ana", "to": "Acme", "relationType": "works_at"},
                                        {"from": "Ben", "to": "Ana", "relationType": "unknown"}]}),
    ("delete_entities", {"entityNames": ["Acme", "Nobody"]}),
]


def test_a_memory_call_reads_the_graph_once_and_its_after_image_is_what_a_read_after_finds(
        tmp_path, harness, filesystem_server, acme):
    from undolog.gateway.preimages import MEMORY as DECLARED
    from undolog.gateway.preimages import _unordered
    from undolog.preimages import digest, render

    store, log = tmp_path / "memory.jsonl", tmp_path / "upstream.log"
    store.write_text("\n".join(json.dumps(row) for row in [
        {"type": "entity", "name": "Ana", "entityType": "person", "observations": ["likes tea", "works at Acme"]},
        {"type": "entity", "name": "Acme", "entityType": "company", "observations": []},
        {"type": "relation", "from": "Ana", "to": "Acme", "relationType": "works_at"},
    ]) + "\n")
    gateway = harness()
    gateway.config.write_text(gateway.config.read_text().split("[servers.tracker]")[0] + f"""
[servers.memory]
command = {json.dumps(logged([shutil.which("node"), str(MEMORY)], log))}
env = {{ MEMORY_FILE_PATH = {json.dumps(str(store))} }}
preset = "memory"
trusted = true  # its reads are SAFE: the test reads the graph through the gateway
""")
    found = []

    async def scenario():
        async with gateway.client() as client:
            for name, args in GRAPH_CALLS:
                result = await client.call_tool(name, args)
                assert not result.is_error, (name, text(result))
                names = render(DECLARED[name]["before"]["args"], args)["names"]
                read = await client.call_tool("open_nodes", {"names": names})  # the test's own read
                assert not read.is_error, text(read)
                found.append(digest(_unordered(read.structured_content)))

    anyio.run(scenario)

    kept = list(PreImage.objects.filter(session=session_of(acme)).order_by("entry__step_index"))
    assert [pre.after_digest for pre in kept] == found
    expected = []
    for name, _args in GRAPH_CALLS:  # the gateway's before read, the call, then the test's read
        expected += ["open_nodes", name, "open_nodes"]
    assert tool_calls(log) == expected
