"""REST API of agents' keys and settings, for admins: issue, list, rotate and revoke an agent's
keys (an agent itself is created by `POST /agents`, budgets/api.py: its answer carries its
budget). A key's plaintext is in the answer that creates it and nowhere else (the server keeps
a prefix and a SHA-256 digest). Rotating keeps the old key working for a grace period
(`orgs.models.ROTATION_GRACE`, 24 h) so the agent's processes can switch without a failed
call; revoking stops a key at once.

On the org-scoped base view (`orgs/views.py`); the rules are verbs on `AgentKey` (`issue`,
`rotate`, `revoke`), so the views only validate, look up and call them.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from core.errors import Conflict, NotFound
from core.schema import errors, ok
from core.validation import StrictSerializer, StringField, validated
from orgs import shapes
from orgs.auth import IsAdmin, ReadViewerWriteAdmin
from orgs.models import Agent, AgentKey
from orgs.views import OrgScopedAPIView

AGENT_404 = errors(404, codes={404: ["agent_not_found"]})
KEY_404 = errors(404, codes={404: ["agent_not_found", "key_not_found"]})


class AgentSettingsSerializer(StrictSerializer):
    run_idle_timeout_s = serializers.IntegerField(min_value=0, max_value=30 * 86400, allow_null=True)


def agent_settings_dict(agent: Agent) -> dict[str, Any]:
    return {"name": agent.name, "run_idle_timeout_s": agent.run_idle_timeout_s,
            "effective_run_idle_timeout_s": agent.idle_timeout_s}


class KeySerializer(StrictSerializer):
    name = StringField(max_length=100, required=False, allow_blank=True, default="")


def key_dict(key: AgentKey) -> dict[str, Any]:
    """A key as people see it: never its secret."""
    return {"prefix": key.prefix, "display": key.display, "name": key.name, "state": key.state,
            "created": key.created.isoformat(),
            "last_used_at": key.last_used_at.isoformat() if key.last_used_at else None,
            "expires_at": key.expires_at.isoformat() if key.expires_at else None,
            "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None}


def _key(agent: Agent, prefix: str) -> AgentKey:
    key = AgentKey.objects.filter(agent=agent, prefix=prefix).first()
    if key is None:
        raise NotFound(f"Agent {agent.name} has no key with prefix {prefix!r}.", code="key_not_found")
    key.agent = agent
    return key


class AgentKeys(OrgScopedAPIView):
    """An agent of the caller's org by name, for its admins."""

    queryset = Agent.objects.select_related("org")
    lookup_field = "name"
    lookup_is_uuid = False
    permission_classes = [IsAdmin]
    not_found = ("agent_not_found", "No agent named {value!r} in this organization.")


class KeysView(AgentKeys):
    @extend_schema(summary="List an agent's keys", tags=["agents"], responses={**ok(shapes.KeyListDict), **AGENT_404})
    def get(self, request: Request, name: str) -> Response:
        """The agent's keys, newest first, revoked and expired ones too (for the record)."""
        keys = AgentKey.objects.filter(agent=self.get_object()).order_by("-created", "-id")
        return Response({"keys": [key_dict(key) for key in keys]})

    @extend_schema(summary="Issue a key (its secret is shown once)", tags=["agents"], request=KeySerializer,
                   responses={**ok(shapes.IssuedKeyDict, 201), **AGENT_404})
    def post(self, request: Request, name: str) -> Response:
        """Issue a key. `key` in the answer is the only time the secret is shown."""
        data = validated(KeySerializer, request.data)
        key, raw = AgentKey.issue(self.get_object(), name=data["name"])
        return Response({**key_dict(key), "key": raw}, status=201)


class RotateView(AgentKeys):
    @extend_schema(summary="Rotate a key: a successor now, the old one until its grace ends", tags=["agents"],
                   request=None, responses={**ok(shapes.RotatedKeyDict, 201), **KEY_404,
                                            **errors(409, codes={409: ["key_not_active"]})})
    def post(self, request: Request, name: str, prefix: str) -> Response:
        """A successor key (shown once); the rotated key works until its `expires_at`."""
        old = _key(self.get_object(), prefix)
        new, raw = old.rotate()
        return Response({**key_dict(new), "key": raw, "rotated": key_dict(old)}, status=201)


class RevokeView(AgentKeys):
    @extend_schema(summary="Revoke a key: its next request is a 401", tags=["agents"], request=None,
                   responses={**ok(shapes.KeyDict), **KEY_404, **errors(409, codes={409: ["key_revoked"]})})
    def post(self, request: Request, name: str, prefix: str) -> Response:
        """Stop the key now: the agent's next request with it is a 401."""
        key = _key(self.get_object(), prefix)
        if not key.revoke():
            raise Conflict(f"The key {key.display} is already revoked.", code="key_revoked")
        return Response(key_dict(key))


class AgentSettingsView(AgentKeys):
    """An agent's own settings (members read, admins change): today its idle timeout."""

    permission_classes = [ReadViewerWriteAdmin]

    @extend_schema(summary="Read an agent's settings", tags=["agents"],
                   responses={**ok(shapes.AgentSettingsDict), **AGENT_404})
    def get(self, request: Request, name: str) -> Response:
        return Response(agent_settings_dict(self.get_object()))

    @extend_schema(summary="Change an agent's settings (admins)", tags=["agents"], request=AgentSettingsSerializer,
                   responses={**ok(shapes.AgentSettingsDict), **AGENT_404})
    def patch(self, request: Request, name: str) -> Response:
        """`run_idle_timeout_s`: seconds its runs may stay silent before they are failed as abandoned
        (0: never; null: the org's)."""
        data = validated(AgentSettingsSerializer, request.data, partial=True)
        agent = self.get_object()
        for field, value in data.items():
            setattr(agent, field, value)
        if data:
            agent.save(update_fields=list(data))
        return Response(agent_settings_dict(agent))
