"""REST API of the runs: sessions, the intercept, effects and undo entries (DESIGN.md's API contract).

The registry (tools, compensation functions) is effects/api.py.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from approvals.models import ApprovalRequest
from budgets.bodies import budget_body
from core.errors import DomainError, Invalid, NotFound
from core.schema import errors, ok
from core.validation import StrictSerializer, StringField, validated
from effects import longpoll, shapes
from effects.models import Effect, RunFingerprint, Session, Tier, UndoEntry, canonical_json
from lifecycle import claims, rollback
from lifecycle import rewind as rewinds
from lifecycle import shapes as run_shapes
from lifecycle.examples import BUDGET_REFUSAL, COMMITTED, INTERCEPT_EXAMPLES
from lifecycle.intercept import call as calls
from lifecycle.intercept import pipeline
from lifecycle.intercept.config import OrgConfig
from orgs.auth import (
    IsAdmin,
    IsAgent,
    IsAgentOrMember,
    IsAgentOrReviewer,
    IsReviewer,
    IsViewer,
    ReadViewerWriteAdmin,
)
from orgs.models import Agent
from orgs.views import OrgScopedAPIView, OrgScopedViewSet

# ---------------------------------------------------------------- sessions


class SessionCreateSerializer(StrictSerializer):
    # Optional: a key belongs to exactly one agent, so the key says which. When given, it must match.
    agent = StringField(max_length=100, required=False)
    metadata = serializers.DictField(required=False, default=dict)
    inputs = serializers.JSONField(required=False, default=None,
                                   help_text="What the user asked (any JSON): trusted; conditions read run.inputs.")
    # The person who started this run (their username or email): they cannot approve its calls.
    started_by = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    # What the idle sweep makes of the run once it goes quiet: fail (roll back, the default) or complete.
    on_idle = serializers.ChoiceField(choices=Session.OnIdle.choices, required=False, default=Session.OnIdle.FAIL)

    def validate_inputs(self, value: Any) -> Any:
        if value is not None and len(canonical_json(value).encode()) > settings.UNDOLOG_MAX_OUTPUT_BYTES:
            limit = settings.UNDOLOG_MAX_OUTPUT_BYTES // 1024
            raise serializers.ValidationError(f"Must be at most {limit} KiB of JSON.")
        return value


class FailSerializer(StrictSerializer):
    error = serializers.CharField(max_length=10_000, required=False, allow_blank=True, default="")
    safe_calls = serializers.JSONField(required=False, default=None)


class CompleteSerializer(StrictSerializer):
    safe_calls = serializers.JSONField(required=False, default=None)


class SafeCallsSerializer(StrictSerializer):
    safe_calls = serializers.JSONField(help_text="SAFE calls no intercept carried: [{tool, step_index, args?}].")


def session_dict(session: Session, *, full: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(session.id), "agent": session.agent.name, "state": session.state,
        "step_index": session.step_index, "metadata": session.metadata, "inputs": session.inputs,
        "error": session.error or None,
        "started_by": session.started_by or None, "on_idle": session.on_idle,
        "created": session.created.isoformat(), "updated": session.updated.isoformat(),
        "ended_at": session.ended_at.isoformat() if session.ended_at else None,
    }
    if session.rewind_to is not None:
        body["rewinding_to"] = session.rewind_to
    if full:
        effects = list(session.effects.all())
        entries = list(UndoEntry.objects.filter(session=session).lifo().prefetch_related("attempt_log"))
        body["effects"] = [effect.as_dict() for effect in effects]
        body["undo_stack"] = [{**entry.as_dict(), "attempt_log": [a.as_dict() for a in entry.attempt_log.all()]}
                              for entry in entries]
        full_budget = budget_body(session.agent, session)
        body["budget"] = {"tool_calls": session.tool_calls, "irreversible_calls": session.irreversible_calls,
                          "cost": float(session.cost), "tool_counts": session.tool_counts,
                          "violation": session.violation,
                          **{key: full_budget[key] for key in ("limits", "usage", "remaining", "tool_caps",
                                                                "mode", "on_exceeded", "incident")}}
        body["savepoints"] = [point.as_dict() for point in session.savepoints.all()]
        body["rewinds"] = [record.as_dict() for record in session.rewind_log.all()]
    return body


class RewindSerializer(StrictSerializer):
    to_step = serializers.IntegerField(required=False, allow_null=True, default=None,
                                       help_text="The step the run goes back to (0 to its current step).")
    to = StringField(max_length=100, required=False, default=None, help_text="A savepoint's name, instead of to_step.")
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    leave_irreversible = serializers.BooleanField(
        required=False, default=False,
        help_text="Irreversible calls after the step are left done (listed) instead of refusing the rewind.")


class RewindPreviewSerializer(StrictSerializer):
    to_step = serializers.IntegerField(required=False, allow_null=True, default=None)
    to = StringField(max_length=100, required=False, default=None)


class SavepointSerializer(StrictSerializer):
    name = StringField(max_length=100)


class SafeCallSerializer(StrictSerializer):
    tool = StringField(max_length=200)
    step_index = serializers.IntegerField(min_value=0)
    args = serializers.DictField(required=False)
    output = serializers.JSONField(required=False, help_text="The tool's return value (kept as fingerprints only).")


class InterceptSerializer(StrictSerializer):
    """The intercept's body (for the schema: the hot path validates it by hand, `intercept.parse`)."""

    tool = StringField(max_length=200)
    args = serializers.DictField(required=False, help_text="The call's arguments (at most UNDOLOG_MAX_ARGS_BYTES).")
    step_index = serializers.IntegerField(min_value=0)
    reasoning = serializers.CharField(required=False, allow_blank=True, help_text="Why the agent makes the call.")
    idempotency_key = serializers.CharField(required=False, allow_blank=True, max_length=200)
    safe_calls = SafeCallSerializer(many=True, required=False, help_text="SAFE calls since the last intercept.")


