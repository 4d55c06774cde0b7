"""REST API of agents and their keys, for admins: create an agent; issue, list, rotate and
revoke its keys. A key's plaintext is in the answer that creates it and nowhere else (the
server keeps a prefix and a SHA-256 digest). Rotating keeps the old key working for a grace
period (`orgs.models.ROTATION_GRACE`, 24 h) so the agent's processes can switch without a
failed call; revoking stops a key at once.

Written on the existing helpers (`caller_of`, `role_required`); the rules are verbs on
`AgentKey` (`issue`, `rotate`, `revoke`), so the views only validate, look up and call them.
"""

from __future__ import annotations

from typing import Any

from django.core.validators import validate_slug
from django.db import IntegrityError, transaction
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from budgets import api as budgets_api
from budgets.models import Limits
from orgs.auth import caller_of, role_required
from orgs.models import Agent, AgentKey
from undolog_site.errors import Conflict, NotFound
from undolog_site.validation import StrictSerializer, StringField, validated

Admin = role_required("admin")


class AgentSerializer(StrictSerializer):
    # A slug: it is a URL segment of every agent endpoint. StringField, so 7 is refused, not "7".
    name = StringField(max_length=100, validators=[validate_slug])


class KeySerializer(StrictSerializer):
    name = StringField(max_length=100, required=False, allow_blank=True, default="")


def key_dict(key: AgentKey) -> dict[str, Any]:
    """A key as people see it: never its secret."""
    return {"prefix": key.prefix, "display": key.display, "name": key.name, "state": key.state,
            "created": key.created.isoformat(),
            "last_used_at": key.last_used_at.isoformat() if key.last_used_at else None,
            "expires_at": key.expires_at.isoformat() if key.expires_at else None,
            "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None}


def _agent(request: Request, name: str) -> Agent:
    agent = Agent.objects.select_related("org").filter(org=caller_of(request).org, name=name).first()
    if agent is None:
        raise NotFound(f"No agent named {name!r} in this organization.", code="agent_not_found")
    return agent


def _key(agent: Agent, prefix: str) -> AgentKey:
    key = AgentKey.objects.filter(agent=agent, prefix=prefix).first()
    if key is None:
        raise NotFound(f"Agent {agent.name} has no key with prefix {prefix!r}.", code="key_not_found")
    key.agent = agent
    return key


class AgentsView(budgets_api.AgentsView):
    """GET as before (budgets: every agent with today's counters); POST creates one (admin)."""

    @extend_schema(request=AgentSerializer, responses={201: dict})
    def post(self, request: Request) -> Response:
        data = validated(AgentSerializer, request.data)
        org = caller_of(request).org
        try:
            with transaction.atomic():
                agent = Agent.objects.create(org=org, name=data["name"])
        except IntegrityError:
            raise Conflict(f"There is already an agent named {data['name']!r}.", code="agent_exists") from None
        agent.org = org
        source = Limits.for_agent(org.pk, agent.pk).source
        return Response({"agent": budgets_api.agent_dict(agent, None, source)}, status=201)


class KeysView(APIView):
    permission_classes = [Admin]

    @extend_schema(responses={200: dict})
    def get(self, request: Request, name: str) -> Response:
        """The agent's keys, newest first, revoked and expired ones too (for the record)."""
        agent = _agent(request, name)
        keys = AgentKey.objects.filter(agent=agent).order_by("-created", "-id")
        return Response({"keys": [key_dict(key) for key in keys]})

    @extend_schema(request=KeySerializer, responses={201: dict})
    def post(self, request: Request, name: str) -> Response:
        """Issue a key. `key` in the answer is the only time the secret is shown."""
        data = validated(KeySerializer, request.data)
        key, raw = AgentKey.issue(_agent(request, name), name=data["name"])
        return Response({**key_dict(key), "key": raw}, status=201)


class RotateView(APIView):
    permission_classes = [Admin]

    @extend_schema(request=None, responses={201: dict})
    def post(self, request: Request, name: str, prefix: str) -> Response:
        """A successor key (shown once); the rotated key works until its `expires_at`."""
        old = _key(_agent(request, name), prefix)
        new, raw = old.rotate()
        return Response({**key_dict(new), "key": raw, "rotated": key_dict(old)}, status=201)


class RevokeView(APIView):
    permission_classes = [Admin]

    @extend_schema(request=None, responses={200: dict})
    def post(self, request: Request, name: str, prefix: str) -> Response:
        """Stop the key now: the agent's next request with it is a 401."""
        key = _key(_agent(request, name), prefix)
        if not key.revoke():
            raise Conflict(f"The key {key.display} is already revoked.", code="key_revoked")
        return Response(key_dict(key))
