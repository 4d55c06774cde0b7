"""Pre-images: undo for tools that have no undo (issue 42).

A compensable tool may declare, in its registration, a *before* read: a SAFE read the agent side
runs after the intercept admits the call and before the call runs, whose result (the target's
*pre-image*) is kept, sealed, with the call's undo entry; and a *restore* that puts it back
when the run is rolled back. The agent side (the gateway, an SDK's `serve_compensations`) runs
both, where the credentials are; the server keeps the pre-image, its bounds, and the digests
that make the restore a compare-and-restore.

The declaration (`pre_image` in `POST /api/v1/tools`; every template a compensation template,
effects/templates.py, whose roots are the call's args, and for `restore`/`after` also `before`,
the pre-image's value):

    "pre_image": {
      "before":  {"tool": "read_text_file", "args": {"path": "{path}"}},   # or {"fn": "read_record"}
      "absent_when": "ENOENT",             # text in the before read's error: nothing was there
      "restore": {"tool": "write_file", "args": {"path": "{path}", "content": "{before.content}"}},
                                           # or a list of calls, made in order
      "restore_absent": {"delete": "{path}"},   # or a call {"tool"|"fn", "args"}; null: nothing to do
      "check":   {"tool": "read_text_file", "args": {"path": "{path}"}},   # default: before
      "after":   {"content": "{content}"},  # what the call leaves, from its args and {before}; or
                                           # {"fn": "<name>"}: worked out by the agent side (an SDK
                                           # function, the gateway's filesystem.edit_file, memory.*);
                                           # "read": read it again after the call
      "compare": "value",                  # "unordered": lists as sets; "exists": only whether it is there
      "max_bytes": 262144,                 # per entry (the default); at most UNDOLOG_PRE_IMAGE_MAX_BYTES
      "over_bound": "hold"                 # or "refuse": never run without its undo
    }

The state of the target is one JSON value: the before read's value, or `null` when it said
"absent". Its digest is `sha256:` + SHA-256 of its canonical JSON (sorted keys, no spaces,
UTF-8): the same in the server and both SDKs, and the only thing events and people see.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from effects.templates import ANY_PLACEHOLDER, parse_path, template_strings

OVER_BOUND = ("hold", "refuse")
DEFAULT_MAX_BYTES = 256 * 1024  # the SDKs' default too
NAME_MAX = 200


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest(state: Any) -> str:
    """The digest of a target's state (`None`: absent)."""
    return digest_of(canonical(state))


def digest_of(body: bytes) -> str:
    """The digest of a state already in its canonical JSON."""
    return "sha256:" + hashlib.sha256(body).hexdigest()


def sealable(body: bytes) -> bytes:
    """What is sealed of a state in its canonical JSON: `{"value": <state>}` (PreImage.value),
    made without encoding the state again (the canonical JSON of a one-key object)."""
    return b'{"value":' + body + b"}"


def declaration_problems(spec: Any, server_max: int) -> dict[str, str]:
    """What is wrong with a `pre_image` declaration, by field (`pre_image.before.args`…); empty: fine."""
    if not isinstance(spec, dict):
        return {"pre_image": "An object with before and restore (see the README's Pre-images)."}
    known = {"before", "absent_when", "restore", "restore_absent", "check", "after", "compare", "max_bytes",
             "over_bound"}
    problems = {f"pre_image.{key}": "Unknown field." for key in sorted(set(spec) - known)}
    for key, roots in (("before", ()), ("check", ()), ("restore", ("before",))):
        if key == "restore" and isinstance(spec.get(key), list):  # calls made in order
            if not 0 < len(spec[key]) <= 10:
                problems["pre_image.restore"] = "One call, or a list of 1 to 10 calls made in order."
            for n, call in enumerate(spec[key][:10]):
                problems.update(_call_problems(call, f"pre_image.restore[{n}]", roots))
        elif key in spec or key == "before":
            problems.update(_call_problems(spec.get(key), f"pre_image.{key}", roots))
    if "restore" not in spec and "restore_absent" not in spec:
        problems["pre_image.restore"] = "Say how to put the pre-image back (restore, or restore_absent)."
    absent = spec.get("restore_absent")
    if absent is not None:
        if isinstance(absent, dict) and set(absent) == {"delete"}:
            if not isinstance(absent["delete"], str) or not absent["delete"]:
                problems["pre_image.restore_absent.delete"] = "The path to delete, a template like {path}."
            else:
                problems.update(_roots(absent["delete"], "pre_image.restore_absent.delete", ()))
        else:
            problems.update(_call_problems(absent, "pre_image.restore_absent", ()))
    absent_when = spec.get("absent_when", "ENOENT")
    if not isinstance(absent_when, str) or not 0 < len(absent_when) <= 200:
        problems["pre_image.absent_when"] = "Text (1 to 200 characters) in the before read's error: nothing there."
    after = spec.get("after", "read")
    if after != "read":
        problems.update(_roots(after, "pre_image.after", ("before",)))
    max_bytes = spec.get("max_bytes", DEFAULT_MAX_BYTES)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 1 <= max_bytes <= server_max:
        problems["pre_image.max_bytes"] = f"An integer from 1 to {server_max} (UNDOLOG_PRE_IMAGE_MAX_BYTES)."
    if spec.get("compare", "value") not in ("value", "exists", "unordered"):
        problems["pre_image.compare"] = ("value (the read's whole answer), unordered (its lists as sets) or "
                                         "exists (only whether it is there).")
    if spec.get("over_bound", "hold") not in OVER_BOUND:
        problems["pre_image.over_bound"] = "hold (a person decides) or refuse (the call fails without running)."
    return problems


def _call_problems(call: Any, where: str, roots: tuple[str, ...]) -> dict[str, str]:
    if not isinstance(call, dict) or ("tool" in call) == ("fn" in call):
        return {where: 'A call: {"tool": "<upstream tool>", "args": {...}} or {"fn": "<SDK function>"}.'}
    problems = {f"{where}.{key}": "Unknown field." for key in sorted(set(call) - {"tool", "fn", "args"})}
    name = call.get("tool", call.get("fn"))
    if not isinstance(name, str) or not 0 < len(name) <= NAME_MAX:
        problems[f"{where}.{'tool' if 'tool' in call else 'fn'}"] = f"A name of 1 to {NAME_MAX} characters."
    args = call.get("args", {})
    if not isinstance(args, dict):
        problems[f"{where}.args"] = "An object of templates, like {\"path\": \"{path}\"}."
    else:
        problems.update(_roots(args, f"{where}.args", roots))
    return problems


def _roots(template: Any, where: str, allowed: tuple[str, ...]) -> dict[str, str]:
    """A template may read the call's args and the `allowed` roots; never the result (a before
    read runs before there is one) nor a pre-image it cannot have yet."""
    for text in template_strings(template):
        for name in ANY_PLACEHOLDER.findall(text):
            root = parse_path(name)[0]
            if root == "result" or (root == "before" and "before" not in allowed):
                return {where: f"{{{name}}} cannot be read here: only the call's args"
                               + (" and {before…}" if allowed else "") + "."}
    return {}


def declared_bound(spec: dict[str, Any]) -> tuple[int, str]:
    return int(spec.get("max_bytes", DEFAULT_MAX_BYTES)), spec.get("over_bound", "hold")
