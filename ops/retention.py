"""Retention: what is past an org's retention is written to JSON Lines, then deleted.

Per org (`ops.Retention`, defaults in `Retention.DEFAULTS`): SAFE-call reports, state history
(session and effect transitions) and closed sessions (completed, halted, compensated; with
their effects, undo entries and approvals) are kept N days after their session last moved;
events N days after they happened. Nothing that is still needed goes:

- only closed sessions lose anything (a running or failed session keeps all of its rows: the
  SAFE calls deduplicate retried reports, the history explains what a person must resolve);
- an audit-worthy event is deleted only once it is sealed (ops/audit.py): its record keeps its
  canonical JSON, so the chain still verifies after the event is gone.

Archives: UNDOLOG_ARCHIVE_DIR/<org slug>/<UTC time>-<table>.jsonl, one row per line (every
column), written and fsync'd before the rows are deleted, in batches of BATCH.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction
from django.utils import timezone

from approvals.models import ApprovalRequest
from effects.models import (
    Effect,
    EffectTransition,
    PreImage,
    SafeCall,
    Session,
    SessionTransition,
    UndoAttempt,
    UndoEntry,
)
from lifecycle import preimages
from ops.audit import audited
from ops.models import AuditRecord, Retention
from orgs.models import Event, Organization

BATCH = 1000


@dataclass
class Target:
    """One kind of row retention removes: how to find the org's rows past their time."""

    name: str
    days: str  # the Retention field
    rows: Callable[[Organization, datetime], models.QuerySet]
    # Rows that go with one of these (a session's effects...), archived before the cascade removes them.
    related: tuple[tuple[type[models.Model], str], ...] = ()
    # Called with the ids of a batch, in its transaction, before it is deleted.
    before_delete: Callable[[list], None] | None = None


def _mark_purged(event_ids: list) -> None:
    # The chain's records stay; verify must know the event went by retention, not by hand.
    AuditRecord.objects.filter(event_id__in=event_ids).update(event_purged_at=timezone.now())


def _closed(org: Organization, before: datetime) -> models.QuerySet:
    return Session.objects.filter(org=org, state__in=Session.TERMINAL, updated__lt=before)


def _events(org: Organization, before: datetime) -> models.QuerySet:
    past = Event.objects.filter(org=org, created__lt=before)
    sealed = AuditRecord.objects.filter(org=org).values("event_id")
    return past.exclude(audited() & ~models.Q(id__in=sealed))  # an unsealed audit-worthy event stays


TARGETS = [
    Target("safe_calls", "safe_call_days",
           lambda org, before: SafeCall.objects.filter(session__in=_closed(org, before), created__lt=before)),
    Target("session_transitions", "transition_days",
           lambda org, before: SessionTransition.objects.filter(session__in=_closed(org, before), created__lt=before)),
    Target("effect_transitions", "transition_days",
           lambda org, before: EffectTransition.objects.filter(effect__session__in=_closed(org, before),
                                                               created__lt=before)),
    Target("events", "event_days", _events, before_delete=_mark_purged),
    Target("sessions", "session_days", _closed,
           related=((Effect, "session_id"), (UndoEntry, "session_id"), (UndoAttempt, "entry__session_id"),
                    (ApprovalRequest, "session_id"), (SafeCall, "session_id"), (SessionTransition, "session_id"),
                    (EffectTransition, "effect__session_id"))),
]


def purge(org: Organization, *, dry_run: bool = False, now: datetime | None = None) -> dict[str, int]:
    """Archive then delete the org's rows past retention; how many of each (dry run: would be)."""
    now = now or timezone.now()
    retention = Retention.of(org)
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    counts = {"pre_images": _drop_pre_images(org, retention, now, dry_run)}
    for target in TARGETS:
        before = now - timedelta(days=getattr(retention, target.days))
        rows = target.rows(org, before)
        counts[target.name] = rows.count() if dry_run else _archive_and_delete(org, target, rows, stamp)
    return counts


def _drop_pre_images(org: Organization, retention: Retention, now: datetime, dry_run: bool) -> int:
    """Pre-images of runs past the org's undo window are dropped, never archived: sealed content
    is no export's (a deleted session takes the rest with it, by cascade, unarchived)."""
    window = timedelta(hours=retention.undo_window_hours)
    if dry_run:
        ended = Session.objects.filter(org=org, state__in=Session.TERMINAL, ended_at__lt=now - window)
        return PreImage.objects.kept().filter(session__in=ended).count()
    return preimages.drop_expired(org.pk, window, now)


def _archive_and_delete(org: Organization, target: Target, rows: models.QuerySet, stamp: str) -> int:
    done = 0
    while True:
        ids = list(rows.order_by("pk").values_list("pk", flat=True)[:BATCH])
        if not ids:
            return done
        with transaction.atomic():
            batch = rows.model.objects.filter(pk__in=ids)
            _write(org, target.name, stamp, batch)
            for model, field in target.related:
                _write(org, f"{target.name}.{model._meta.model_name}", stamp,
                       model.objects.filter(**{f"{field}__in": ids}))
            if target.before_delete is not None:
                target.before_delete(ids)
            batch.delete()
        done += len(ids)


def archive_dir(org: Organization) -> Path:
    return Path(settings.UNDOLOG_ARCHIVE_DIR) / org.slug


def _write(org: Organization, name: str, stamp: str, rows: models.QuerySet) -> None:
    directory = archive_dir(org)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stamp}-{name}.jsonl"
    fields = [f.attname for f in rows.model._meta.concrete_fields]
    with open(path, "a", encoding="utf-8") as out:
        for row in rows.order_by("pk").values(*fields).iterator(chunk_size=BATCH):
            out.write(json.dumps(row, cls=DjangoJSONEncoder, separators=(",", ":")) + "\n")
        out.flush()
        os.fsync(out.fileno())  # on disk before the rows are deleted