class SessionViewSet(OrgScopedViewSet):
    """Runs of an agent: open, intercept calls, complete or fail."""

    queryset = Session.objects.select_related("agent")
    not_found = ("session_not_found", "No such session.")

    def scope(self, queryset, caller):
        sessions = queryset.filter(org=caller.org)
        return sessions.filter(agent=caller.agent) if caller.agent else sessions

    def get_permissions(self):
        if self.action in ("create", "intercept", "complete", "safe_calls"):
            return [IsAgent()]
        if self.action in ("fail", "rewind", "savepoints"):
            return [IsAgentOrReviewer()]
        if self.action == "undo":
            return [IsAdmin()]
        return [IsAgentOrMember()]

    @extend_schema(summary="Open a session (a run of the calling agent)", tags=["sessions"],
                   request=SessionCreateSerializer,
                   responses={**ok(shapes.SessionDict, 201), **errors(404, 423, codes={404: ["agent_not_found"]})})
    def create(self, request: Request) -> Response:
        data = validated(SessionCreateSerializer, request.data)
        agent: Agent = self.caller.agent
        if data.get("agent", agent.name) != agent.name:
            raise NotFound(f"No agent named {data['agent']!r} for this key (the key belongs to {agent.name!r}).",
                           code="agent_not_found")
        if agent.state != Agent.State.ACTIVE:
            raise DomainError(f"The agent {agent.name} is {agent.state}; a reviewer must resume it.",
                              code="agent_suspended", status_code=423,
                              reason=agent.suspend_reason or agent.state, state=agent.state)
        with transaction.atomic():
            session = Session.objects.create(org=agent.org, agent=agent, metadata=data["metadata"],
                                             inputs=data["inputs"], started_by=data["started_by"].strip(),
                                             on_idle=data["on_idle"])
            RunFingerprint.record(session.id, 0, "inputs", data["inputs"], inputs=True)  # trusted: its values vouch
        return Response(session_dict(session), status=status.HTTP_201_CREATED)

    @extend_schema(summary="Read a session with its effects, undo stack and budget", tags=["sessions"],
                   responses={**ok(run_shapes.SessionDetailDict), **errors(404, codes={404: ["session_not_found"]})})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(session_dict(self.get_object(), full=True))

    @extend_schema(operation_id="v1_sessions_list", summary="List sessions (newest 100)", tags=["sessions"],
                   parameters=[OpenApiParameter("state", str, enum=[*Session.State.values, ""],
                                                description="Only sessions in this state. Empty: every state.")],
                   responses=ok(shapes.SessionListDict))
    def list(self, request: Request) -> Response:
        sessions = self.get_queryset()
        state = request.query_params.get("state")
        if state:
            if state not in Session.State.values:
                raise Invalid({"state": f"One of {', '.join(Session.State.values)}."},
                              f"state must be one of {', '.join(Session.State.values)}.")
            sessions = sessions.filter(state=state)
        return Response({"sessions": [session_dict(s) for s in sessions.order_by("-created")[:100]]})

    @extend_schema(
        summary="Intercept a tool call before it runs", tags=["sessions"], request=InterceptSerializer,
        description="Every call that changes something goes through here first: a compensable call is "
                    "logged with its undo entry (201 execute), an irreversible one waits for a reviewer (202 "
                    "await_approval), a call seen before replays (200), a call over the budget is refused (429).",
        responses={**ok(shapes.InterceptDict, 201, "execute: run the tool, then commit the effect. approved: a "
                                "grant decided it; claim it (/start), run it, commit it."),
                   **ok(shapes.InterceptDict, 202, "await_approval: poll the effect until it is decided."),
                   **ok(shapes.InterceptDict, 200, "replay: the same call again; its recorded outcome."),
                   **ok(shapes.InterceptDict, 429, "refused by the budget (or the incident switch).",
                        examples=[BUDGET_REFUSAL]),
                   **errors(404, 409, 423, codes={
                       404: ["session_not_found", "tool_not_registered"],
                       409: ["session_not_running", "session_awaiting_approval", "session_rewinding",
                            "idempotency_key_reused"]}),
                   **errors(400, codes={400: ["invalid", "safe_tool_not_intercepted", "malformed_json",
                                               "too_deep"]})},
        examples=INTERCEPT_EXAMPLES)
    @action(detail=True, methods=["post"])
    def intercept(self, request: Request, pk: str) -> Response:
        call = calls.parse(request.data)
        agent = self.caller.agent
        answer = pipeline.intercept(agent, self.lookup_value(), call)
        if Agent.org.is_cached(agent):
            # The org's config as the key's load read it, no query: a tool registered since this
            # process cached the config is not in it, and its calls would come here until the
            # next fast call of another tool noticed the version. Reloaded on the next call.
            OrgConfig.forget(agent.org_id, agent.org.config_version)
        return Response(answer.body, status=answer.status)

    def _charge_last_safe_calls(self, request: Request, pk: str, raw) -> None:
        reported = calls.parse_safe_calls(raw)
        if reported and self.caller.agent:
            pipeline.report_safe_calls(self.caller.agent, pk, reported)

    @extend_schema(summary="Complete a session", tags=["sessions"], request=CompleteSerializer,
                   responses={**ok(shapes.SessionBodyDict),
                              **errors(404, 409, codes={404: ["session_not_found"], 409: ["session_state_conflict"]})})
    @action(detail=True, methods=["post"])
    def complete(self, request: Request, pk: str) -> Response:
        data = validated(CompleteSerializer, request.data or {})
        session = self.get_object()
        self._charge_last_safe_calls(request, pk, data["safe_calls"])
        session.refresh_from_db()
        session.complete(actor=self.caller.label)
        return Response({"session": session_dict(session)})

    @extend_schema(summary="Report SAFE calls on their own", tags=["sessions"], request=SafeCallsSerializer,
                   description="For a caller whose SAFE calls may not be followed by another request of its own "
                               "(a gateway replica: the run's next call may reach another one). Same rules as the "
                               "intercept's safe_calls: charged to the budget, a step reported twice counts once.",
                   responses={**ok(shapes.SessionBodyDict), **errors(404, codes={404: ["session_not_found"]}),
                              **errors(400, codes={400: ["invalid"]})})
    @action(detail=True, methods=["post"], url_path="safe-calls")
    def safe_calls(self, request: Request, pk: str) -> Response:
        data = validated(SafeCallsSerializer, request.data or {})
        session = self.get_object()
        self._charge_last_safe_calls(request, pk, data["safe_calls"])
        session.refresh_from_db()
        return Response({"session": session_dict(session)})

    @extend_schema(summary="Fail a session: its undo stack is walked back", tags=["sessions"], request=FailSerializer,
                   responses={**ok(shapes.SessionBodyDict),
                              **errors(404, 409, codes={404: ["session_not_found"], 409: ["session_state_conflict"]})})
    @action(detail=True, methods=["post"])
    def fail(self, request: Request, pk: str) -> Response:
        data = validated(FailSerializer, request.data or {})
        session = self.get_object()
        self._charge_last_safe_calls(request, pk, data["safe_calls"])
        session.refresh_from_db()
        session.fail(data["error"], actor=self.caller.label)
        return Response({"session": session_dict(session)})


    @extend_schema(summary="Rewind the run to a step: the effects after it are undone", tags=["sessions"],
                   request=RewindSerializer,
                   description="Every effect after the step is compensated by the walk, newest first; calls after "
                               "it waiting for a reviewer are withdrawn; the run is `compensating` (intercepts get "
                               "409 session_rewinding) until the walk is done, then `running` at the step. "
                               "Irreversible calls after the step: 409 irreversible_in_the_way unless "
                               "leave_irreversible. Budgets are not refunded.",
                   responses={**ok(run_shapes.RewindDict),
                              **errors(400, 404, 409, codes={
                                  400: ["invalid", "step_outside_run"],
                                  404: ["session_not_found", "savepoint_not_found"],
                                  409: ["irreversible_in_the_way", "rewind_in_progress", "walk_stopped",
                                        "session_state_conflict"]})})
    @action(detail=True, methods=["post"])
    def rewind(self, request: Request, pk: str) -> Response:
        data = validated(RewindSerializer, request.data or {})
        sessions = self.scope(Session.objects.all(), self.caller)
        found, record = rewinds.rewind(sessions, self.lookup_value(), to_step=data["to_step"], to=data["to"],
                                       reason=data["reason"], leave_irreversible=data["leave_irreversible"],
                                       actor=self.caller.label)
        session = self.get_object()
        return Response({**found.as_dict(), "rewind": record.as_dict(), "session": session_dict(session)})

    @extend_schema(summary="Preview a rewind (what it would undo and leave done), or its progress", tags=["sessions"],
                   parameters=[OpenApiParameter("to_step", int), OpenApiParameter("to", str)],
                   responses={**ok(run_shapes.RewindPreviewDict),
                              **errors(400, 404, 409, codes={
                                  400: ["invalid", "step_outside_run"],
                                  404: ["session_not_found", "savepoint_not_found"],
                                  409: ["rewind_in_progress", "walk_stopped", "session_state_conflict"]})})
    @rewind.mapping.get
    def rewind_preview(self, request: Request, pk: str) -> Response:
        data = validated(RewindPreviewSerializer, request.query_params.dict())
        session = self.get_object()
        if data["to_step"] is None and data["to"] is None:
            return Response({"in_progress": rewinds.progress(session),
                             "rewinds": [r.as_dict() for r in session.rewind_log.all()]})
        found = rewinds.preview(session, data["to_step"], data["to"])
        body = found.as_dict()
        body["irreversible_in_the_way"] = found.left_done
        return Response(body)

    @extend_schema(summary="Mark the run's current step with a name (a savepoint)", tags=["sessions"],
                   request=SavepointSerializer,
                   responses={**ok(run_shapes.SavepointDict, 201),
                              **errors(400, 404, 409, codes={404: ["session_not_found"],
                                                             409: ["session_not_running"]})})
    @action(detail=True, methods=["post"])
    def savepoints(self, request: Request, pk: str) -> Response:
        data = validated(SavepointSerializer, request.data or {})
        point = rewinds.savepoint(self.get_object(), data["name"])
        return Response(point.as_dict(), status=status.HTTP_201_CREATED)

    @extend_schema(summary="List the run's savepoints", tags=["sessions"],
                   responses={**ok(run_shapes.SavepointListDict), **errors(404, codes={404: ["session_not_found"]})})
    @savepoints.mapping.get
    def savepoints_list(self, request: Request, pk: str) -> Response:
        session = self.get_object()
        return Response({"savepoints": [p.as_dict() for p in session.savepoints.all()]})

    @extend_schema(summary="Undo a completed session (admins)", tags=["sessions"], request=None,
                   responses={**ok(shapes.SessionBodyDict),
                              **errors(404, 409, codes={404: ["session_not_found"], 409: ["session_state_conflict"]})})
    @action(detail=True, methods=["post"])
    def undo(self, request: Request, pk: str) -> Response:
        """An org admin undoes a completed session: its undo stack is walked back."""
        session = self.get_object()
        session.undo(actor=self.caller.label)
        return Response({"session": session_dict(session)})


