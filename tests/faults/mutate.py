"""`make nemesis-mutants`: the checker proven by deliberate bugs. Each mutant in
tests/faults/mutants/ (a small, realistic bug: `bug:`, then `file:`, `find:`, `replace:` lines,
as many triples as it needs) is planted in a scratch copy of this tree, and the short nemesis
runs on that copy; the mutant is caught when the run reports a violation. Prints the table
(bug, caught, the checker's message) and writes it to var/mutants.md.

A `find:` is one line's text (or part of it) that must occur exactly once in its file, so a
mutant survives edits elsewhere in the file; `\\n` in a `replace:` starts a new line. When the
code it targets changes, the runner says the mutant is stale: update its `find:` to the line as
it now reads (and its `replace:` to the same bug). Outside CI: about four minutes a mutant.

`python -m tests.faults.mutate [--seed N] [NAME …]` (names: file stems, or a part of them);
`--check` only says whether each mutant still plants in this tree (a dry run: no copy, no nemesis;
`tests/faults/test_mutants_plant.py` runs it with the suite)."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHORT = 13  # make nemesis-short's faults: one of each kind on each role (tests/faults/nemesis.py's PLAN)
MUTANTS = Path(__file__).resolve().parent / "mutants"


def parse(path: Path) -> tuple[str, list[tuple[str, str, str]]]:
    bug, edits, current = "", [], {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(": ")
        if key == "bug":
            bug = value
        elif key == "file":
            current = {"file": value}
        elif key == "find":
            current["find"] = value
        elif key == "replace":
            edits.append((current["file"], current["find"], value.replace("\\n", "\n")))
    return bug, edits


def planted(tree: Path, edits: list[tuple[str, str, str]]) -> dict[str, str]:
    """The files a mutant changes, as they read once it is planted in `tree` (nothing written).
    ValueError when it is stale: a file gone, or a `find:` that is not there exactly once."""
    texts: dict[str, str] = {}
    for file, find, replace in edits:
        if file not in texts:
            if not (tree / file).is_file():
                raise ValueError(f"stale mutant: {file} does not exist (update its file:)")
            texts[file] = (tree / file).read_text()
        if texts[file].count(find) != 1:
            raise ValueError(f"stale mutant: {find!r} occurs {texts[file].count(find)} times in {file} "
                             "(update its find:)")
        texts[file] = texts[file].replace(find, replace)
    return texts


def plant(tree: Path, edits: list[tuple[str, str, str]]) -> None:
    for file, text in planted(tree, edits).items():
        (tree / file).write_text(text)


def check(mutants: list[Path]) -> int:
    """`--check`: whether every mutant still plants in this tree, without running the nemesis."""
    stale = 0
    for path in mutants:
        try:
            planted(ROOT, parse(path)[1])
            print(f"ok     {path.stem}")
        except ValueError as exc:
            stale += 1
            print(f"STALE  {path.stem}: {exc}")
    print(f"{len(mutants) - stale} of {len(mutants)} mutants plant in this tree")
    return 1 if stale else 0


def scratch_copy() -> Path:
    """This tree as it is (committed or not, ignored files left out) in a directory of its own."""
    tree = Path(tempfile.mkdtemp(prefix="undolog-mutant-"))
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            target = tree / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return tree


def run_one(path: Path, seed: int) -> dict:
    bug, edits = parse(path)
    tree = scratch_copy()
    try:
        plant(tree, edits)
    except ValueError as exc:
        shutil.rmtree(tree, ignore_errors=True)
        return {"name": path.stem, "bug": bug, "caught": None, "message": str(exc), "seconds": 0}
    started = time.monotonic()
    env = {**os.environ, "NEMESIS_SEED": str(seed)}
    done = subprocess.run([sys.executable, "-m", "tests.faults.nemesis", "--seconds", "0", "--faults", str(SHORT)],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
    out = done.stdout + done.stderr
    (ROOT / "var" / "mutants").mkdir(parents=True, exist_ok=True)
    (ROOT / "var" / "mutants" / f"{path.stem}.log").write_text(out)
    shutil.rmtree(tree, ignore_errors=True)
    found = re.search(r"^violations: (\d+) (\{.*\})$", out, re.M)
    count = int(found.group(1)) if found else 0
    first = re.search(r"^  ([^:]+): (.*)$", out, re.M)
    message = f"{count} violations {found.group(2)}" if found else f"no report (exit {done.returncode})"
    if first:
        message += f"; first: {first.group(1)}: {first.group(2)[:160]}"
    return {"name": path.stem, "bug": bug, "caught": count > 0, "message": message,
            "seconds": round(time.monotonic() - started)}


def table(results: list[dict], seed: int) -> str:
    rows = ["| deliberate bug | caught? | the checker's message |", "| --- | --- | --- |"]
    for r in results:
        caught = "stale" if r["caught"] is None else "**yes**" if r["caught"] else "**NO**"
        message = r["message"].replace("|", "\\|")
        rows.append(f"| {r['bug']} (`{r['name']}`) | {caught} | {message} |")
    return "\n".join(rows) + f"\n\n(seed {seed}, {time.strftime('%Y-%m-%d')})\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--check", action="store_true", help="only say whether each mutant still plants (no nemesis)")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(os.environ.get("NEMESIS_SEED") or random.randrange(10**6))
    mutants = sorted(p for p in MUTANTS.glob("*.txt") if not args.names or any(n in p.stem for n in args.names))
    if args.check:
        return check(mutants)
    print(f"{len(mutants)} mutants, each under the short nemesis with seed {seed}", flush=True)
    results = []
    for path in mutants:
        result = run_one(path, seed)
        results.append(result)
        print(json.dumps(result), flush=True)
    text = table(results, seed)
    (ROOT / "var").mkdir(exist_ok=True)
    (ROOT / "var" / "mutants.md").write_text(text)
    print(text)
    return 0 if all(r["caught"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
