"""``undolog-gateway.toml``: the upstream MCP servers the gateway fronts, and what it knows
about their tools that their own hints do not say.

    [undolog]
    url = "http://127.0.0.1:8000"        # default $UNDOLOG_URL
    agent = "desktop"                    # default $UNDOLOG_AGENT; the key is $UNDOLOG_API_KEY
    approval_wait_s = 60                 # a held call's wait before "awaits approval"

    [servers.tracker]                    # a stdio server ...
    command = ["python", "-m", "tracker"]
    trusted = true                       # believe its readOnlyHint (read-only tools become SAFE)
    env = { TRACKER_TOKEN = "${TRACKER_TOKEN}" }  # all it sees of our environment (+ PATH, ...)

    [servers.docs]                       # ... or a streamable-HTTP one
    url = "https://mcp.example.com/mcp"
    headers = { Authorization = "Bearer ${DOCS_TOKEN}" }

    [servers.tracker.tools.create_issue] # per-tool overrides
    compensation = { tool = "close_issue", args = { number = "{result.number}" } }

    [servers.files]                      # undo by pre-image (gateway/preimages.py)
    command = ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/srv/project"]
    preset = "filesystem"                # or "memory"; or per tool: pre_image = { before = ... }

    [clients.ana]                        # who may call the gateway over HTTP, one token each
    token = "${ANA_GATEWAY_TOKEN}"       # sent as Authorization: Bearer <token>
    started_by = "ana@example.com"       # optional: the person; she cannot approve her runs' calls

Strings in ``url``, ``headers``, ``env`` and ``command`` expand ``$VAR``/``${VAR}`` from the
environment, so secrets stay out of the file; a client's ``token`` must expand fully (an unset
variable is an error, never a literal token).

A stdio server's environment is what its ``env`` lists plus a minimal base (``PATH``, ``HOME``,
``LANG``, ...: ``upstream.BASE_ENV``), never the rest of the gateway's: client tokens and
undolog's key stay here.

``identity`` (``[servers.<name>]``): who this upstream is, for its agent-side undos. Without it,
``mcp:<name>:<fingerprint of its url, or command and cwd>``. Its undo functions are registered
with it and claimed only with it, so two gateways of one org that give two upstreams one name
are refused at start instead of running each other's undos. Set it by hand when one upstream is
reached two ways (moved, or another command), or when two differ only by credentials.

``on_idle`` (``[undolog]``): what the server's idle sweep (the agent's or org's
``run_idle_timeout_s``) makes of a run whose client went quiet without finishing it:
``complete`` (the default: the work stands, as when a stdio client closes) or ``fail`` (rolled
back).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..tiers import ApprovalSpec, CompensationDescriptor, ToolTier

__all__ = [
    "ClientConfig",
    "Compensation",
    "GatewayConfig",
    "ServerConfig",
    "ToolOverride",
    "load_config",
    "parse_config",
]

SERVER_KEYS = {
    "command",
    "env",
    "cwd",
    "url",
    "headers",
    "trusted",
    "also",
    "cost_weight",
    "safe_cost_weight",
    "tools",
    "identity",
    "preset",
}
TOOL_KEYS = {"tier", "cost_weight", "approval", "compensation", "description", "labels",
             "untrusted_fields", "pre_image", "asked"}
UNDOLOG_KEYS = {
    "url",
    "api_key",
    "agent",
    "approval_wait_s",
    "progress_every_s",
    "claim_poll_s",
    "claim_lease_s",
    "dashboard_url",
    "state_file",
    "on_idle",
}
CLIENT_KEYS = {"token", "started_by"}
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 512


class ConfigError(ValueError):
    """The gateway's TOML says something it cannot act on; the message says where."""


