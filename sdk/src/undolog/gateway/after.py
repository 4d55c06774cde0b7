"""What a preset tool leaves, worked out before it runs from what its before read found and its
args: the after-image the compare-and-restore needs, sent with the pre-image, so that an
``edit_file`` or a memory-graph call costs one SAFE read upstream (the before read), not two.

Each function here mirrors its server's code (the official filesystem and memory servers, the
versions in tests/gateway/npm) and is checked against it: tests/gateway/test_pre_images.py
compares, call by call, the digest worked out here with the digest of a real read after the
call. Where a function cannot be sure (an edit whose text it cannot find, a shape it does not
know) it raises ``AfterUnknown`` and the gateway reads the target again after the call, as
before. Where it is wrong (a server version that edits differently), the rollback finds the
target neither as this run left it nor as it was before, and the entry goes to a person with
both digests: a wrong after-image never overwrites anything, it only asks a person.

Declared as ``"after": {"fn": "filesystem.edit_file"}`` (the SDKs' form of an after function).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from ..preimages import AfterUnknown

__all__ = ["DERIVED"]

# JavaScript's String.prototype.trim() and \s: WhiteSpace and LineTerminator (ECMA-262), which
# differ from Python's str.strip() (it strips \x1c-\x1f and \x85, and keeps \ufeff).
_JS_SPACE = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_LEADING = re.compile(f"^[{re.escape(_JS_SPACE)}]*")


def _trim(text: str) -> str:
    return text.strip(_JS_SPACE)


def _indent(text: str) -> str:
    return _LEADING.match(text).group(0)  # type: ignore[union-attr]


def _lines(text: str) -> str:
    return text.replace("\r\n", "\n")


def apply_edits(content: str, edits: list[Mapping[str, Any]]) -> str:
    """The filesystem server's ``applyFileEdits``: line endings normalised, then each edit in
    turn: its exact text replaced at its first occurrence, else a run of lines equal to its lines
    but for leading and trailing white space, replaced keeping the file's indentation."""
    modified = _lines(content)
    for edit in edits:
        old, new = _lines(str(edit["oldText"])), _lines(str(edit["newText"]))
        at = modified.find(old)
        if at >= 0:  # the first occurrence, taken literally (a replacer function: no $& patterns)
            modified = modified[:at] + new + modified[at + len(old) :]
            continue
        old_lines, lines = old.split("\n"), modified.split("\n")
        for i in range(len(lines) - len(old_lines) + 1):
            if all(
                _trim(o) == _trim(c)
                for o, c in zip(old_lines, lines[i : i + len(old_lines)], strict=True)
            ):
                base = _indent(lines[i])
                lines[i : i + len(old_lines)] = [
                    _reindent(j, line, base, old_lines) for j, line in enumerate(new.split("\n"))
                ]
                modified = "\n".join(lines)
                break
        else:
            raise AfterUnknown("an edit's text is not in the file: the call will fail")
    return modified


def _reindent(j: int, line: str, base: str, old_lines: list[str]) -> str:
    if j == 0:
        return base + line.lstrip(_JS_SPACE)
    old_indent = _indent(old_lines[j]) if j < len(old_lines) else ""
    new_indent = _indent(line)
    if old_indent and new_indent:
        return base + " " * max(0, len(new_indent) - len(old_indent)) + line.lstrip(_JS_SPACE)
    return line


def edit_file(args: Mapping[str, Any], before: Any) -> Any:
    if not isinstance(before, Mapping) or not isinstance(before.get("content"), str):
        raise AfterUnknown("no text was read before the edit")
    edits = args.get("edits")
    if not isinstance(edits, list) or not all(
        isinstance(e, Mapping) and "oldText" in e and "newText" in e for e in edits
    ):
        raise AfterUnknown("edits of a shape the server refuses")
    if args.get("dryRun"):
        return dict(before)
    return {**before, "content": apply_edits(before["content"], edits)}


# ---------------------------------------------------------------- the memory server's graph
#
# The before read is ``open_nodes(names)``: the named entities that exist, and the relations with
# an end among them (``_view``). Each function applies the call to that view as the server applies
# it to the whole graph, then takes the view again: what ``open_nodes(names)`` answers after it.


