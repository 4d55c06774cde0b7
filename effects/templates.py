"""Compensation args templates: how a tool's undo args are made from the call and its result.

`{to}` is the call's argument `to`; `{result.a.b}` a path into the committed result (a number
indexes a list); `[*]` maps a path over a list and collects what follows it from every item:
`{entities[*].name}` is the `name` of every item of the argument `entities`,
`{result.items[*].id}` the `id` of every item of the result's `items` (a second `[*]` flattens,
as JSONPath does). A value that is exactly one placeholder keeps its JSON type (a number stays a
number, a list stays a list); inside longer text a placeholder is formatted (JSON for a list).

A template that reads the result, or reads the args along a path that this call's args do not
have, is rendered at commit, strictly: a placeholder that resolves to nothing raises
`TemplateError`, and the entry goes to a person then (`UndoEntry.render`), not when the run
fails. A template of plain `{name}`s is rendered at intercept, as before (unknown names stay).
"""

from __future__ import annotations

import json
import re
from typing import Any


class TemplateError(ValueError):
    """A compensation template that cannot be rendered: the message says which placeholder and why."""


class _KeepMissing(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def render_text(template: str, args: dict) -> str:
    """`"drops {db_name}"` with the call's args; unknown names stay as they are."""
    try:
        return template.format_map(_KeepMissing(args))
    except (ValueError, IndexError, AttributeError, KeyError, TypeError):
        return template


PLACEHOLDER = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)\}$")
# A path: a root (`result` or an argument's name), then `.key`, `[3]` or `[*]` steps.
PATH = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_-]+|\[\*\]|\[\d+\])*"
ANY_PLACEHOLDER = re.compile(r"\{(" + PATH + r")\}")
RESULT_PLACEHOLDER = re.compile(r"\{(result(?:\.[A-Za-z0-9_-]+|\[\*\]|\[\d+\])*)\}")
_STEP = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\*|\d+)\]")
ALL = object()  # the `[*]` step


def template_strings(template: Any):
    """Every string inside a template (a string, or any string inside a list or map), depth first."""
    if isinstance(template, dict):
        for value in template.values():
            yield from template_strings(value)
    elif isinstance(template, list):
        for value in template:
            yield from template_strings(value)
    elif isinstance(template, str):
        yield template


def _paths(template: Any) -> list[str]:
    """The placeholders of a template that are more than a plain `{name}` (dots or brackets)."""
    return [name for text in template_strings(template) for name in ANY_PLACEHOLDER.findall(text)
            if not name.isidentifier()]


def needs_result(template: Any, args: dict | None = None) -> bool:
    """Whether a template is rendered at commit rather than at intercept: it reads the committed
    result (`{result.number}`), or it reads `args` along a path they do not have (so that the
    commit, strictly, sends the entry to a person with the reason)."""
    if any(RESULT_PLACEHOLDER.search(text) for text in template_strings(template)):
        return True
    try:
        for name in _paths(template):
            _lookup(name, args or {}, None)
    except TemplateError:
        return True
    return False


def parse_path(name: str) -> tuple[str, list[Any]]:
    """A placeholder's path (`result.items[*].id`) as its root name and its steps (keys, indexes, `*`)."""
    root = re.match(r"[A-Za-z_][A-Za-z0-9_]*", name).group(0)
    steps: list[Any] = []
    for key, index in _STEP.findall(name[len(root):]):
        steps.append(key if key else (ALL if index == "*" else int(index)))
    return root, steps


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)[:200]


def _walk(value: Any, steps: list[Any], name: str, where: str) -> Any:
    for position, step in enumerate(steps):
        if step is ALL:
            if not isinstance(value, list):
                raise TemplateError(f"{{{name}}}: {where} is not a list (it is {_show(value)})")
            rest = steps[position + 1:]
            flat = ALL in rest
            collected: list[Any] = []
            for index, item in enumerate(value):
                got = _walk(item, rest, name, f"item {index} of {where}")
                if flat:
                    collected.extend(got)
                else:
                    collected.append(got)
            return collected
        if isinstance(step, int):
            if not isinstance(value, list) or step >= len(value):
                raise TemplateError(f"{{{name}}}: {where} has no item {step} (it is {_show(value)})")
            value, where = value[step], f"{where}[{step}]"
        elif isinstance(value, dict) and step in value:
            value, where = value[step], f"{where}.{step}"
        elif isinstance(value, list) and step.isdigit() and int(step) < len(value):
            value, where = value[int(step)], f"{where}.{step}"
        else:
            raise TemplateError(f"{{{name}}}: {where} has no {step!r} (it is {_show(value)})")
    return value


def _lookup(name: str, args: dict, result: Any) -> Any:
    root, steps = parse_path(name)
    if root == "result":
        return _walk(result, steps, name, "the result")
    if root not in args:
        raise TemplateError(f"{{{name}}}: the call has no argument {root!r}")
    return _walk(args[root], steps, name, f"the argument {root!r}")


def render_template(template: Any, args: dict) -> Any:
    """Render a compensation args template at intercept: `{"to": "{to}"}` takes `to` from the call.

    A value that is exactly one placeholder keeps the arg's JSON type (a number stays a
    number); placeholders inside longer strings are formatted as text. What the args do not
    have stays as it is (a template that needs more is rendered again at commit, strictly).
    """
    if isinstance(template, dict):
        return {key: render_template(value, args) for key, value in template.items()}
    if isinstance(template, list):
        return [render_template(value, args) for value in template]
    if not isinstance(template, str):
        return template
    whole = PLACEHOLDER.match(template)
    if whole and whole.group(1) in args:
        return args[whole.group(1)]
    if all(parse_path(name)[0] == "result" for name in _paths(template)):
        return render_text(template, args)
    try:
        return render_with_result(template, args, None)
    except TemplateError:
        return template


def render_with_result(template: Any, args: dict, result: Any) -> Any:
    """Render a compensation template at commit, strictly: `{name}` from the call's args,
    `{result.a.b}` a path into the committed result (list items by index, `[*]` every item).
    A placeholder that names nothing raises TemplateError, so the entry is flagged now rather
    than at walk time. A value that is exactly one placeholder keeps its JSON type."""
    if isinstance(template, dict):
        return {key: render_with_result(value, args, result) for key, value in template.items()}
    if isinstance(template, list):
        return [render_with_result(value, args, result) for value in template]
    if not isinstance(template, str):
        return template
    whole = ANY_PLACEHOLDER.fullmatch(template)
    if whole:
        return _lookup(whole.group(1), args, result)

    def text(match: re.Match) -> str:
        value = _lookup(match.group(1), args, result)
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"),
                                                               ensure_ascii=False)

    return ANY_PLACEHOLDER.sub(text, template)