@dataclass(frozen=True)
class Compensation:
    """A tool's undo: another upstream tool (``tool``, run by the gateway where the upstream's
    credentials are), or a function already in undolog's registry (``fn_name``)."""

    args: Mapping[str, Any]
    tool: str | None = None
    server: str | None = None
    fn_name: str | None = None
    fn_version: str = "1.0.0"
    max_retries: int = 3
    retry_backoff_ms: int = 1000
    claim_timeout_s: int = 3600

    def descriptor(self, server: str) -> CompensationDescriptor:
        return CompensationDescriptor(
            self.function_name(server),
            dict(self.args),
            self.fn_version,
            self.max_retries,
            self.retry_backoff_ms,
        )

    def function_name(self, server: str) -> str:
        """``mcp.<server>.<tool>`` for an upstream tool: the registry name the gateway serves."""
        return self.fn_name or f"mcp.{self.server or server}.{self.tool}"


@dataclass(frozen=True)
class ToolOverride:
    tier: ToolTier | None = None
    cost_weight: float | None = None
    approval: ApprovalSpec | None = None
    compensation: Compensation | None = None
    description: str | None = None
    labels: tuple[str, ...] | None = None  # tool.labels; given, it replaces the suggested ones
    untrusted_fields: tuple[str, ...] = ()
    pre_image: Mapping[str, Any] | None = None  # a before read and restore (gateway/preimages.py)
    asked: tuple[str, ...] = ()  # what a request says to ask for it: `asked(tool)` in the policy


@dataclass(frozen=True)
class ServerConfig:
    name: str
    command: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    trusted: bool = False
    also: tuple[str, ...] = ()
    cost_weight: float = 1.0
    safe_cost_weight: float = 1.0
    tools: Mapping[str, ToolOverride] = field(default_factory=dict)
    identity: str | None = None
    preset: str | None = None  # "filesystem" | "memory": ready pre-image declarations

    @property
    def scope(self) -> str:
        """The upstream's identity its agent-side undo functions are registered and claimed with:
        ``identity``, else ``mcp:<name>:<16 hex>`` of where it is (its url, or its command and cwd;
        credentials stay out, so rotating a token keeps it)."""
        if self.identity:
            return self.identity
        where = {"url": self.url} if self.url else {"command": list(self.command), "cwd": self.cwd}
        digest = hashlib.sha256(json.dumps([self.name, where], sort_keys=True).encode()).hexdigest()
        return f"mcp:{re.sub(r'[^A-Za-z0-9_.-]', '_', self.name)[:80]}:{digest[:16]}"


@dataclass(frozen=True)
class ClientConfig:
    """One HTTP client of the gateway: its bearer token (never logged, never in a repr) and, where
    it acts for one person, who (``started_by``: the server keeps them from approving its calls)."""

    name: str
    token: str = field(repr=False)
    started_by: str | None = None


@dataclass(frozen=True)
class GatewayConfig:
    servers: tuple[ServerConfig, ...]
    url: str | None = None
    api_key: str | None = None
    agent: str | None = None
    approval_wait_s: float = 60.0
    progress_every_s: float = 5.0
    claim_poll_s: float = 1.0
    claim_lease_s: int = 60
    dashboard_url: str | None = None
    state_file: Path | None = None
    on_idle: str = "complete"
    clients: tuple[ClientConfig, ...] = ()


def load_config(path: str | os.PathLike[str]) -> GatewayConfig:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError as exc:
            raise ConfigError(
                "reading the gateway's TOML needs Python 3.11+ or `pip install tomli`"
            ) from exc
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return parse_config(data, base=path.parent)


