"""Who is calling: an agent (Bearer key) or a person (session or Token), and in which org."""

from __future__ import annotations

from dataclasses import dataclass

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions

from orgs.models import Agent, AgentKey, Membership, Organization


class AgentPrincipal:
    """What `request.user` is when an agent key authenticated the request."""

    is_authenticated = True
    is_anonymous = False
    is_staff = False
    is_superuser = False

    def __init__(self, key: AgentKey) -> None:
        self.key = key
        self.agent: Agent = key.agent
        self.org: Organization = key.agent.org
        self.pk = None

    def __str__(self) -> str:
        return f"agent:{self.agent.name}"


class AgentKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(errors="replace")
        scheme, _, raw = header.partition(" ")
        if scheme != self.keyword:
            return None
        key = AgentKey.authenticate(raw.strip())
        if key is None:
            raise exceptions.AuthenticationFailed("The agent key is not valid or was revoked.")
        return AgentPrincipal(key), key

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


@dataclass
class Caller:
    org: Organization
    agent: Agent | None = None
    membership: Membership | None = None

    @property
    def user(self):
        return self.membership.user if self.membership else None

    @property
    def label(self) -> str:
        return f"agent:{self.agent.name}" if self.agent else self.membership.user.get_username()

    def has_role(self, role: str) -> bool:
        return self.membership is not None and self.membership.has_role(role)


ORG_HEADER = "HTTP_X_UNDOLOG_ORG"


def caller_of(request) -> Caller:
    """The calling agent or member, with its org. Cached on the request."""
    cached = getattr(request, "_undolog_caller", None)
    if cached is not None:
        return cached
    user = request.user
    if isinstance(user, AgentPrincipal):
        caller = Caller(org=user.org, agent=user.agent)
    else:
        caller = Caller(org=None, membership=_membership(request, user))  # type: ignore[arg-type]
        caller.org = caller.membership.org
    request._undolog_caller = caller
    return caller


def _membership(request, user) -> Membership:
    memberships = Membership.objects.select_related("org", "user").filter(user=user)
    slug = request.META.get(ORG_HEADER) or getattr(request, "session", {}).get("org")
    if slug:
        memberships = memberships.filter(org__slug=slug)
    found = list(memberships[:2])
    if len(found) == 1 or (found and slug):
        return found[0]
    if not found:
        raise exceptions.PermissionDenied("You are not a member of any organization (or not of that one).")
    raise exceptions.PermissionDenied("You belong to several organizations: pick one with the X-Undolog-Org header.")


class IsAgent(permissions.BasePermission):
    message = "This endpoint is for agents: send Authorization: Bearer <agent key>."

    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, AgentPrincipal)


def role_required(role: str) -> type[permissions.BasePermission]:
    """A permission class: a member of the caller's org with at least `role`."""

    class HasRole(permissions.BasePermission):
        message = f"This needs the {role} role in the organization."

        def has_permission(self, request, view) -> bool:
            user = request.user
            if user is None or isinstance(user, AgentPrincipal) or not user.is_authenticated:
                return False
            return caller_of(request).has_role(role)

    HasRole.__name__ = f"Has{role.title()}Role"
    return HasRole


class IsAgentOrMember(permissions.BasePermission):
    """Agents of the org, or any member (viewer and up)."""

    def has_permission(self, request, view) -> bool:
        user = request.user
        if isinstance(user, AgentPrincipal):
            return True
        return bool(user and user.is_authenticated and caller_of(request).membership)



class AgentKeyScheme(OpenApiAuthenticationExtension):
    """Documents agent keys in the OpenAPI schema as HTTP bearer auth."""

    target_class = "orgs.auth.AgentKeyAuthentication"
    name = "agentKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "An agent key: ul_<prefix>_<secret>"}
