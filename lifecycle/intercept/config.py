"""What the fast paths know of an org before any query: its tools, its agents' budget limits,
its rate limits and whether its rules may hold compensable calls, cached per process and
stamped with the org's `config_version` (bumped by triggers in the same transaction as any change
to tools, compensation functions or budget policies)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from django.http import HttpResponse

from approvals.rules import rules_see_compensable
from budgets.models import Limits
from core import ratelimit
from effects.models import Tool
from lifecycle.intercept.wire import respond
from orgs.models import Organization, RememberedKey

_CONFIGS: dict[uuid.UUID, OrgConfig] = {}


@dataclass
class OrgConfig:
    """What the fast path reads of an org's registry and budgets, as of `version`.

    The version is read before the rows, so a change racing the load can only make the rows
    newer than their stamp: the statement then sees a different version and falls back.
    """

    version: int
    tools: dict[str, Tool]
    limits: dict[uuid.UUID, Limits] = field(default_factory=dict)
    rate_limit_per_key: int | None = None  # the org's own API rate limits (core/ratelimit.py)
    rate_limit_per_org: int | None = None
    rate_limits: dict[str, list[ratelimit.Limit]] = field(default_factory=dict)  # by key prefix
    # An enforcing rule of the org may hold or refuse compensable calls: they all take the pipeline.
    rules_see_compensable: bool = False

    @classmethod
    def of(cls, org_id: uuid.UUID) -> OrgConfig | None:
        config = _CONFIGS.get(org_id)
        if config is None:
            found = Organization.objects.filter(pk=org_id).values_list(
                "config_version", "rate_limit_per_key", "rate_limit_per_org").first()
            if found is None:
                return None
            tools = {tool.name: tool for tool in Tool.objects.filter(org_id=org_id).select_related("compensation_fn")}
            config = _CONFIGS[org_id] = cls(found[0], tools, rate_limit_per_key=found[1], rate_limit_per_org=found[2],
                                            rules_see_compensable=rules_see_compensable(org_id, tools))
        return config

    @classmethod
    def refusal(cls, request, key: RememberedKey) -> HttpResponse | None:
        """`rate_limited` for a fast path that needs nothing else of the org's config (a commit, a
        pre-image): the 429 when a limit is reached; None otherwise, or for an org gone."""
        config = cls.of(key.org_id)
        return config.rate_limited(request, key) if config else None

    def rate_limited(self, request, key: RememberedKey) -> HttpResponse | None:
        """Count the request against its key's and its org's rate limits (one Redis round trip, no
        query: the limits are part of this cache and of its version); the 429 when one is reached.
        Marks the request, so that the pipeline, if it answers instead, does not count it again."""
        if not ratelimit.enabled():
            return None
        request.undolog_rate_checked = True
        limits = self.rate_limits.get(key.prefix)
        if limits is None:
            limits = self.rate_limits[key.prefix] = ratelimit.api_limits(
                key.org_id, f"key:{key.prefix}", self.rate_limit_per_key, self.rate_limit_per_org)
        try:
            ratelimit.check(limits)
        except ratelimit.RateLimited as exc:
            response = respond(429, exc.body())
            response["Retry-After"] = exc.headers["Retry-After"]
            return response
        return None

    def limits_for(self, org_id: uuid.UUID, agent_id: uuid.UUID) -> Limits:
        limits = self.limits.get(agent_id)
        if limits is None:
            limits = self.limits[agent_id] = Limits.for_agent(org_id, agent_id)
        return limits

    @staticmethod
    def forget(org_id: uuid.UUID, seen_version: int | None) -> None:
        config = _CONFIGS.get(org_id)
        if config is not None and config.version != seen_version:
            _CONFIGS.pop(org_id, None)
