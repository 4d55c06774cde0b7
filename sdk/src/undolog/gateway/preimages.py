"""Pre-images through the gateway (issue 42): upstream tools with no inverse get one from a
before read and a restore, both upstream tools, declared in the TOML per tool
(``pre_image = {...}``) or all at once for a known server (``preset = "filesystem"`` or
``"memory"``). The declaration's format is the server's (effects/preimages.py); the gateway
runs it: the before read between undolog's ``execute`` and the call, the compare-and-restore
when the run is rolled back (undolog.preimages).

    [servers.files]
    command = ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/home/me/project"]
    preset = "filesystem"

``filesystem`` (the official server): ``write_file``, ``edit_file``, ``move_file`` and
``create_directory`` become COMPENSABLE. The server has no delete tool, so where nothing was
there before (a new file, a new directory), the restore deletes it here, in the gateway's
process, and only inside the directories the server itself reports
(``list_allowed_directories``): the preset needs a stdio server on this machine.
Text files only: the server reads and writes UTF-8 text.

``memory`` (the official knowledge-graph server): ``create_entities``, ``add_observations``,
``delete_entities``, ``delete_observations``, ``create_relations`` and ``delete_relations``
become COMPENSABLE, each reading the entities it names (``open_nodes``) before the call and
putting them back (their observations and relations) when rolled back.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..preimages import ABSENT, PreImage, render
from .upstream import text_of

__all__ = ["PRESETS", "build", "preset_tools"]

FILE = {"tool": "read_text_file", "args": {"path": "{path}"}}
FILESYSTEM: dict[str, dict[str, Any]] = {
    "write_file": {
        "before": FILE,
        "absent_when": "ENOENT",
        "restore": {
            "tool": "write_file",
            "args": {"path": "{path}", "content": "{before.content}"},
        },
        "restore_absent": {"delete": "{path}"},
        "after": {"content": "{content}"},  # what it writes is in its args: no read after
    },
    "edit_file": {
        "before": FILE,
        "absent_when": "ENOENT",
        "restore": {
            "tool": "write_file",
            "args": {"path": "{path}", "content": "{before.content}"},
        },
        # The edited text is not in the args: worked out from the text read before and the
        # edits, as the server edits (after.py), so no read after the call.
        "after": {"fn": "filesystem.edit_file"},
    },
    "move_file": {
        "before": {"tool": "read_text_file", "args": {"path": "{source}"}},
        "absent_when": "ENOENT",
        "check": {"tool": "read_text_file", "args": {"path": "{destination}"}},
        "restore": {
            "tool": "move_file",
            "args": {"source": "{destination}", "destination": "{source}"},
        },
        "after": "{before}",  # the destination holds what the source held
    },
    "create_directory": {
        "before": {"tool": "list_directory", "args": {"path": "{path}"}},
        "absent_when": "ENOENT",
        "compare": "exists",
        "restore_absent": {"delete": "{path}"},  # only an empty directory: else a person decides
        "after": True,
    },
}


def _graph(tool: str, names: str) -> dict[str, Any]:
    """A memory tool's declaration: the entities it names, read with their relations before the
    call (``open_nodes``: every relation with an end among them), and put back by deleting them
    (their relations go with them) and creating what was there again. What the call leaves is
    worked out from that read and the args, as the server applies them (after.py)."""
    return {
        "before": {"tool": "open_nodes", "args": {"names": names}},
        "compare": "unordered",
        "restore": [
            {"tool": "delete_entities", "args": {"entityNames": names}},
            {"tool": "create_entities", "args": {"entities": "{before.entities}"}},
            {"tool": "create_relations", "args": {"relations": "{before.relations}"}},
        ],
        "after": {"fn": f"memory.{tool}"},
    }


MEMORY: dict[str, dict[str, Any]] = {
    "create_entities": _graph("create_entities", "{entities[*].name}"),
    "add_observations": _graph("add_observations", "{observations[*].entityName}"),
    "delete_observations": _graph("delete_observations", "{deletions[*].entityName}"),
    "delete_entities": _graph("delete_entities", "{entityNames}"),
    "create_relations": _graph("create_relations", "{relations[*].from}"),
    "delete_relations": _graph("delete_relations", "{relations[*].from}"),
}

PRESETS: dict[str, dict[str, dict[str, Any]]] = {"filesystem": FILESYSTEM, "memory": MEMORY}


def preset_tools(preset: str | None) -> dict[str, dict[str, Any]]:
    if preset is None:
        return {}
    if preset not in PRESETS:
        raise ValueError(f"preset: one of {sorted(PRESETS)}, not {preset!r}")
    return PRESETS[preset]


def registered(declaration: Mapping[str, Any]) -> dict[str, Any]:
    """The declaration as the server keeps it."""
    return dict(declaration)


Call = Callable[[str, dict[str, Any]], Any]


def build(declaration: Mapping[str, Any], call: Call, roots: Callable[[], Any]) -> PreImage:
    """The runtime of a declaration: ``call(tool, args)`` is an upstream call (awaitable,
    answering the MCP result); ``roots()`` the directories a local delete may touch."""
    exists = declaration.get("compare") == "exists"
    unordered = declaration.get("compare") == "unordered"
    absent_when = declaration.get("absent_when", "ENOENT")

    def reader(spec: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], Any]:
        async def read(args: Mapping[str, Any]) -> Any:
            result = await call(spec["tool"], render(spec.get("args", {}), args))
            if getattr(result, "is_error", False):
                text = text_of(result)
                if absent_when and absent_when in text:
                    return ABSENT
                raise RuntimeError(f"{spec['tool']} failed: {text[:500]}")
            if exists:
                return True
            structured = getattr(result, "structured_content", None)
            value = structured if structured is not None else {"text": text_of(result)}
            return _unordered(value) if unordered else value

        return read

    def caller(spec: Any, with_before: bool) -> Callable[..., Any]:
        calls = spec if isinstance(spec, list) else [spec]

        async def run(args: Mapping[str, Any], before: Any = None) -> None:
            roots_ = {**args, "before": before} if with_before else dict(args)
            for one in calls:  # in order; a failure stops there and the entry is retried whole
                result = await call(one["tool"], render(one.get("args", {}), roots_))
                if getattr(result, "is_error", False):
                    raise RuntimeError(f"{one['tool']} failed: {text_of(result)[:500]}")

        return run

    def deleter(template: str) -> Callable[[Mapping[str, Any]], Any]:
        async def delete(args: Mapping[str, Any]) -> None:
            await _delete_inside(str(render(template, args)), await roots())

        return delete

    after_spec = declaration.get("after", "read")
    after = None
    if isinstance(after_spec, Mapping) and set(after_spec) == {"fn"}:
        after = derived(after_spec["fn"])  # worked out from the before read and the args (after.py)
    elif after_spec != "read":

        def after(args: Mapping[str, Any], before: Any) -> Any:
            return render(after_spec, {**args, "before": before})

    absent = declaration.get("restore_absent")
    if absent is None:
        restore_absent = None
    elif "delete" in absent:
        restore_absent = deleter(absent["delete"])
    else:
        restore_absent = caller(absent, False)
    return PreImage(
        read=reader(declaration["before"]),
        restore=caller(declaration["restore"], True) if declaration.get("restore") else None,
        declaration=registered(declaration),
        check=reader(declaration["check"]) if declaration.get("check") else None,
        restore_absent=restore_absent,
        after=after,
        max_bytes=int(declaration.get("max_bytes", 256 * 1024)),
        over_bound=declaration.get("over_bound", "hold"),
    )


def derived(name: str) -> Callable[[Mapping[str, Any], Any], Any]:
    """A preset's after-image function (``"after": {"fn": "filesystem.edit_file"}``)."""
    from .after import DERIVED

    if name not in DERIVED:
        raise ValueError(f"after: no function {name!r} in the gateway (one of {sorted(DERIVED)})")
    return DERIVED[name]


