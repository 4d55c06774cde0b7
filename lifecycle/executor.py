"""What an approved call's executor adds to the one delivery mechanism (`deliveries.send`):
the worker runs only what it claimed itself, and the answer commits or fails the effect.

Registered for the `executor` purpose in approvals/apps.py.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from core import outbound
from core.errors import Conflict
from deliveries.models import Delivery
from effects.models import Effect, EffectTransition

log = logging.getLogger(__name__)
EXECUTOR_ACTOR = "executor"


def start(delivery: Delivery, number: int) -> bool:
    """Run only what the executor itself claimed: the first attempt moves the effect
    approved → executing; later ones find it executing by the executor (a retry, or a worker
    that died after claiming). A caller that claimed it first (`POST /effects/{id}/start`)
    runs it instead, so nothing runs twice."""
    effect = Effect.objects.get(pk=delivery.effect_id)
    if effect.state == Effect.State.APPROVED:
        try:
            effect.start_executing(actor=EXECUTOR_ACTOR)
        except Conflict:
            effect.refresh_from_db()
        else:
            return True
    if number > 1 and effect.state == Effect.State.EXECUTING and _claimed_by_executor(effect):
        return True
    delivery.finish(state=Delivery.State.CANCELLED,
                    last_error=f"The effect is {effect.state} and not the executor's to run.")
    return False


def settled(delivery: Delivery, outcome: str, result: outbound.Delivery, number: int) -> None:
    """In the attempt's transaction: a 2xx commits the effect with the JSON answer, a final
    failure fails it; a retry leaves it executing."""
    if outcome == "delivered":
        _effect_verb(delivery, "commit", _result_of(result))
    elif outcome == "failed":
        _effect_verb(delivery, "fail", f"The executor failed after {number} attempt(s): {result.error}")


def _claimed_by_executor(effect: Effect) -> bool:
    claim = (EffectTransition.objects.filter(effect_id=effect.pk, to_state=Effect.State.EXECUTING)
             .order_by("-created", "-id").values_list("actor", flat=True).first())
    return claim == EXECUTOR_ACTOR


def _effect_verb(delivery: Delivery, verb: str, value: Any) -> None:
    effect = Effect.objects.get(pk=delivery.effect_id)
    try:
        getattr(effect, verb)(value, actor=EXECUTOR_ACTOR)
    except Conflict:
        # The guarded UPDATE changed nothing (no database error), so the attempt row stands.
        log.warning("executor %s of effect %s: the effect is %s", verb, effect.pk, effect.state)


def _result_of(result: outbound.Delivery) -> Any:
    if not result.body:
        return None
    try:
        return json.loads(result.body)
    except ValueError:
        return {"status_code": result.status_code, "body": result.body}
