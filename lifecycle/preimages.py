"""Pre-images at run time (issue 42): the agent side's before read is kept with the call's undo
entry, bounded and sealed; what the call left is recorded as a digest; and the pre-images of
runs that can no longer be undone are dropped. The declaration is effects/preimages.py.

    POST /api/v1/effects/{id}/pre-image {"value", "absent"?, "after_digest"?}   (agent of the run)
    POST /api/v1/effects/{id}/pre-image {"size", "over_bound": true}             (too big to send)
    POST /api/v1/effects/{id}/after-image {"digest"}                             (after the call)

The client calls the first after the intercept answered `execute` (or after `/start` of an
approved call) and before it runs the call; the call runs only on a 201/200 answer with
`"decision": "execute"`. Over a bound (the declaration's `max_bytes`, else the run's
`UNDOLOG_PRE_IMAGE_RUN_MAX_BYTES`), the declaration's `over_bound` decides: `hold` keeps the
pre-image (it must fit `UNDOLOG_PRE_IMAGE_MAX_BYTES`) and holds the call for a person (202
`await_approval`, as an irreversible call's); `refuse` fails the effect without running it
(409 `pre_image_over_bound`). A pre-image too big for the server at all is always refused:
a call never runs without its undo.

The intercept's hot paths are untouched: a tool without a declaration never reaches this module.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, models, transaction
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from approvals import notify
from approvals.models import ApprovalRequest
from core import prepared
from core.errors import Conflict
from core.schema import errors
from core.seal import seal
from core.validation import StrictSerializer, validated
from effects import preimages
from effects.models import Effect, PreImage, Session, UndoEntry
from lifecycle.intercept.config import OrgConfig
from lifecycle.intercept.sql import live_key
from lifecycle.intercept.wire import json_body, remembered_key, respond
from orgs.auth import IsAgent
from orgs.models import AgentKey
from orgs.views import OrgScopedAPIView

ACTOR = "pre-image"
DIGEST = r"^sha256:[0-9a-f]{64}$"
_DIGEST = re.compile(DIGEST[1:-1])


class PreImageSerializer(StrictSerializer):
    value = serializers.JSONField(required=False, allow_null=True, default=None,
                                  help_text="The before read's value (null with absent).")
    absent = serializers.BooleanField(required=False, default=False,
                                      help_text="The before read said nothing was there.")
    after_digest = serializers.RegexField(DIGEST, required=False, default="",
                                          help_text="What the call will leave, when its args say (a write's content).")
    size = serializers.IntegerField(min_value=0, required=False, default=None, allow_null=True,
                                    help_text="With over_bound: the pre-image's size, too big to send.")
    over_bound = serializers.BooleanField(required=False, default=False)

    def validate(self, attrs: dict) -> dict:
        if attrs["absent"] and attrs["value"] is not None:
            raise serializers.ValidationError({"value": ["An absent pre-image has no value (send null)."]})
        if attrs["over_bound"] and attrs["size"] is None:
            raise serializers.ValidationError({"size": ["Say how big the pre-image is (bytes of its JSON)."]})
        return attrs


class AfterImageSerializer(StrictSerializer):
    digest = serializers.RegexField(DIGEST, help_text="sha256:<hex> of the target's state after the call.")


class RunEffectView(OrgScopedAPIView):
    """An effect of one of the calling agent's runs (another agent's, or another org's, is a 404)."""

    permission_classes = [IsAgent]
    queryset = Effect.objects.all()
    not_found = ("effect_not_found", "No such effect.")

    def scope(self, queryset, caller):
        return queryset.filter(org=caller.org, session__agent=caller.agent)


class EffectPreImageView(RunEffectView):
    # One read: the effect, its tool's declaration, its undo entry and any pre-image kept already.
    queryset = Effect.objects.select_related("tool", "undo_entry", "undo_entry__pre_image")

    @extend_schema(summary="Keep a call's pre-image before running it", tags=["effects"],
                   request=PreImageSerializer, responses=errors(404, 409))
    def post(self, request: Request, pk: str) -> Response:
        data = validated(PreImageSerializer, request.data)
        effect = self.get_object()
        status, body = keep(effect, data, actor=self.caller.label)
        return Response(body, status=status)


class EffectAfterImageView(RunEffectView):

    @extend_schema(summary="Record what a call left (its after-image's digest)", tags=["effects"],
                   request=AfterImageSerializer, responses=errors(404, 409))
    def post(self, request: Request, pk: str) -> Response:
        data = validated(AfterImageSerializer, request.data)
        effect = self.get_object()
        # Only the first digest counts: a retried report cannot move what the restore compares with.
        changed = PreImage.objects.filter(entry__effect=effect, after_digest="").update(after_digest=data["digest"])
        kept = PreImage.objects.filter(entry__effect=effect).first()
        if kept is None:
            raise Conflict("This call kept no pre-image.", code="no_pre_image")
        return Response({"pre_image": kept.digests(), "recorded": bool(changed)})


