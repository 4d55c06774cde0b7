"""Typed response bodies of the agents-and-keys API (`orgs/api.py`), read by the OpenAPI schema."""

from __future__ import annotations

from typing import Literal, TypedDict


class KeyDict(TypedDict):
    """An agent key as people see it: never its secret."""

    prefix: str
    display: str
    name: str
    state: Literal["active", "rotating", "expired", "revoked"]
    created: str
    last_used_at: str | None
    expires_at: str | None
    revoked_at: str | None


class KeyListDict(TypedDict):
    keys: list[KeyDict]


class IssuedKeyDict(KeyDict):
    """A new key: `key` is the secret, shown in this answer and nowhere else."""

    key: str


class RotatedKeyDict(IssuedKeyDict):
    """The successor key, and the rotated one (valid until its `expires_at`)."""

    rotated: KeyDict


class AgentSettingsDict(TypedDict):
    """An agent's own settings: `run_idle_timeout_s` null means the org's applies
    (`effective_run_idle_timeout_s`, 0: its runs are never abandoned)."""

    name: str
    run_idle_timeout_s: int | None
    effective_run_idle_timeout_s: int