# ---------------------------------------------------------------- fleet rollback


def _not_in_future(value):
    if value > timezone.now():
        raise serializers.ValidationError("Must not be in the future.")
    return value


SINCE_HELP = ("Roll back the runs that ended at or after this time (ISO 8601; without an offset, UTC). "
              "Open runs are failed whenever they began.")


class RollbackSerializer(StrictSerializer):
    since = serializers.DateTimeField(help_text=SINCE_HELP, validators=[_not_in_future])
    reason = StringField(max_length=2000, help_text="Why: kept with the audited event and on each failed run.")


class RollbackPreviewSerializer(StrictSerializer):
    since = serializers.DateTimeField(required=False, help_text=SINCE_HELP, validators=[_not_in_future])


class AgentFleetView(OrgScopedAPIView):
    """An agent of the caller's org found by name: the fleet rollback's views (admins act, members read)."""

    queryset = Agent.objects.select_related("org")
    lookup_field = "name"
    lookup_is_uuid = False
    permission_classes = [ReadViewerWriteAdmin]
    not_found = ("agent_not_found", "No agent named {value!r} in this organization.")


class AgentRollbackView(AgentFleetView):
    """Fleet rollback of one agent (lifecycle/rollback.py): admins start it, members watch it."""

    @extend_schema(summary="What a rollback would take, and what is being walked back", tags=["agents"],
                   parameters=[OpenApiParameter("since", str, description="ISO 8601; with it, the runs and "
                                                "entries a rollback since then would take now")],
                   responses={**ok(shapes.RollbackPreviewDict), **errors(404, codes={404: ["agent_not_found"]})})
    def get(self, request: Request, name: str) -> Response:
        agent = self.get_object()
        data = validated(RollbackPreviewSerializer, request.query_params.dict())
        body: dict[str, Any] = {}
        if data.get("since") is not None:
            body = {**rollback.preview(agent, data["since"]).as_dict(), "since": data["since"].isoformat()}
        return Response({**body, "in_progress": rollback.progress(agent)})

    @extend_schema(summary="Roll back every run of the agent since a time (admins)", tags=["agents"],
                   request=RollbackSerializer,
                   responses={**ok(shapes.RollbackDict), **errors(404, codes={404: ["agent_not_found"]})})
    def post(self, request: Request, name: str) -> Response:
        """Fails every open run of the agent and undoes every run of it that ended since `since`
        (completed ones too); each run's undo stack is walked back newest first, the runs in
        parallel across the workers. One `agent.rolled_back` event records who, why and the counts."""
        agent = self.get_object()
        data = validated(RollbackSerializer, request.data)
        scope = rollback.rollback(agent, data["since"], data["reason"], actor=self.caller.label)
        return Response({**scope.as_dict(), "since": data["since"].isoformat()})


