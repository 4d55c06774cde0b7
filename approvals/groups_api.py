"""The reviewer groups API (`/api/v1/reviewer-groups`): members read, admins write.

Members are named by username or email and must be reviewers or admins of the org (a viewer
can decide nothing, so in a group they would only hide that nobody can approve). Edits go
through `ReviewerGroup.add`, `change` and `remove`, which record a `reviewer_group.changed`
event; a group a rule or a pending request uses is 409 `reviewer_group_in_use` on delete.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from approvals import shapes
from approvals.groups import MAX_GROUPS_PER_ORG, ReviewerGroup
from core.errors import Conflict, Invalid
from core.schema import errors, ok
from core.validation import StrictSerializer, StringField, validated
from orgs.auth import IsAdmin, IsMember
from orgs.models import Membership
from orgs.views import OrgScopedViewSet

MAX_MEMBERS = 200


class ReviewerGroupSerializer(StrictSerializer):
    name = serializers.RegexField(r"^[A-Za-z0-9_-]{1,64}$", error_messages={
        "invalid": "Letters, digits, - and _ only, at most 64 characters (rules name the group by it)."})
    description = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
    members = serializers.ListField(child=StringField(max_length=254), max_length=MAX_MEMBERS, required=False,
                                    default=list)


def memberships(org, names: list[str]) -> list[Membership]:
    """The org's reviewer or admin memberships named (username or email); 400 naming the first
    name that is not one."""
    wanted = list(dict.fromkeys(name.strip() for name in names if name.strip()))
    found = list(Membership.objects.filter(org=org).select_related("user").filter(
        Q(user__username__in=wanted) | Q(user__email__in=wanted)))
    by_name: dict[str, Membership] = {}
    for membership in found:
        by_name[membership.user.username] = membership
        if membership.user.email:
            by_name.setdefault(membership.user.email, membership)
    chosen: dict[int, Membership] = {}
    for name in wanted:
        membership = by_name.get(name)
        if membership is None:
            raise Invalid({"members": f"{name!r} is not a member of this organization."},
                          f"members: {name!r} is not a member of this organization.")
        if not membership.has_role(Membership.Role.REVIEWER):
            raise Invalid({"members": f"{name!r} is a viewer and can approve nothing; make them a reviewer first."},
                          f"members: {name!r} is a viewer and can approve nothing.")
        chosen[membership.pk] = membership
    return list(chosen.values())


def _name_taken(name: str) -> Conflict:
    return Conflict(f"A reviewer group named {name!r} exists in this organization.", code="reviewer_group_exists")


GROUP_EXAMPLE = OpenApiExample("finance", request_only=True, value={
    "name": "finance", "description": "Approves refunds over 1,000.", "members": ["dana", "lee@example.com"]})


class ReviewerGroupViewSet(OrgScopedViewSet):
    """Named sets of the org's reviewers: a `require` rule may hand its calls to one."""

    queryset = ReviewerGroup.objects.all()
    not_found = ("reviewer_group_not_found", "No such reviewer group.")
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_permissions(self):
        if self.action in ("create", "partial_update", "destroy"):
            return [IsAdmin()]
        return [IsMember()]

    @extend_schema(operation_id="v1_reviewer_groups_list", summary="List the reviewer groups with their members",
                   tags=["rules"], responses=ok(shapes.ReviewerGroupListDict))
    def list(self, request: Request) -> Response:
        groups = self.get_queryset().prefetch_related("members__user")
        return Response({"reviewer_groups": [group.as_dict() for group in groups]})

    @extend_schema(summary="Read a reviewer group", tags=["rules"],
                   responses={**ok(shapes.ReviewerGroupDict), **errors(404, codes={404: ["reviewer_group_not_found"]})})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(self.get_object().as_dict())

    @extend_schema(summary="Create a reviewer group (admins)", tags=["rules"], request=ReviewerGroupSerializer,
                   examples=[GROUP_EXAMPLE],
                   responses={**ok(shapes.ReviewerGroupDict, 201),
                              **errors(400, 409, codes={400: ["invalid"], 409: ["reviewer_group_exists"]})})
    def create(self, request: Request) -> Response:
        data = validated(ReviewerGroupSerializer, request.data)
        members = memberships(self.org, data["members"])
        if ReviewerGroup.objects.for_org(self.org).count() >= MAX_GROUPS_PER_ORG:
            raise Invalid({"name": f"An organization has at most {MAX_GROUPS_PER_ORG} reviewer groups."},
                          f"An organization has at most {MAX_GROUPS_PER_ORG} reviewer groups; delete one first.")
        try:
            with transaction.atomic():
                group = ReviewerGroup.add(self.org, data["name"], data["description"], members,
                                          actor=self.caller.label)
        except IntegrityError:
            raise _name_taken(data["name"]) from None
        return Response(group.as_dict(), status=201)

    @extend_schema(summary="Rename a reviewer group, describe it or set its members (admins)", tags=["rules"],
                   request=ReviewerGroupSerializer,
                   responses={**ok(shapes.ReviewerGroupDict), **errors(400, 404, 409, codes={
                       400: ["invalid"], 404: ["reviewer_group_not_found"], 409: ["reviewer_group_exists"]})})
    def partial_update(self, request: Request, pk: str) -> Response:
        data: dict[str, Any] = validated(ReviewerGroupSerializer, request.data, partial=True)
        if not data:
            raise Invalid({"non_field_errors": "Send at least one of name, description, members."},
                          "Send at least one of name, description, members.")
        if "members" in data:
            data["members"] = memberships(self.org, data["members"])
        group = self.get_object()
        try:
            with transaction.atomic():
                group.change(data, actor=self.caller.label)
        except IntegrityError:
            raise _name_taken(data["name"]) from None
        return Response(group.as_dict())

    @extend_schema(summary="Delete a reviewer group no rule or pending request uses (admins)", tags=["rules"],
                   responses={204: None, **errors(404, 409, codes={404: ["reviewer_group_not_found"],
                                                                   409: ["reviewer_group_in_use"]})})
    def destroy(self, request: Request, pk: str) -> Response:
        group = self.get_object()
        busy = group.in_use()
        if busy:
            raise Conflict(f"The reviewer group {group.name!r} is in use: {busy}. Point those rules elsewhere "
                           "(and let its pending requests be decided) first.", code="reviewer_group_in_use")
        group.remove(actor=self.caller.label)
        return Response(status=204)