def parse_config(data: Mapping[str, Any], base: Path | None = None) -> GatewayConfig:
    undolog = dict(data.get("undolog") or {})
    _no_unknown(undolog, UNDOLOG_KEYS, "[undolog]")
    _no_unknown(data, {"undolog", "servers", "clients"}, "the file")
    servers = tuple(_server(name, spec) for name, spec in (data.get("servers") or {}).items())
    if not servers:
        raise ConfigError(
            "no [servers.<name>] table: the gateway needs at least one upstream MCP server"
        )
    names = {server.name for server in servers}
    for server in servers:
        for tool, override in server.tools.items():
            other = override.compensation.server if override.compensation else None
            if other is not None and other not in names:
                raise ConfigError(
                    f"[servers.{server.name}.tools.{tool}] compensation: server = {other!r} is not "
                    f"one of this file's servers ({', '.join(sorted(names))})"
                )
    state = undolog.get("state_file")
    on_idle = undolog.get("on_idle", "complete")
    if on_idle not in ("complete", "fail"):
        raise ConfigError(f"[undolog] on_idle: 'complete' or 'fail', not {on_idle!r}")
    return GatewayConfig(
        servers=servers,
        url=_expand(undolog.get("url")),
        api_key=_expand(undolog.get("api_key")),
        agent=undolog.get("agent"),
        approval_wait_s=float(undolog.get("approval_wait_s", 60)),
        progress_every_s=float(undolog.get("progress_every_s", 5)),
        claim_poll_s=float(undolog.get("claim_poll_s", 1.0)),
        claim_lease_s=int(undolog.get("claim_lease_s", 60)),
        dashboard_url=undolog.get("dashboard_url"),
        state_file=(base or Path.cwd()) / state if state else None,
        on_idle=on_idle,
        clients=_clients(data.get("clients") or {}),
    )


def _clients(table: Mapping[str, Any]) -> tuple[ClientConfig, ...]:
    clients = []
    for name, spec in table.items():
        where = f"[clients.{name}]"
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{where}: a table with token = ... (and optionally started_by)")
        _no_unknown(spec, CLIENT_KEYS, where)
        token = _expand_strict(spec.get("token"), f"{where} token")
        if not isinstance(token, str) or not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS:
            raise ConfigError(
                f"{where}: token must be a string of {MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS} "
                "characters "
                '(generate one: python -c "import secrets; print(secrets.token_urlsafe(32))")'
            )
        started_by = spec.get("started_by")
        if started_by is not None and (not isinstance(started_by, str) or not started_by.strip()):
            raise ConfigError(f"{where}: started_by is a username or an email")
        clients.append(ClientConfig(name, token, started_by.strip() if started_by else None))
    tokens = [c.token for c in clients]
    if len(set(tokens)) != len(tokens):
        raise ConfigError("[clients]: two clients share a token; give each its own")
    return tuple(clients)


def _server(name: str, spec: Mapping[str, Any]) -> ServerConfig:
    where = f"[servers.{name}]"
    _no_unknown(spec, SERVER_KEYS, where)
    command, url = spec.get("command"), spec.get("url")
    if bool(command) == bool(url):
        raise ConfigError(
            f"{where}: give exactly one of command (a stdio server) or url (streamable HTTP)"
        )
    if isinstance(command, str):
        command = command.split()
    tools = {
        tool: _override(f"[servers.{name}.tools.{tool}]", body)
        for tool, body in (spec.get("tools") or {}).items()
    }
    preset = spec.get("preset")
    if preset is not None:
        from .preimages import PRESETS

        if preset not in PRESETS:
            raise ConfigError(f"{where}: preset is one of {sorted(PRESETS)}, not {preset!r}")
        if preset == "filesystem" and url:
            raise ConfigError(
                f"{where}: preset = \"filesystem\" needs a stdio server on this machine (a new "
                "file's undo deletes it here: the server has no delete tool)"
            )
    return ServerConfig(
        name=name,
        preset=preset,
        command=tuple(_expand(part) for part in command or ()),
        env={k: _expand(v) for k, v in spec["env"].items()}
        if spec.get("env") is not None
        else None,
        cwd=spec.get("cwd"),
        url=_expand(url),
        headers={k: _expand(v) for k, v in (spec.get("headers") or {}).items()},
        trusted=bool(spec.get("trusted", False)),
        also=tuple(spec.get("also") or ()),
        cost_weight=float(spec.get("cost_weight", 1.0)),
        safe_cost_weight=float(spec.get("safe_cost_weight", 1.0)),
        tools=tools,
        identity=_identity(where, spec.get("identity")),
    )