class AgentRollbacksView(AgentFleetView):
    """An agent's fleet rollbacks, newest first, with what each has left (the agent page's list)."""

    LISTED = 20

    @extend_schema(operation_id="v1_agents_rollbacks_list", summary="The agent's fleet rollbacks (newest 20)",
                   tags=["agents"],
                   responses={**ok(shapes.RollbackListDict), **errors(404, codes={404: ["agent_not_found"]})})
    def get(self, request: Request, name: str) -> Response:
        events = list(rollback.of_agent(self.get_object())[: self.LISTED])
        left = rollback.left_in([event.pk for event in events])
        return Response({"rollbacks": [rollback_dict(event, left) for event in events]})


class RollbackRunsSerializer(StrictSerializer):
    after = serializers.UUIDField(required=False, help_text="The `next` of the previous page.")


class AgentRollbackDetailView(AgentFleetView):
    """One fleet rollback and every run it took (the event carries a sample only)."""

    PAGE = 1000

    @extend_schema(summary="One fleet rollback with its runs (1,000 a page, by id)", tags=["agents"],
                   parameters=[OpenApiParameter("after", str, description="The `next` of the previous page")],
                   responses={**ok(shapes.RollbackDetailDict),
                              **errors(404, codes={404: ["agent_not_found", "rollback_not_found"]})})
    def get(self, request: Request, name: str, rollback_id: str) -> Response:
        agent = self.get_object()
        event = rollback.of_agent(agent).filter(pk=_uuid_or_none(rollback_id)).first()
        if event is None:
            raise NotFound(f"No rollback {rollback_id} of the agent {agent.name}.", code="rollback_not_found")
        after = validated(RollbackRunsSerializer, request.query_params.dict()).get("after")
        runs = rollback.runs_of(event.pk)
        page = list((runs.filter(id__gt=after) if after else runs).values_list("id", "state")[: self.PAGE + 1])
        more = len(page) > self.PAGE
        page = page[: self.PAGE]
        return Response({**rollback_dict(event, rollback.left_in([event.pk])),
                         "sessions": [{"id": str(pk), "state": state} for pk, state in page],
                         "next": str(page[-1][0]) if more else None})


