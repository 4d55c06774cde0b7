"""The base of every API view: tenancy written once.

A view on this base never looks up a row by hand and never asks who is calling: `self.caller`
(the agent or member, with its org, resolved once per request), `get_queryset()` (the
caller's org's rows, narrowed by `scope()` for agents), and `get_object()` (one of those by
the path's id, or the view's own 404). A path id that is not a UUID is that same 404, before
any query; the view's body never sees it.

A new endpoint, in full:

    class WidgetViewSet(OrgScopedViewSet):
        queryset = Widget.objects.all()
        not_found = ("widget_not_found", "No such widget.")
        permission_classes = [IsReviewer]

        @extend_schema(request=PokeSerializer, responses={200: WidgetBody}, summary="Poke a widget")
        @action(detail=True, methods=["post"])
        def poke(self, request, pk):
            data = validated(PokeSerializer, request.data)
            widget = self.get_object()
            widget.poke(data["how"], actor=self.caller.label)  # the verb lives on the model
            return Response({"widget": widget.as_dict()})
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.openapi import AutoSchema
from rest_framework.generics import GenericAPIView
from rest_framework.metadata import SimpleMetadata
from rest_framework.viewsets import GenericViewSet

from core.errors import NotFound
from orgs.auth import Caller, caller_of
from orgs.models import Organization

# What the routers accept as a path id. Deliberately loose: a 36-character string that is
# not a UUID reaches the view and gets the resource's own 404 code (clients match on it).
UUID_PATTERN = "[0-9a-fA-F-]{36}"


class ObjectBodies(AutoSchema):
    """Every body of this API is an object (a list comes wrapped: `{"sessions": [...]}`), so
    a viewset's `list` is not documented as a bare array."""

    def _is_list_view(self, serializer: Any = None) -> bool:
        return False


class NoSerializerMetadata(SimpleMetadata):
    """OPTIONS says what APIView said (name, description, renders, parses): the request
    serializers are per handler, not the view's, and the schema documents them."""

    def determine_actions(self, request, view) -> dict:
        return {}


class OrgScoped:
    """Mixin for DRF's generic views. Subclasses set `queryset`, `not_found`, and override
    `scope()` when an agent sees less than its org."""

    lookup_field = "pk"
    lookup_value_regex = UUID_PATTERN
    lookup_is_uuid = True
    not_found: tuple[str, str] = ("not_found", "Not found.")
    schema = ObjectBodies()
    metadata_class = NoSerializerMetadata

    @property
    def caller(self) -> Caller:
        return caller_of(self.request)

    @property
    def org(self) -> Organization:
        return self.caller.org

    def scope(self, queryset: QuerySet, caller: Caller) -> QuerySet:
        """The rows `caller` may see: its org's. Override to narrow it for agents."""
        return queryset.filter(org=caller.org)

    def get_queryset(self) -> QuerySet:
        return self.scope(super().get_queryset(), self.caller)

    def initial(self, request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        self.lookup_value()  # a malformed id is a 404 after authentication, before the handler

    def lookup_value(self) -> Any:
        """The path's id, checked: a UUID (or the raw value for non-UUID lookups, like names)."""
        raw = self.kwargs.get(self.lookup_url_kwarg or self.lookup_field)
        if raw is None or not self.lookup_is_uuid:
            return raw
        try:
            return uuid.UUID(str(raw))
        except ValueError:
            raise self.missing() from None

    def missing(self) -> NotFound:
        """The view's 404: `not_found` is (code, message); the message may name the `{value}`."""
        code, message = self.not_found
        return NotFound(message.format(value=self.kwargs.get(self.lookup_url_kwarg or self.lookup_field)), code=code)

    def get_object(self, queryset: QuerySet | None = None, *, lock: bool = False) -> Any:
        """The caller's org's row named by the path, or the view's 404. `lock` takes a row lock
        (inside the caller's transaction) to serialise edits of that row."""
        rows = self.get_queryset() if queryset is None else queryset
        if lock:
            rows = rows.select_for_update(of=("self",))
        found = rows.filter(**{self.lookup_field: self.lookup_value()}).first()
        if found is None:
            raise self.missing()
        return found


class OrgScopedAPIView(OrgScoped, GenericAPIView):
    """A single endpoint (GET/POST/PATCH/DELETE handlers) on the org-scoped base."""


class OrgScopedViewSet(OrgScoped, GenericViewSet):
    """A resource with a router (list, retrieve, detail actions) on the org-scoped base."""