_IDENTITY = re.compile(r"^[A-Za-z0-9_.:@/+=-]{1,200}$")


def _identity(where: str, value: Any) -> str | None:
    if value is None:
        return None
    value = _expand(value)
    if not isinstance(value, str) or not _IDENTITY.match(value):
        raise ConfigError(f"{where}: identity is 1 to 200 letters, digits and _ . : @ / + = -")
    return value


def _override(where: str, body: Mapping[str, Any]) -> ToolOverride:
    _no_unknown(body, TOOL_KEYS, where)
    tier = body.get("tier")
    try:
        tier = ToolTier(tier) if tier else None
        approval = (
            ApprovalSpec(
                reason=body["approval"]["reason"],
                risk_tags=tuple(body["approval"].get("risk_tags", ())),
                estimated_impact=body["approval"].get("estimated_impact"),
                timeout_s=body["approval"].get("timeout_s"),
                auto_approve_on_timeout=body["approval"].get("auto_approve_on_timeout"),
            )
            if body.get("approval")
            else None
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    compensation = _compensation(where, body["compensation"]) if body.get("compensation") else None
    pre_image = body.get("pre_image")
    if pre_image is not None and not isinstance(pre_image, Mapping):
        raise ConfigError(f"{where}: pre_image = {{ before = ..., restore = ... }}")
    if pre_image is not None and tier is ToolTier.COMPENSABLE and compensation is None:
        tier = None  # COMPENSABLE by its pre-image (gateway/preimages.py attaches the undo)
    if tier is ToolTier.COMPENSABLE and compensation is None and pre_image is None:
        raise ConfigError(
            f"{where}: a compensable tool needs compensation = {{ tool = ..., args = ... }}"
        )
    return ToolOverride(
        tier=tier,
        cost_weight=body.get("cost_weight"),
        approval=approval,
        compensation=compensation,
        description=body.get("description"),
        labels=_strings(where, body, "labels"),
        untrusted_fields=_strings(where, body, "untrusted_fields") or (),
        pre_image=dict(pre_image) if pre_image is not None else None,
        asked=_strings(where, body, "asked") or (),
    )


def _strings(where: str, body: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    if key not in body:
        return None
    value = body[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {key} must be a list of strings")
    return tuple(value)


def _compensation(where: str, body: Mapping[str, Any]) -> Compensation:
    _no_unknown(
        body,
        {
            "tool",
            "server",
            "fn_name",
            "fn_version",
            "args",
            "max_retries",
            "retry_backoff_ms",
            "claim_timeout_s",
        },
        f"{where} compensation",
    )
    if bool(body.get("tool")) == bool(body.get("fn_name")):
        raise ConfigError(
            f"{where}: compensation names exactly one of tool (an upstream tool the gateway "
            "calls) or fn_name (a function in undolog's registry)"
        )
    return Compensation(
        args=dict(body.get("args") or {}),
        tool=body.get("tool"),
        server=body.get("server"),
        fn_name=body.get("fn_name"),
        fn_version=body.get("fn_version", "1.0.0"),
        max_retries=int(body.get("max_retries", 3)),
        retry_backoff_ms=int(body.get("retry_backoff_ms", 1000)),
        claim_timeout_s=int(body.get("claim_timeout_s", 3600)),
    )


def _no_unknown(table: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")


def _expand_strict(value: Any, where: str) -> Any:
    """``_expand``, refusing a variable that is not set: an unset ``$TOKEN`` must not become the
    literal (and guessable) token ``$TOKEN``."""
    if isinstance(value, str):
        for match in _VARIABLE.finditer(value):
            if (match.group(1) or match.group(2)) not in os.environ:
                raise ConfigError(f"{where}: {match.group(0)} is not set in the environment")
    return _expand(value)


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _expand(value: Any) -> Any:
    return os.path.expandvars(value) if isinstance(value, str) else value