def keep(effect: Effect, data: dict[str, Any], *, actor: str) -> tuple[int, dict[str, Any]]:
    """Keep the pre-image of an `executing` call, or hold or refuse the call over its bound.

    The view's way (SQLite, and on PostgreSQL what the fast path below leaves to it): the read
    above, then in one transaction the run's row locked, the insert and the run's bytes raised."""
    declaration = effect.tool.pre_image if effect.tool is not None else None
    if not declaration:
        raise Conflict(f"{effect.tool_name} declares no before read.", code="no_pre_image_declared")
    entry = getattr(effect, "undo_entry", None)
    kept = getattr(entry, "pre_image", None) if entry is not None else None
    if kept is not None:
        # A retried request, or the approved call after a hold: one before read per call.
        return 200, _answer(effect, kept)
    if effect.state != Effect.State.EXECUTING or entry is None:
        raise Conflict(f"The effect is {effect.state}: a pre-image is kept just before the call runs.",
                       code="effect_state_conflict", state=effect.state)
    entry_max, over_bound = preimages.declared_bound(declaration)
    hard_max = settings.UNDOLOG_PRE_IMAGE_MAX_BYTES
    body = preimages.canonical(None if data["absent"] else data["value"]) if not data["over_bound"] else b""
    size = data["size"] if data["over_bound"] else len(body)
    sealed = seal(preimages.sealable(body)) if not data["over_bound"] else b""  # outside the lock
    with transaction.atomic():
        # The run's row, locked, with what the run keeps read off it: two calls of one run keeping
        # pre-images at once must not both fit under the run's bound that only one of them fits
        # under. The lock waits for the other call's commit and then reads the row as it left it
        # (a sum over the run's pre-images would be read in a snapshot taken before the wait).
        session = (Session.objects.select_for_update(of=("self",)).filter(pk=effect.session_id)
                   .only("id", "state", "org_id", "step_index", "pre_image_bytes").get())
        over = _over(size, entry_max, session.pre_image_bytes)
        if data["over_bound"] or size > hard_max or (over and over_bound == "refuse"):
            why = over or f"{size} bytes"
            if size > hard_max:
                why = f"{size} bytes, over the server's {hard_max} (UNDOLOG_PRE_IMAGE_MAX_BYTES)"
            message = (f"{effect.tool_name} was not run: its pre-image is {why}, and a call never runs "
                       "without its undo.")
            effect.fail(message, actor=ACTOR)
            # It never ran: nothing to undo.
            UndoEntry.objects.filter(effect=effect, state=UndoEntry.State.PENDING).update(
                state=UndoEntry.State.SKIPPED, updated=timezone.now())
            refused = Conflict(message, code="pre_image_over_bound", size=size, bound=entry_max)
        else:
            refused = None
            try:
                with transaction.atomic():  # a savepoint: the same call's keep, sent twice at once
                    kept = PreImage.objects.create(
                        entry=entry, session_id=session.pk, sealed=sealed, size=size, absent=data["absent"],
                        before_digest=preimages.digest_of(body), after_digest=data["after_digest"],
                        held=bool(over))
            except IntegrityError:
                # The other one kept it first (both read "none kept" before the run's lock): one
                # before read per call, so this one is answered as a retry is.
                effect.refresh_from_db(fields=["state"])
                return 200, _answer(effect, PreImage.objects.get(entry=entry))
            Session.objects.filter(pk=session.pk).update(pre_image_bytes=models.F("pre_image_bytes") + size)
            if over:
                return 202, _hold(effect, session, kept, over, actor)
    if refused is not None:
        raise refused
    return 201, _answer(effect, kept)


def _over(size: int, entry_max: int, used: int) -> str:
    if size > entry_max:
        return f"{size} bytes, over its bound of {entry_max} (max_bytes)"
    if used + size > settings.UNDOLOG_PRE_IMAGE_RUN_MAX_BYTES:
        return (f"{size} bytes, and the run keeps {used} already: over the run's bound of "
                f"{settings.UNDOLOG_PRE_IMAGE_RUN_MAX_BYTES} (UNDOLOG_PRE_IMAGE_RUN_MAX_BYTES)")
    return ""


def _hold(effect: Effect, session: Session, kept: PreImage, over: str, actor: str) -> dict[str, Any]:
    """Over the bound with `hold`: the pre-image is kept (so the call never runs without it), and
    the call waits for a person, exactly as a held irreversible call: approve runs it, reject
    halts the run."""
    why = f"{effect.tool_name}'s pre-image is {over}: approve to run it and keep its undo"
    effect.move({Effect.State.EXECUTING}, Effect.State.PENDING, actor=ACTOR, reason=why)
    session.await_approval(actor=actor)
    approval = ApprovalRequest.open_for(effect, effect.tool, session, {"pre_image": kept.digests()},
                                        why=[{"message": why}])
    notify.approval_requested(approval)
    return {"decision": "await_approval", "effect": effect.as_dict(), "pre_image": kept.digests(),
            "approval": {**approval.summary(), "decided_by": None,
                         "approvals_required": approval.approvals_required}}