def _uuid_or_none(raw: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(raw)
    except ValueError:
        return None


def rollback_dict(event, left: dict) -> dict[str, Any]:
    data = event.data
    return {"id": str(event.pk), "created": event.created.isoformat(), "by": data.get("by", ""),
            "reason": data.get("reason", ""), "since": data.get("since", ""),
            **{count: data.get(count, 0) for count in ("runs", "entries", "running", "ended")},
            "in_progress": left.get(event.pk, {"runs": 0, "entries_left": 0})}


# ---------------------------------------------------------------- effects


class CommitSerializer(StrictSerializer):
    result = serializers.JSONField(required=False, allow_null=True, default=None)


class EffectFailSerializer(StrictSerializer):
    error = StringField(max_length=10_000)


class EffectViewSet(OrgScopedViewSet):
    queryset = Effect.objects.select_related("tool")  # commit reads its labels (effects/outputs.py)
    not_found = ("effect_not_found", "No such effect.")

    def scope(self, queryset, caller):
        effects = queryset.filter(org=caller.org)
        return effects.filter(session__agent=caller.agent) if caller.agent else effects

    def get_permissions(self):
        if self.action in ("commit", "fail", "start"):
            return [IsAgent()]
        return [IsAgentOrMember()]

    @extend_schema(summary="Read an effect (long-poll with ?wait=)", tags=["effects"],
                   parameters=[OpenApiParameter("wait", float, description="Long-poll up to this many seconds "
                                                "(at most 60) while the effect is pending or approved.")],
                   responses={**ok(shapes.EffectReadDict), **errors(404, codes={404: ["effect_not_found"]})})
    def retrieve(self, request: Request, pk: str) -> Response:
        effect = self.get_object()
        wait = _wait_seconds(request)
        if wait and effect.state in longpoll.WAITED_ON:
            seen = effect.state

            def changed() -> bool:
                return Effect.objects.filter(pk=effect.pk).exclude(state=seen).exists()

            longpoll.wait(effect.pk, wait, changed)
            effect.refresh_from_db()
        body = _effect_body(effect)
        # A decided irreversible call: the decision at the top too ({"decision": "rejected", "reason"}).
        return Response({"effect": body, **{k: body[k] for k in ("decision", "reason") if k in body}})

    @extend_schema(summary="Claim an approved effect before running it", tags=["effects"], request=None,
                   responses={**ok(shapes.EffectBodyDict),
                              **errors(404, 409, codes={404: ["effect_not_found"], 409: ["effect_state_conflict"]})})
    @action(detail=True, methods=["post"])
    def start(self, request: Request, pk: str) -> Response:
        """Claim an approved effect before running it (approved → executing): when two
        callers wait on the same approval, only the first to start may run the tool."""
        effect = self.get_object()
        effect.start_executing(actor=self.caller.label)
        return Response({"effect": effect.as_dict()})

    @extend_schema(summary="Commit an effect: the tool ran, here is its result", tags=["effects"],
                   request=CommitSerializer,
                   responses={**ok(shapes.EffectBodyDict, examples=[COMMITTED]),
                              **errors(404, 409, codes={404: ["effect_not_found"], 409: ["effect_state_conflict"]})},
                   examples=[OpenApiExample("commit", value={"result": {"message_id": "m-42"}}, request_only=True)])
    @action(detail=True, methods=["post"])
    def commit(self, request: Request, pk: str) -> Response:
        data = validated(CommitSerializer, request.data if request.data != {} else {})
        effect = self.get_object()
        effect.commit(data["result"], actor=self.caller.label)
        return Response({"effect": effect.as_dict()})

    @extend_schema(summary="Fail an effect: the tool did not run or failed", tags=["effects"],
                   request=EffectFailSerializer,
                   responses={**ok(shapes.EffectBodyDict),
                              **errors(404, 409, codes={404: ["effect_not_found"], 409: ["effect_state_conflict"]})})
    @action(detail=True, methods=["post"])
    def fail(self, request: Request, pk: str) -> Response:
        data = validated(EffectFailSerializer, request.data)
        effect = self.get_object()
        effect.fail(data["error"], actor=self.caller.label)
        return Response({"effect": effect.as_dict()})


def _effect_body(effect: Effect) -> dict[str, Any]:
    body = effect.as_dict()
    if effect.tier == Tier.IRREVERSIBLE:
        found = ApprovalRequest.for_caller(effect)
        if found is not None:
            body["approval"], fields = found
            body.update(fields)
    return body


def _wait_seconds(request: Request) -> float:
    raw = request.query_params.get("wait")
    if raw in (None, ""):
        return 0
    try:
        value = float(raw)
    except ValueError:
        raise Invalid({"wait": "Must be a number of seconds."}, "wait must be a number of seconds.") from None
    if not 0 <= value <= 60:
        raise Invalid({"wait": "Must be between 0 and 60."}, "wait must be between 0 and 60 seconds.")
    return value




# ---------------------------------------------------------------- undo entries


class ResolveSerializer(StrictSerializer):
    note = serializers.CharField(max_length=10_000, trim_whitespace=True)


UNDO_STATES = [choice for choice, _ in UndoEntry.State.choices]


class ClaimSerializer(StrictSerializer):
    max = serializers.IntegerField(min_value=1, max_value=100, default=10)
    lease_s = serializers.IntegerField(min_value=1, max_value=3600, default=30)
    scopes = serializers.ListField(
        child=serializers.RegexField(r"^[A-Za-z0-9_.:@/+=-]{1,200}$"), required=False, allow_null=True,
        default=None, max_length=100,
        help_text="The upstreams this claimer serves (the gateway's identities): only entries of functions "
                  "registered with one of these scopes. Omitted: only entries of unscoped functions.")


class ReportSerializer(StrictSerializer):
    ok = serializers.BooleanField()
    error = serializers.CharField(max_length=10_000, required=False, allow_blank=True, default="")
    permanent = serializers.BooleanField(required=False, default=False)
    attempt = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)


