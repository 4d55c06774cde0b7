"""Modules with real edges (issue 40): no circle between the files of a package, no private name
borrowed from another module. `make check` runs both on the tree (lint-imports' `acyclic_siblings`
contract in .importlinter, tools/module_edges.py); these tests prove each check fails on what it
exists to catch, planted in a tree of their own, and holds on this one."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tools import module_edges

ROOT = Path(__file__).resolve().parent.parent


def plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


# ---------------------------------------------------------------- private names (Python)


def borrowed(root: Path) -> list[str]:
    return [f"{b.path}:{b.line} {b.owner}.{b.name}" for b in module_edges.borrowed_names(root, ["pkg"])]


def test_this_tree_borrows_no_private_name():
    assert module_edges.borrowed_names(ROOT, module_edges.server_packages()) == []


def test_the_server_packages_are_the_root_packages_of_importlinter():
    assert module_edges.server_packages() == ["undolog_site", "ops", "lifecycle", "approvals", "budgets", "effects",
                                              "deliveries", "orgs", "core"]


def test_it_finds_a_private_name_imported_from_another_module(tmp_path):
    plant(tmp_path, {"pkg/__init__.py": "", "pkg/owner.py": "def _helper(): ...\n",
                     "pkg/user.py": "from pkg.owner import _helper\n"})
    assert borrowed(tmp_path) == ["pkg/user.py:1 pkg.owner._helper"]


def test_it_finds_a_private_name_reached_through_the_module_inside_a_function(tmp_path):
    plant(tmp_path, {"pkg/__init__.py": "", "pkg/sub/__init__.py": "", "pkg/sub/owner.py": "_SQL = 'x'\n",
                     "pkg/user.py": """
                         import pkg.sub.owner


                         def run():
                             from pkg.sub import owner as alias

                             return alias._SQL + pkg.sub.owner._SQL
                         """})
    assert borrowed(tmp_path) == ["pkg/user.py:8 pkg.sub.owner._SQL", "pkg/user.py:8 pkg.sub.owner._SQL"]


def test_it_finds_a_relative_import_of_a_private_name(tmp_path):
    plant(tmp_path, {"pkg/__init__.py": "", "pkg/owner.py": "_x = 1\n", "pkg/user.py": "from .owner import _x as y\n"})
    assert borrowed(tmp_path) == ["pkg/user.py:1 pkg.owner._x"]


def test_it_leaves_public_names_dunders_own_names_private_modules_and_other_packages_alone(tmp_path):
    plant(tmp_path, {"pkg/__init__.py": "", "pkg/_impl.py": "VALUE = 1\n",
                     "pkg/owner.py": "_own = 1\nhelper = 2\n__all__ = ['helper']\nprint(_own)\n",
                     "pkg/user.py": """
                         import json

                         from pkg import _impl, owner
                         from pkg.owner import __all__, helper

                         print(owner.helper, owner.__all__, _impl.VALUE, json._default_decoder, helper, __all__)
                         """})
    assert borrowed(tmp_path) == []


def test_the_script_exits_1_and_names_the_borrowed_name(tmp_path):
    plant(tmp_path, {"pkg/__init__.py": "", "pkg/owner.py": "def _helper(): ...\n",
                     "pkg/user.py": "from pkg import owner\nowner._helper()\n"})
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "module_edges.py"), "--root", str(tmp_path),
                           "--package", "pkg"], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stdout.strip() == "pkg/user.py:2: borrows pkg.owner._helper (give it a public name in pkg.owner)"


# ---------------------------------------------------------------- circles (TypeScript)


def test_the_sdk_js_files_make_no_circle():
    edges = module_edges.ts_edges(ROOT / "sdk-js" / "src")
    assert "session.ts" in edges and "tool.ts" in edges["client.ts"]  # the edges are read at all
    assert module_edges.circles(edges) == []


def test_it_finds_a_circle_of_typescript_files_through_type_only_imports(tmp_path):
    plant(tmp_path, {
        "a.ts": 'import { b } from "./b.js";\nexport const a = b;\n',
        "b.ts": 'import {\n  type C,\n} from "./c.js";\nexport const b = 1;\nexport type B = C;\n',
        "c.ts": 'export type { A } from "./d.js";\nimport type { X } from "./a.js";\nexport type C = X;\n',
        "d.ts": '/** import { a } from "./a.js" is only an example */\n// import "./a.js";\nexport type A = 1;\n',
        "e.ts": 'import "./d.js";\nconst later = await import("./f.js");\nimport("./e.js");\n',
        "f.ts": 'import "./e.js";\n',
    })
    assert module_edges.circles(module_edges.ts_edges(tmp_path)) == [["a.ts", "b.ts", "c.ts"], ["e.ts", "f.ts"]]


def test_the_script_exits_1_on_a_typescript_circle_and_0_without(tmp_path):
    plant(tmp_path, {"a.ts": 'import { b } from "./b.js";\n', "b.ts": 'import { a } from "./a.js";\n'})
    script = [sys.executable, str(ROOT / "tools" / "module_edges.py"), "--ts"]
    done = subprocess.run([*script, str(tmp_path)], capture_output=True, text=True)
    assert (done.returncode, done.stdout.split(": ", 1)[1].strip()) == (1, "a circle between files: a.ts <-> b.ts")
    (tmp_path / "b.ts").write_text("export const b = 1;\n")
    assert subprocess.run([*script, str(tmp_path)], capture_output=True).returncode == 0


# ---------------------------------------------------------------- circles (Python: .importlinter)


@pytest.mark.parametrize("how", ["at the top", "inside a function", "under TYPE_CHECKING"])
def test_the_importlinter_contract_fails_on_a_circle_between_modules(tmp_path, how):
    """The acyclic contract as .importlinter writes it, over a planted package of two modules that
    import each other, one of them `how`; and kept once the circle is gone."""
    back = {"at the top": "from pkg import a\n",
            "inside a function": "def f():\n    from pkg import a\n",
            "under TYPE_CHECKING": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"}[how]
    plant(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg import b\n", "pkg/b.py": back,
                     "pkg/sub/__init__.py": "", "pkg/sub/c.py": "from pkg import a\n"})
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    contract = dict(config["importlinter:contract:acyclic"])
    assert contract["type"] == "acyclic_siblings"
    planted = configparser.ConfigParser()
    planted["importlinter"] = {"root_packages": "\npkg"}  # a list, as the real one is
    planted["importlinter:contract:acyclic"] = {**contract, "ancestors": "\npkg"}
    with open(tmp_path / ".importlinter", "w") as out:
        planted.write(out)
    lint = [str(Path(sys.executable).parent / "lint-imports"), "--no-logo", "--no-cache"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(lint, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert done.returncode == 1, done.stdout
    assert "No cycles are allowed in pkg" in done.stdout
    (tmp_path / "pkg" / "b.py").write_text("")
    done = subprocess.run(lint, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout
