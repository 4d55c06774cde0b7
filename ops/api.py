"""`GET /api/v1/audit/export` (the org's sealed audit records as JSON Lines, for a SIEM) and
`GET|PATCH /api/v1/org/retention` (how long the org keeps what piles up)."""

from __future__ import annotations

import json
from urllib.parse import urlencode

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response

from budgets.api import moment
from core.pagination import bad
from core.schema import errors, ok
from core.validation import StrictSerializer, validated
from ops import audit, shapes
from ops.models import DAYS, Retention
from orgs.auth import IsAdmin, ReadViewerWriteAdmin
from orgs.views import OrgScopedAPIView

MAX_LIMIT = 10_000
NEXT_CURSOR = "X-Next-Cursor"


class JSONLinesAlways(BaseContentNegotiation):
    """The records are always JSON Lines and errors always JSON, whatever `Accept` says (a SIEM
    may ask for application/x-ndjson, application/jsonl or */*): no 406 for a spelling."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class AuditExportView(OrgScopedAPIView):
    permission_classes = [IsAdmin]
    content_negotiation_class = JSONLinesAlways

    @extend_schema(
        summary="The audit chain as JSON Lines (admins)", tags=["streams"],
        description=(
            "One sealed record per line, oldest first: `{seq, kind, occurred, sealed_at, prev_hash, hash, "
            "record}`, where `hash = sha256(prev_hash + RFC 8785 canonical JSON of record)` and the first "
            "record's prev_hash is 64 zeros. A page holds at most `limit` records; when more follow, the "
            "response has `X-Next-Cursor` (pass it as `cursor`) and a `Link: <…>; rel=\"next\"` header. "
            "No header: that was the last page."),
        parameters=[
            OpenApiParameter("since", str, description="ISO 8601: records of events at or after it."),
            OpenApiParameter("cursor", str, description="X-Next-Cursor of the previous page."),
            OpenApiParameter("limit", int, description=f"Records per page, 1 to {MAX_LIMIT} (default 1000)."),
        ],
        responses={(200, "application/jsonl"): OpenApiResponse(OpenApiTypes.STR, description="JSON Lines."),
                   **errors(400, codes={400: ["invalid"]})})
    def get(self, request: Request) -> StreamingHttpResponse:
        since, after, limit = moment(request, "since"), _cursor(request), _limit(request)
        records, next_cursor = audit.page(self.org, since=since, after=after, limit=limit)
        response = StreamingHttpResponse((json.dumps(audit.export_line(r), separators=(",", ":")) + "\n"
                                          for r in records), content_type="application/jsonl")
        if next_cursor is not None:
            query = {**request.query_params.dict(), "cursor": str(next_cursor)}
            response[NEXT_CURSOR] = str(next_cursor)
            response["Link"] = f'<{request.build_absolute_uri(request.path)}?{urlencode(query)}>; rel="next"'
        return response


def _cursor(request: Request) -> int:
    raw = request.query_params.get("cursor") or "0"
    if not raw.isdigit():
        raise bad("cursor", "Not a cursor this API gave out: pass the previous page's X-Next-Cursor.")
    return int(raw)


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit") or "1000"
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise bad("limit", f"Must be a whole number from 1 to {MAX_LIMIT}.")
    return int(raw)


class RetentionSerializer(StrictSerializer):
    safe_call_days = serializers.IntegerField(required=False, validators=DAYS)
    transition_days = serializers.IntegerField(required=False, validators=DAYS)
    event_days = serializers.IntegerField(required=False, validators=DAYS)
    session_days = serializers.IntegerField(required=False, validators=DAYS)


class RetentionView(OrgScopedAPIView):
    permission_classes = [ReadViewerWriteAdmin]

    @extend_schema(summary="Read the org's retention", tags=["org"], responses=ok(shapes.RetentionBodyDict))
    def get(self, request: Request) -> Response:
        return Response({"retention": Retention.of(self.org).as_dict()})

    @extend_schema(summary="Change the org's retention (admins)", tags=["org"], request=RetentionSerializer,
                   responses=ok(shapes.RetentionBodyDict))
    def patch(self, request: Request) -> Response:
        """Days, from 1 to 36500; the next purge (hourly) applies them. Audited as `policy.retention_changed`."""
        retention = Retention.of(self.org)
        retention.change(validated(RetentionSerializer, request.data), self.caller.label)
        return Response({"retention": retention.as_dict()})