def _unordered(value: Any) -> Any:
    """Every list of objects sorted by their canonical JSON: a state compared as sets (a graph
    whose entities were put back in another order is the same graph)."""
    import json

    if isinstance(value, dict):
        return {key: _unordered(item) for key, item in value.items()}
    if isinstance(value, list):
        items = [_unordered(item) for item in value]
        if not all(isinstance(item, dict) for item in items):
            return items  # a list of texts (an entity's observations) keeps its order
        return sorted(items, key=lambda item: json.dumps(item, sort_keys=True, ensure_ascii=False))
    return value


async def _delete_inside(path: str, roots: list[str]) -> None:
    """Delete a file, or an empty directory, the call created: only inside the upstream's
    allowed directories (resolved, so no symlink or ``..`` leads out of them)."""
    target = Path(os.path.realpath(path))
    allowed = [Path(os.path.realpath(root)) for root in roots]
    if not any(target != root and target.is_relative_to(root) for root in allowed):
        raise PermissionError(f"{path} is outside the server's allowed directories; not deleted")
    if target.is_dir() and not target.is_symlink():
        os.rmdir(target)  # not empty: OSError, retried, then a person decides
    elif target.exists() or target.is_symlink():
        os.unlink(target)


def allowed_directories(text: str) -> list[str]:
    """``list_allowed_directories``'s answer: a heading line, then one directory a line."""
    return [line.strip() for line in text.splitlines()[1:] if line.strip()]