def undo_entry_dict(entry: UndoEntry, *, attempts: bool = False) -> dict[str, Any]:
    session = entry.session
    body = {**entry.as_dict(), "tool": entry.effect.tool_name, "agent": session.agent.name,
            "session_state": session.state, "handler": entry.fn.handler,
            "waiting_for": entry.waiting_note(entry.fn)}
    if attempts:
        body["attempt_log"] = [attempt.as_dict() for attempt in entry.attempt_log.all()]
    return body


class UndoEntryViewSet(OrgScopedViewSet):
    """Undo entries of the caller's org: the dashboard's list of compensations waiting for a
    person, and the two ways out (retry, or resolved by hand)."""

    queryset = UndoEntry.objects.select_related("session__agent", "effect")
    not_found = ("undo_entry_not_found", "No such undo entry.")

    def scope(self, queryset, caller):
        return queryset.for_org(caller.org)

    def get_permissions(self):
        if self.action in ("retry", "resolve"):
            return [IsReviewer()]
        if self.action in ("claim", "report"):
            return [IsAgent()]
        return [IsViewer()]

    @extend_schema(operation_id="v1_undo_entries_list", summary="List the org's undo entries", tags=["undo entries"],
                   responses=ok(shapes.UndoEntryListDict),
                   parameters=[OpenApiParameter("state", str, enum=[*UNDO_STATES, ""],
                                                description="Empty: every state."),
                               OpenApiParameter("session", str)])
    def list(self, request: Request) -> Response:
        entries = self.get_queryset()
        state, session = request.query_params.get("state"), request.query_params.get("session")
        if state:
            if state not in UNDO_STATES:
                raise Invalid({"state": f"One of {', '.join(UNDO_STATES)}."},
                              f"state must be one of {', '.join(UNDO_STATES)}.")
            entries = entries.filter(state=state)
        if session:
            entries = entries.filter(session_id=_uuid(session, "session"))
        entries = entries.prefetch_related("attempt_log").order_by("-updated")[:200]
        return Response({"undo_entries": [undo_entry_dict(entry, attempts=True) for entry in entries]})

    @extend_schema(summary="Read an undo entry with its attempts", tags=["undo entries"],
                   responses={**ok(shapes.UndoEntryBodyDict), **errors(404, codes={404: ["undo_entry_not_found"]})})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response({"undo_entry": undo_entry_dict(self.get_object(), attempts=True)})

    @extend_schema(summary="Retry a failed compensation", tags=["undo entries"], request=None,
                   responses={**ok(shapes.UndoEntryAnswerDict), **errors(404, 409, codes={
                       404: ["undo_entry_not_found"], 409: ["undo_entry_state_conflict"]})})
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str) -> Response:
        """Another round of attempts for a compensation_failed entry; the walk resumes from it."""
        entry = self.get_object()
        entry.retry(actor=self.caller.label)
        return self._answer(entry)

    @extend_schema(summary="Mark a compensation resolved by hand", tags=["undo entries"], request=ResolveSerializer,
                   responses={**ok(shapes.UndoEntryAnswerDict), **errors(404, 409, codes={
                       404: ["undo_entry_not_found"], 409: ["undo_entry_state_conflict"]})})
    @action(detail=True, methods=["post"])
    def resolve(self, request: Request, pk: str) -> Response:
        """A person undid the effect by hand; the walk resumes below the entry."""
        data = validated(ResolveSerializer, request.data)
        entry = self.get_object()
        entry.resolve(actor=self.caller.label, note=data["note"])
        return self._answer(entry)

    @extend_schema(summary="Claim the agent-side undo entries the walk waits on", tags=["undo entries"],
                   request=ClaimSerializer, responses={**ok(shapes.ClaimedListDict), **errors()})
    @action(detail=False, methods=["post"])
    def claim(self, request: Request) -> Response:
        """The agent side takes the agent-handler entries the walk is waiting on, each under a lease."""
        data = validated(ClaimSerializer, request.data)
        entries = claims.claim(self.caller.agent, data["max"], data["lease_s"], data["scopes"])
        return Response({"entries": [claims.claim_dict(entry) for entry in entries]})

    @extend_schema(summary="Report how a claimed undo entry went", tags=["undo entries"],
                   request=ReportSerializer,
                   responses={**ok(shapes.UndoEntryBodyDict),
                              **errors(404, 409, codes={404: ["undo_entry_not_found"],
                                                        409: ["undo_entry_not_claimed"]})})
    @action(detail=True, methods=["post"])
    def report(self, request: Request, pk: str) -> Response:
        """The claimer says how its attempt went; recorded like a worker's, and the walk goes on."""
        data = validated(ReportSerializer, request.data)
        entry = self.get_object(self.get_queryset().filter(session__agent=self.caller.agent).select_related("fn"))
        claims.report(entry, data["ok"], data["error"], data["permanent"], data["attempt"])
        return Response({"undo_entry": entry.as_dict()})

    def _answer(self, entry: UndoEntry) -> Response:
        # The walk may already have run (eagerly, or on a fast worker): answer what the rows say now.
        entry = self.get_object()
        return Response({"undo_entry": undo_entry_dict(entry, attempts=True),
                         "session": session_dict(entry.session)})


def _uuid(value: str, name: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise Invalid({name: "Must be a UUID."}, f"{name} must be a UUID.") from None
