"""Who is calling: an agent (Bearer key) or a person (session or Token), and in which org."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions, throttling

from core import ratelimit
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
NOT_A_MEMBER = "You are not a member of any organization (or not of that one)."
SEVERAL_ORGS = "You belong to several organizations: pick one with the X-Undolog-Org header."


def resolve_membership(user, slug: str | None) -> tuple[Membership | None, str]:
    """The one answer to "which org is this person acting in": the org named by `slug` (a
    header, the session's choice, a websocket's `?org=`), else the person's only org. One
    query. Returns the membership, or None and the sentence saying why there is none. The
    API, the dashboard pages and the dashboard's websocket all ask this function."""
    memberships = Membership.objects.select_related("org", "user").filter(user=user)
    if slug:
        memberships = memberships.filter(org__slug=slug)
    found = list(memberships[:2])
    if len(found) == 1 or (found and slug):
        return found[0], ""
    return None, SEVERAL_ORGS if found else NOT_A_MEMBER


def caller_of(request) -> Caller:
    """The calling agent or member, with its org. Cached on the request (and on the DRF
    request's underlying HttpRequest, so a view and its permissions resolve it once)."""
    cached = getattr(request, "_undolog_caller", None)
    if cached is not None:
        return cached
    user = request.user
    if isinstance(user, AgentPrincipal):
        caller = Caller(org=user.org, agent=user.agent)
    else:
        slug = request.META.get(ORG_HEADER) or getattr(request, "session", {}).get("org")
        membership, problem = resolve_membership(user, slug)
        if membership is None:
            raise exceptions.PermissionDenied(problem)
        caller = Caller(org=membership.org, membership=membership)
    request._undolog_caller = caller
    return caller


def _is_person(user) -> bool:
    return user is not None and not isinstance(user, AgentPrincipal) and user.is_authenticated


# ---------------------------------------------------------------- permissions
# Every permission of the API is here, and there are three: an agent key, a person's role in
# the org, and "only reads". Views compose them with DRF's | and &, e.g. `IsAgent | IsReviewer`,
# or `ReadOnly & (IsAgent | IsViewer) | IsAdmin`.


class IsAgent(permissions.BasePermission):
    message = "This endpoint is for agents: send Authorization: Bearer <agent key>."

    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, AgentPrincipal)


class HasRole(permissions.BasePermission):
    """A person (never an agent key) with at least `role` in the caller's org."""

    role = Membership.Role.VIEWER
    message = "This needs the viewer role in the organization."

    def has_permission(self, request, view) -> bool:
        return _is_person(request.user) and caller_of(request).has_role(self.role)


class ReadOnly(permissions.BasePermission):
    """GET, HEAD and OPTIONS: composed with a role, "may read"."""

    def has_permission(self, request, view) -> bool:
        return request.method in permissions.SAFE_METHODS


_ROLES: dict[str, type[HasRole]] = {}


def role_required(role: str) -> type[HasRole]:
    """The HasRole class for `role` (one class per role, made once)."""
    if role not in _ROLES:
        _ROLES[role] = type(f"Is{role.title()}", (HasRole,), {
            "role": role, "message": f"This needs the {role} role in the organization.", "__module__": __name__})
    return _ROLES[role]


def explained(permission: Any, message: str) -> type[permissions.BasePermission]:
    """A composition of the classes above (DRF's | and &) with the sentence a refused caller
    reads (DRF's compositions carry none)."""
    return type("Explained", (permissions.BasePermission,), {
        "message": message, "__module__": __name__,
        "has_permission": lambda self, request, view: permission().has_permission(request, view)})


IsViewer = IsMember = role_required(Membership.Role.VIEWER)  # a person with any role; never an agent
IsReviewer = role_required(Membership.Role.REVIEWER)
IsAdmin = role_required(Membership.Role.ADMIN)
IsAgentOrMember = explained(IsAgent | IsViewer, "This needs an agent key of the organization, or a member.")
IsAgentOrReviewer = explained(IsAgent | IsReviewer, "This needs an agent key, or the reviewer role.")
# Agents register their own tools and compensations; people read them, admins change them.
IsAgentOrAdmin = explained(IsAgent | ReadOnly & IsViewer | IsAdmin,
                           "Agents register their own; people read with the viewer role and change with admin.")
# People: viewers read, admins write; agents nothing.
ReadViewerWriteAdmin = explained(ReadOnly & IsViewer | IsAdmin,
                                 "Reading needs the viewer role in the organization; changing it needs admin.")
# As above, and an agent reads (only) its own budget: the views scope what it sees.
OwnBudgetOrReadViewerWriteAdmin = explained(ReadOnly & (IsAgent | IsViewer) | IsAdmin,
                                            "Reading needs the viewer role (an agent reads its own); changing "
                                            "it needs admin.")


class AgentKeyScheme(OpenApiAuthenticationExtension):
    """Documents agent keys in the OpenAPI schema as HTTP bearer auth."""

    target_class = "orgs.auth.AgentKeyAuthentication"
    name = "agentKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "An agent key: ul_<prefix>_<secret>"}


# ---------------------------------------------------------------- rate limits

class ApiRateLimit(throttling.BaseThrottle):
    """Per-key and per-org request limits (core/ratelimit.py), after authentication and
    permissions. Raises `RateLimited` (429 `rate_limited`, `Retry-After`) rather than answering
    False, so the body names the limit. A request the intercept's fast path already counted
    (`undolog_rate_checked`) is not counted twice when it falls back to the pipeline."""

    def allow_request(self, request, view) -> bool:
        if not ratelimit.enabled() or getattr(request._request, "undolog_rate_checked", False):
            return True
        user = request.user
        if isinstance(user, AgentPrincipal):
            subject = f"key:{user.key.prefix}"
        elif _is_person(user):
            subject = f"user:{user.pk}"
        else:
            return True
        try:
            org = caller_of(request).org
        except exceptions.APIException:
            return True  # no org: the view answers 403 itself
        ratelimit.check(ratelimit.api_limits(org.pk, subject, org.rate_limit_per_key, org.rate_limit_per_org))
        return True