def _answer(effect: Effect, kept: PreImage) -> dict[str, Any]:
    decision = "execute" if effect.state == Effect.State.EXECUTING else effect.state
    return {"decision": decision, "effect": {"id": str(effect.id), "state": effect.state},
            "pre_image": kept.digests()}


# ---------------------------------------------------------------- dropping


def drop_expired(org_id: Any, window: timedelta, now=None) -> int:
    """Drop the pre-images of the org's runs that can no longer be undone: ended (completed,
    halted, compensated) more than `window` ago (the org's undo window). A run that failed or
    waits for a person keeps them: its undo is not over. The digests stay."""
    now = now or timezone.now()
    ended = Session.objects.filter(org_id=org_id, state__in=Session.TERMINAL, ended_at__lt=now - window)
    return PreImage.objects.kept().filter(session__in=ended).update(sealed=b"", dropped_at=now)


# ---------------------------------------------------------------- the fast path (PostgreSQL)

# What a before read's answer costs the server: keeping a pre-image within its bounds is one
# prepared statement in autocommit (FastPathMiddleware, as the commit's: the remembered key, no
# DRF), checking the key and the run as the view does, raising the run's pre-image bytes by a
# guarded update (its bound) and inserting. Everything else (a hold, a refusal, a retry, a bad
# body, an unknown key) finds no row inserted and goes down to the view, which answers it in full.
#
# The run's bound is the guarded UPDATE's: a second call of the run waits on the row's lock and
# PostgreSQL then checks `pre_image_bytes + size <= run_max` again on the row as the first call
# left it (READ COMMITTED re-evaluates an UPDATE's conditions on the newest row), so two calls
# that together pass the bound cannot both get in; the refused one goes down to the view, which
# answers it (hold or refuse). A duplicate insert (the same call's retry, at the same instant)
# fails the whole statement, its update included.
_KEEP_SQL = f"""
WITH e AS (
    SELECT e.id, e.session_id, u.id AS entry_id, t.pre_image AS declaration
    FROM effects_effect e
    JOIN effects_session s ON s.id = e.session_id
    JOIN orgs_agentkey k ON k.agent_id = s.agent_id
    JOIN effects_undoentry u ON u.effect_id = e.id
    JOIN effects_tool t ON t.id = e.tool_id
    WHERE e.id = %(effect)s AND s.agent_id = %(agent)s AND e.state = 'executing' AND t.pre_image IS NOT NULL
      AND k.id = %(key)s AND {live_key('k')}
      AND NOT EXISTS (SELECT 1 FROM effects_preimage p WHERE p.entry_id = u.id)
), run AS (
    UPDATE effects_session s SET pre_image_bytes = s.pre_image_bytes + %(size)s
    FROM e
    WHERE s.id = e.session_id
      AND %(size)s <= LEAST(COALESCE((e.declaration ->> 'max_bytes')::int, %(default_max)s), %(hard_max)s)
      AND s.pre_image_bytes + %(size)s <= %(run_max)s
    RETURNING s.id
), kept AS (
    INSERT INTO effects_preimage (entry_id, session_id, sealed, size, absent, before_digest, after_digest, held,
                                  created, dropped_at)
    SELECT e.entry_id, run.id, %(sealed)s, %(size)s, %(absent)s, %(before)s, %(after)s, false, %(now)s, NULL
    FROM e, run
    RETURNING id
)
SELECT id FROM kept
"""
_FAST_FIELDS = frozenset({"value", "absent", "after_digest"})


def fast_keep(request, effect_id: str):
    """The answer to a pre-image that fits its bounds, or None for the view to give it."""
    key = remembered_key(request)
    data = json_body(request, few_values=True) if key is not None else None
    if not isinstance(data, dict) or set(data) - _FAST_FIELDS:
        return None
    absent, after = data.get("absent", False), data.get("after_digest", "")
    if not isinstance(absent, bool) or not isinstance(after, str) or (after and not _DIGEST.fullmatch(after)):
        return None
    if absent and data.get("value") is not None:
        return None
    try:
        effect_uuid = uuid.UUID(effect_id)
    except ValueError:
        return None
    refused = OrgConfig.refusal(request, key)
    if refused is not None:
        return refused
    body = preimages.canonical(None if absent else data.get("value"))  # once: its size, digest and seal
    before = preimages.digest_of(body)
    AgentKey.touch_remembered(key)
    row = prepared.execute(_KEEP_SQL, {
        "effect": effect_uuid, "agent": key.agent_id, "key": key.id, "now": timezone.now(),
        "sealed": seal(preimages.sealable(body)), "size": len(body), "absent": absent,
        "before": before, "after": after, "default_max": preimages.DEFAULT_MAX_BYTES,
        "hard_max": settings.UNDOLOG_PRE_IMAGE_MAX_BYTES, "run_max": settings.UNDOLOG_PRE_IMAGE_RUN_MAX_BYTES})
    if row is None or row[0] is None:
        return None
    digests = {"before_digest": before, "after_digest": after or None, "size": len(body),
               "absent": absent, "dropped": False}
    return respond(201, {"decision": "execute", "effect": {"id": str(effect_uuid), "state": Effect.State.EXECUTING},
                         "pre_image": digests})
