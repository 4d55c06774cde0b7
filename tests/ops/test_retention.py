"""Retention: exactly what is past each org's retention goes, archived as JSON Lines first;
open sessions and unsealed audit-worthy events stay whatever their age."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from effects.models import Effect, EffectTransition, SafeCall, Session, SessionTransition, UndoEntry
from ops import audit, retention
from ops.models import AuditRecord, Retention
from orgs.models import Event
from tests.conftest import intercept, open_session

pytestmark = pytest.mark.django_db(transaction=True)
DAY = timedelta(days=1)


@pytest.fixture
def archive(settings, tmp_path):
    settings.UNDOLOG_ARCHIVE_DIR = tmp_path / "archive"
    return tmp_path / "archive"


def run(persona, *, close: bool, age_days: float, steps: int = 2) -> str:
    """A session with `steps` compensable calls and a SAFE call, closed (completed) or left running,
    every row of it dated `age_days` ago."""
    session_id = open_session(persona)
    for step in range(1, steps + 1):
        response = intercept(persona, session_id, "send_email", {"to": f"u{step}@x.io"}, step,
                             safe_calls=[{"tool": "list_inactive_accounts", "step_index": 100 + step}])
        assert response.status_code == 201, response.content
        persona.api.post(f"/api/v1/effects/{response.json()['effect']['id']}/commit", {"result": {}}, format="json")
    if close:
        assert persona.api.post(f"/api/v1/sessions/{session_id}/complete").status_code == 200
    when = timezone.now() - timedelta(days=age_days)
    Session.objects.filter(pk=session_id).update(updated=when, created=when)
    SessionTransition.objects.filter(session_id=session_id).update(created=when)
    EffectTransition.objects.filter(effect__session_id=session_id).update(created=when)
    SafeCall.objects.filter(session_id=session_id).update(created=when)
    return session_id


def lines(directory, suffix: str) -> list[dict]:
    found = []
    for path in sorted(directory.glob(f"*-{suffix}.jsonl")):
        found += [json.loads(line) for line in path.read_text().splitlines()]
    return found


def test_purge_removes_exactly_what_is_past_retention_and_archives_it_first(acme, tools, archive):
    Retention.objects.create(org=acme.org, safe_call_days=10, transition_days=20, event_days=30, session_days=40)
    old = run(acme, close=True, age_days=50)          # past every retention: the whole session goes
    middle = run(acme, close=True, age_days=25)       # its SAFE calls and history go; the session stays
    recent = run(acme, close=True, age_days=5)        # nothing goes
    running = run(acme, close=False, age_days=50)     # open: nothing goes, however old
    old_event = Event.record(acme.org, "session.updated", note="old")
    Event.objects.filter(pk=old_event.pk).update(created=timezone.now() - 31 * DAY)
    sealed = Event.record(acme.org, "incident.changed", on=True, by="admin")
    Event.objects.filter(pk=sealed.pk).update(created=timezone.now() - 31 * DAY)
    audit.seal(acme.org.id)
    unsealed = Event.record(acme.org, "incident.changed", on=False, by="admin")
    Event.objects.filter(pk=unsealed.pk).update(created=timezone.now() - 31 * DAY)  # not sealed: must stay
    old_effects = set(Effect.objects.filter(session_id=old).values_list("pk", flat=True))

    dry = retention.purge(acme.org, dry_run=True)
    assert not archive.exists()  # a dry run writes nothing

    counts = retention.purge(acme.org)

    assert counts == dry
    # Two closed sessions past 20 days: each one session transition (running → completed), two effects
    # with one transition each (executing → committed), two SAFE calls; one of them past 40 days.
    assert counts == {"safe_calls": 4, "session_transitions": 2, "effect_transitions": 4, "events": 2,
                      "sessions": 1, "pre_images": 0}  # none kept here (tests/effects/test_pre_images.py)
    assert not Session.objects.filter(pk=old).exists()
    assert not Effect.objects.filter(session_id=old).exists()
    assert not UndoEntry.objects.filter(session_id=old).exists()
    assert Session.objects.filter(pk__in=[middle, recent, running]).count() == 3
    assert not SafeCall.objects.filter(session_id=middle).exists()
    assert not SessionTransition.objects.filter(session_id=middle).exists()
    assert Effect.objects.filter(session_id=middle).count() == 2
    for kept in (recent, running):
        assert SafeCall.objects.filter(session_id=kept).count() == 2
        assert EffectTransition.objects.filter(effect__session_id=kept).count() == 2
    assert set(Event.objects.filter(pk__in=[old_event.pk, sealed.pk, unsealed.pk]).values_list("pk", flat=True)) \
        == {unsealed.pk}
    # The archive holds every deleted row, the old session's effects with it.
    directory = archive / "acme"
    assert {row["id"] for row in lines(directory, "sessions")} == {old}
    assert {row["id"] for row in lines(directory, "sessions.effect")} == {str(pk) for pk in old_effects}
    assert {row["session_id"] for row in lines(directory, "safe_calls")} == {old, middle}
    assert {row["id"] for row in lines(directory, "events")} == {str(old_event.pk), str(sealed.pk)}
    assert retention.purge(acme.org) == dict.fromkeys(counts, 0)  # nothing left to purge
    assert audit.verify(acme.org) is None  # a sealed event past its retention may go: its record remains
    assert AuditRecord.objects.get(event_id=sealed.pk).event_purged_at is not None
    Retention.objects.filter(org=acme.org).update(event_days=3650)  # a longer retention later changes nothing
    assert audit.verify(acme.org) is None


def test_an_org_without_a_retention_row_keeps_the_documented_defaults(acme, tools, archive):
    kept = run(acme, close=True, age_days=Retention.DEFAULTS["session_days"] - 1)
    gone = run(acme, close=True, age_days=Retention.DEFAULTS["session_days"] + 1)

    retention.purge(acme.org)

    assert Session.objects.filter(pk=kept).exists()
    assert not Session.objects.filter(pk=gone).exists()


def test_purge_dry_run_command_counts_without_deleting(acme, tools, archive, capsys):
    Retention.objects.create(org=acme.org, session_days=1)
    session_id = run(acme, close=True, age_days=3)

    call_command("purge", "--dry-run", "--org", "acme")

    assert "acme: would archive and delete" in capsys.readouterr().out
    assert Session.objects.filter(pk=session_id).exists()
    assert not archive.exists()
    call_command("purge", "--org", "acme")
    assert not Session.objects.filter(pk=session_id).exists()


# ---------------------------------------------------------------- GET|PATCH /api/v1/org/retention

def test_members_read_the_retention_and_admins_change_it_audited(acme):
    assert acme.viewer.get("/api/v1/org/retention").json() == {"retention": Retention.DEFAULTS}

    response = acme.admin.patch("/api/v1/org/retention", {"event_days": 730, "safe_call_days": 7}, format="json")

    assert response.status_code == 200
    assert response.json()["retention"] == {**Retention.DEFAULTS, "event_days": 730, "safe_call_days": 7}
    assert Retention.objects.get(org=acme.org).event_days == 730
    event = Event.objects.get(org=acme.org, kind="policy.retention_changed")
    assert event.data["changes"] == {"event_days": [365, 730], "safe_call_days": [30, 7]}
    assert acme.admin.user.username in event.data["by"]
    assert audit.is_audited(event.kind)


def test_only_admins_change_the_retention_and_bad_values_write_nothing(acme, outsider):
    assert acme.reviewer.patch("/api/v1/org/retention", {"event_days": 1}, format="json").status_code == 403
    assert acme.api.get("/api/v1/org/retention").status_code == 403
    for body in ({"event_days": 0}, {"event_days": 36501}, {"event_days": "ten"}, {"purge_everything": True},
                 {"session_days": True}):
        response = acme.admin.patch("/api/v1/org/retention", body, format="json")
        assert response.status_code == 400, body
    assert not Retention.objects.filter(org=acme.org).exists()
    acme.admin.patch("/api/v1/org/retention", {"event_days": 400}, format="json")
    assert outsider.admin.get("/api/v1/org/retention").json()["retention"]["event_days"] == 365


def test_the_retention_endpoint_answers_401_without_credentials_and_405_to_post(acme, client):
    assert client.get("/api/v1/org/retention").status_code == 401
    assert acme.admin.post("/api/v1/org/retention", {}, format="json").status_code == 405
