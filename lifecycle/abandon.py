"""Runs that stop answering: a running session silent longer than its idle timeout (the
agent's `run_idle_timeout_s`, else its org's; 0 never) is failed as abandoned: `error:
"abandoned: …"`, a `session.abandoned` event, its budget outcome applied and its undo stack
walked, exactly as if the agent had failed it (`Session.abandon`).

Silent means: no intercept (which stamps `Session.updated`) and no move of its effects
(a commit, a failure) for that long. A run waiting for a reviewer is not silent: its session
is `awaiting_approval`, not `running`, and a running one with a pending call is skipped too;
so is one whose approved call its tool's executor is running (the worker's, not the agent's).

The beat runs `sweep` every UNDOLOG_ABANDON_SWEEP_S. It reads running sessions only, through
the index on `Session.state`, one query per distinct timeout in use (orgs and agent overrides
set few), never the history. `updated` itself is deliberately not indexed: every intercept
writes it, and an index on it would cost each intercept's session UPDATE its HOT update.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from core.errors import Conflict
from effects.models import Effect, Session
from orgs.models import Agent, Organization

log = logging.getLogger(__name__)
BATCH = 200


def timeouts_in_use() -> set[int]:
    """Every idle timeout some org or agent override sets (0, never, left out)."""
    org_values = Organization.objects.values_list("run_idle_timeout_s", flat=True).distinct()
    agent_values = Agent.objects.filter(run_idle_timeout_s__isnull=False).values_list(
        "run_idle_timeout_s", flat=True).distinct()
    return {value for value in [*org_values, *agent_values] if value}


def silent(timeout_s: int, now=None):
    """Running sessions whose idle timeout is `timeout_s` and that have been silent past it."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=timeout_s)
    effective = (Q(agent__run_idle_timeout_s=timeout_s) |
                 Q(agent__run_idle_timeout_s__isnull=True, org__run_idle_timeout_s=timeout_s))
    newest = Effect.objects.filter(session=OuterRef("pk")).order_by("-updated").values("updated")[:1]
    return (Session.objects.filter(effective, state=Session.State.RUNNING, updated__lt=cutoff)
            .exclude(Session.kept_alive(cutoff)).annotate(last_effect=Subquery(newest)).order_by("updated"))


def sweep(now=None) -> int:
    """1. For each timeout in use, the running sessions silent past it (oldest first).
    2. Abandon each with a guarded move (a call that lands first keeps the run alive).
    """
    now = now or timezone.now()
    abandoned = 0
    for timeout_s in sorted(timeouts_in_use()):
        for session in silent(timeout_s, now).select_related("org", "agent")[:BATCH]:
            try:
                session.abandon(timeout_s, now)
            except Conflict as exc:
                log.info("session %s not abandoned: %s", session.pk, exc.message)  # it spoke, or ended
                continue
            abandoned += 1
    return abandoned
