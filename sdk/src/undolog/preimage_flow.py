"""The session's side of a pre-image (issue 42): the before read between the intercept's
``execute`` and the call, kept on the server; a hold over the bound waits for a person; the
after-image's digest read after the call when the args cannot say it. See preimages.py."""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping
from typing import Any

from ._http import Call
from .errors import EffectInFlight
from .preimages import ABSENT, PreImage, PreImageError, digest

log = logging.getLogger("undolog")

Flow = Generator[Any, Any, Any]


def keep(
    session: Any, tool: Any, pre: PreImage, effect: Mapping[str, Any], args: dict[str, Any]
) -> Flow:
    """Read the target, keep what is there on the server, and answer the effect to run (this one,
    or, after a hold over the bound, the same one once a person approved it and this caller
    started it) and whether the target must be read again after the call (no after-image came
    with the pre-image). A failed read fails the effect (it never ran) and raises PreImageError."""
    from .session import Local, edited_args

    effect_id = effect.get("id")
    run_args = edited_args(effect) or args
    try:
        state = yield Local(pre.read, (run_args,))
    except Exception as exc:
        error = f"not run: its before read failed ({type(exc).__name__}: {exc})"
        yield from session._report_failure(effect_id, PreImageError(error))
        raise PreImageError(f"{tool.name} was {error}; a call never runs without its undo") from exc
    body = pre.body(run_args, ABSENT if state is ABSENT else state)
    answer = yield Call("POST", f"/api/v1/effects/{effect_id}/pre-image", body)
    read_after = pre.reads_after(body)
    if answer.get("decision") == "execute":
        return effect, read_after
    # Over its bound, held for a person: wait as for an irreversible call, then start it.
    settled = yield from session._settle(tool, answer, answer.get("effect") or {})
    if settled.get("state") == "approved" and not (yield from session._claim(settled)):
        raise EffectInFlight(
            f"{tool.name}: another caller started this approved call; not running it twice"
        )
    return {**effect, **settled}, read_after


def after_image(pre: PreImage, effect_id: Any, args: dict[str, Any]) -> Flow:
    """What the call left, read again and its digest recorded (for tools whose args do not say
    it, an edit): the compare-and-restore's reference. A failure only loses the comparison."""
    from .session import Local

    try:
        state = yield Local(pre.check or pre.read, (args,))
        yield Call("POST", f"/api/v1/effects/{effect_id}/after-image", {"digest": digest(state)})
    except Exception as exc:  # the call ran and committed: say so, go on
        log.warning(
            "effect %s: the after-image was not recorded (%s); its restore will not compare",
            effect_id,
            exc,
        )