# -- the gateway's hooks (core.py calls these: its own edits stay small) ---------------------------


def function_name(server: str, tool: str) -> str:
    """The agent-handler compensation that runs a pre-image tool's compare-and-restore."""
    return f"mcp.{server}.{tool}.restore"[:100]


def declarations(server: Any) -> dict[str, Mapping[str, Any]]:
    """The server's pre-image tools: its preset's, then each tool's own ``pre_image`` (which
    replaces the preset's for that tool)."""
    found: dict[str, Mapping[str, Any]] = dict(preset_tools(server.preset))
    for name, override in server.tools.items():
        if override.pre_image is not None:
            found[name] = override.pre_image
        elif override.tier is not None and override.tier.value != "compensable":
            found.pop(name, None)  # a tier set by hand wins over the preset
    return found


def pre_image_runtimes(gateway: Any) -> dict[str, tuple[str, str, PreImage]]:
    """``{restore function: (server, tool, runtime)}`` of every pre-image tool in the config."""
    runtimes = {}
    for server in gateway.config.servers:
        roots = _roots_of(gateway, server.name)
        for tool, declaration in declarations(server).items():

            async def call(name: str, args: dict[str, Any], _server: str = server.name) -> Any:
                return await gateway.upstreams[_server].call(name, args)

            runtimes[function_name(server.name, tool)] = (
                server.name,
                tool,
                build(declaration, call, roots),
            )
    return runtimes


def _roots_of(gateway: Any, server: str) -> Callable[[], Any]:
    cache: list[list[str]] = []

    async def roots() -> list[str]:
        if not cache:
            result = await gateway.upstreams[server].call("list_allowed_directories", {})
            if getattr(result, "is_error", False):
                raise RuntimeError(
                    f"{server}: list_allowed_directories failed: {text_of(result)[:200]}"
                )
            cache.append(allowed_directories(text_of(result)))
        return cache[0]

    return roots


def attach_pre_image(
    gateway: Any, server: Any, tool: str, declared: Any, why: str
) -> tuple[Any, str]:
    """A listed upstream tool with a pre-image declaration: COMPENSABLE, undone by its restore."""
    import dataclasses

    from ..tiers import CompensationDescriptor, ToolTier

    fn_name = function_name(server.name, tool)
    if fn_name not in gateway.pre_images:
        return declared.spec, why
    pre = gateway.pre_images[fn_name][2]
    spec = dataclasses.replace(
        declared.spec,
        tier=ToolTier.COMPENSABLE,
        approval=None,
        irreversible=None,
        compensation=CompensationDescriptor(fn_name, {}),
        pre_image=dict(pre.declaration),
    )
    declared.spec, declared.safe, declared.pre_image = spec, False, pre
    source = (
        f"preset {server.preset!r}"
        if server.preset and tool in preset_tools(server.preset)
        else "pre_image"
    )
    return spec, f"undone by its pre-image ({source}): a before read and a restore"


def restorer(gateway: Any, entry: Mapping[str, Any]) -> Callable[[dict[str, Any]], Any] | None:
    """The compare-and-restore of a claimed pre-image entry (None: not one of ours)."""
    from ..preimages import acompare_and_restore

    found = gateway.pre_images.get(entry.get("fn_name"))
    if found is None:
        return None
    pre = found[2]
    return lambda args: acompare_and_restore(pre, entry.get("pre_image"))
