"""Edges between modules that `lint-imports` cannot see: a private name borrowed from another
module (Python), and a circle between the files of `sdk-js/src` (TypeScript).

`make check` runs `python3 tools/module_edges.py`; `make check-js` runs it with `--ts`. Circles
between the server's Python files are import-linter's (`.importlinter`, the `acyclic_siblings`
contract): this script does for TypeScript what that contract does for Python. Standard library
only, so that `make check-js` needs no virtualenv.

What counts, in both languages:

- Every import is an edge, wherever it is written: at the top, inside a function (Python's "imported
  here to avoid a cycle" is still a cycle), under `if TYPE_CHECKING:`, and TypeScript's `import type`
  and `export … from`. A type a module names is something it depends on: a reader of one must
  read the other. (import-linter counts TYPE_CHECKING imports too unless told otherwise.)
- A private name is one that starts with a single underscore (`_respond`; not `__all__`). Another
  module may not import it (`from m import _x`) or reach it through the module
  (`m._x`, `import m as alias` then `alias._x`): a helper two modules share gets a public name in
  the module that owns it. A module's own private names, and private *modules* (`_impl.py`), are
  not its concern.

`python3 tools/module_edges.py [--root DIR] [--package NAME …] [--ts DIR]`: exit 1 and one line
per finding, 0 and a one-line summary when there is none.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The server's packages: the root packages of .importlinter, read from there.
IMPORTLINTER = ROOT / ".importlinter"


@dataclass(frozen=True, order=True)
class Borrowed:
    """A private name of `owner` used by `user` (file and line)."""

    path: str
    line: int
    owner: str
    name: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: borrows {self.owner}.{self.name} (give it a public name in {self.owner})"


def server_packages(config: Path = IMPORTLINTER) -> list[str]:
    """The root packages .importlinter lists (`root_packages =` and its indented lines)."""
    names, reading = [], False
    for line in config.read_text().splitlines():
        if line.startswith("root_packages"):
            reading = True
        elif reading and line[:1] in (" ", "\t") and line.strip():
            names.append(line.strip())
        elif reading:
            break
    return names


def python_modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of `packages` under `root` by dotted name (a package by its own name)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != "_"


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module a `from … import` reads from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    parts = parts if is_package else parts[:-1]
    parts = parts[: len(parts) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def borrowed_names(root: Path, packages: Iterable[str]) -> list[Borrowed]:
    """Every private name a module of `packages` takes from another module of them."""
    modules = python_modules(root, packages)
    found: list[Borrowed] = []
    for module, path in modules.items():
        found.extend(_borrowed_in(module, path, modules, root))
    return sorted(found)


def _borrowed_in(module: str, path: Path, modules: dict[str, Path], root: Path) -> Iterator[Borrowed]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = str(path.relative_to(root))
    bound: dict[str, str] = {}  # a local name -> the project module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules or alias.name.split(".")[0] in modules:
                    local = alias.asname or alias.name.split(".")[0]
                    bound[local] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, path.name == "__init__.py", node)
            if base not in modules:
                continue
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif _is_private(alias.name) and base != module:
                    yield Borrowed(where, node.lineno, base, alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            found = _name_reached(node, bound, modules)
            if found is not None and _is_private(found[1]) and found[0] != module:
                yield Borrowed(where, node.lineno, *found)


def _name_reached(node: ast.Attribute, bound: dict[str, str], modules: dict[str, Path]) -> tuple[str, str] | None:
    """For `m.a.b` whose root `m` is bound to a project module: (module, name) when every attribute
    but the last is a submodule and the last is not (a name of the module reached), else None. So
    each use of a name is found once, on the attribute that reaches it."""
    chain = []
    inner: ast.expr = node
    while isinstance(inner, ast.Attribute):
        chain.append(inner.attr)
        inner = inner.value
    owner = bound.get(inner.id) if isinstance(inner, ast.Name) else None
    if owner is None:
        return None
    *through, last = reversed(chain)
    for attribute in through:
        owner = f"{owner}.{attribute}"
        if owner not in modules:
            return None
    return None if f"{owner}.{last}" in modules else (owner, last)


# ---------------------------------------------------------------- TypeScript

# `import … from "./x.js"`, `export … from "./x.js"`, `import "./x.js"`, `import("./x.js")`: only
# relative specifiers are files of this package. Comments are removed first (a doc comment may
# show an import).
_TS_FROM = re.compile(r"\b(?:import|export)\b[^;]*?\bfrom\s*[\"'](\.{1,2}/[^\"']+)[\"']", re.S)
_TS_BARE = re.compile(r"\bimport\s*\(?\s*[\"'](\.{1,2}/[^\"']+)[\"']")
_TS_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_TS_LINE_COMMENT = re.compile(r"^\s*//.*$", re.M)


def ts_edges(src: Path) -> dict[str, set[str]]:
    """{file: the files of `src` it imports}, by path relative to `src` (`session.ts`)."""
    edges: dict[str, set[str]] = {}
    for path in sorted(src.rglob("*.ts")):
        text = _TS_LINE_COMMENT.sub("", _TS_BLOCK_COMMENT.sub("", path.read_text()))
        name = path.relative_to(src).as_posix()
        targets = edges.setdefault(name, set())
        for specifier in _TS_FROM.findall(text) + _TS_BARE.findall(text):
            target = (path.parent / specifier).resolve()
            target = target.with_suffix(".ts") if target.suffix == ".js" else target
            if target.is_file() and src.resolve() in target.parents:
                targets.add(target.relative_to(src.resolve()).as_posix())
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one file, each sorted: every file of one
    reaches every other through imports (Tarjan). A file importing itself is not a circle between
    files."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--package", action="append", help="a package to check (default: .importlinter's)")
    parser.add_argument("--ts", type=Path, help="check this TypeScript source folder's files for circles instead")
    args = parser.parse_args(argv)
    if args.ts:
        found = circles(ts_edges(args.ts))
        for circle in found:
            print(f"{args.ts}: a circle between files: {' <-> '.join(circle)}")
        if not found:
            print(f"{args.ts}: no circle between files")
        return 1 if found else 0
    packages = args.package or server_packages(args.root / ".importlinter")
    borrowed = borrowed_names(args.root, packages)
    for finding in borrowed:
        print(finding)
    if not borrowed:
        print(f"no private name borrowed across the modules of {len(packages)} packages")
    return 1 if borrowed else 0


if __name__ == "__main__":
    sys.exit(main())