def _graph(before: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if before is None:
        return [], []
    if not isinstance(before, Mapping) or set(before) - {"entities", "relations"}:
        raise AfterUnknown("a graph of a shape the preset does not know")
    entities = [
        dict(e, observations=list(e.get("observations", []))) for e in before.get("entities", [])
    ]
    return entities, [dict(r) for r in before.get("relations", [])]


def _view(names: list[Any], entities: list[dict[str, Any]], relations: list[dict[str, Any]]) -> Any:
    from .preimages import _unordered

    shown = [e for e in entities if e.get("name") in names]
    there = {e.get("name") for e in shown}
    kept = [r for r in relations if r.get("from") in there or r.get("to") in there]
    return _unordered({"entities": shown, "relations": kept})


def _entity(given: Mapping[str, Any]) -> dict[str, Any]:
    """An entity as the server stores and reads it back (its three fields)."""
    return {
        "name": given["name"],
        "entityType": given["entityType"],
        "observations": list(given["observations"]),
    }


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("from", "to", "relationType"))


def create_entities(args: Mapping[str, Any], before: Any) -> Any:
    entities, relations = _graph(before)
    given = list(args["entities"])
    existing = {e["name"] for e in entities}
    entities += [_entity(e) for e in given if e["name"] not in existing]
    return _view([e["name"] for e in given], entities, relations)


def add_observations(args: Mapping[str, Any], before: Any) -> Any:
    entities, relations = _graph(before)
    for item in args["observations"]:
        entity = next((e for e in entities if e["name"] == item["entityName"]), None)
        if entity is None:
            raise AfterUnknown("no such entity: the call will fail")
        entity["observations"] += [c for c in item["contents"] if c not in entity["observations"]]
    return _view([o["entityName"] for o in args["observations"]], entities, relations)


def delete_observations(args: Mapping[str, Any], before: Any) -> Any:
    entities, relations = _graph(before)
    for item in args["deletions"]:
        for entity in entities:
            if entity["name"] == item["entityName"]:
                entity["observations"] = [
                    o for o in entity["observations"] if o not in item["observations"]
                ]
    return _view([d["entityName"] for d in args["deletions"]], entities, relations)


def delete_entities(args: Mapping[str, Any], before: Any) -> Any:
    names = list(args["entityNames"])
    entities, relations = _graph(before)
    entities = [e for e in entities if e["name"] not in names]
    relations = [r for r in relations if r.get("from") not in names and r.get("to") not in names]
    return _view(names, entities, relations)


def create_relations(args: Mapping[str, Any], before: Any) -> Any:
    entities, relations = _graph(before)
    given = [
        {"from": r["from"], "to": r["to"], "relationType": r["relationType"]}
        for r in args["relations"]
    ]
    relations += [r for r in given if not any(_same(r, old) for old in relations)]
    return _view([r["from"] for r in given], entities, relations)


def delete_relations(args: Mapping[str, Any], before: Any) -> Any:
    entities, relations = _graph(before)
    relations = [r for r in relations if not any(_same(r, gone) for gone in args["relations"])]
    return _view([r["from"] for r in args["relations"]], entities, relations)


def _guarded(
    fn: Callable[[Mapping[str, Any], Any], Any],
) -> Callable[[Mapping[str, Any], Any], Any]:
    """Args of a shape the server refuses (a missing field): the call fails, nothing to work out."""

    def derive(args: Mapping[str, Any], before: Any) -> Any:
        try:
            return fn(args, before)
        except (KeyError, TypeError, AttributeError) as exc:
            raise AfterUnknown(f"args of a shape the server refuses ({exc!r})") from None

    return derive


DERIVED: dict[str, Callable[[Mapping[str, Any], Any], Any]] = {
    "filesystem.edit_file": edit_file,
    **{
        f"memory.{fn.__name__}": _guarded(fn)
        for fn in (
            create_entities,
            add_observations,
            delete_observations,
            delete_entities,
            create_relations,
            delete_relations,
        )
    },
}
