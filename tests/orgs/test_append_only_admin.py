"""Sessions and events in the Django admin are append-only history, as effects and undo entries
are: an operator reads them, and finds no Change, no Save and no Delete; a session's title
names its agent, not the agent's id."""

from __future__ import annotations

import re

import pytest

from effects.models import Session
from orgs.models import Event
from tests.conftest import open_session

pytestmark = pytest.mark.django_db


@pytest.fixture
def rows(acme) -> list[tuple[str, object]]:
    session = Session.objects.get(pk=open_session(acme))
    event = Event.record(acme.org, "agent.suspended", agent=acme.agent, reason="test")
    return [(f"/admin/effects/session/{session.pk}/", session), (f"/admin/orgs/event/{event.pk}/", event)]


def test_the_admin_shows_sessions_and_events_with_no_change_save_or_delete(staff, rows):
    for url, _row in rows:
        page = staff.get(f"{url}change/")
        listing = staff.get(url.rsplit("/", 2)[0] + "/")

        assert page.status_code == 200 and listing.status_code == 200
        html = page.content.decode()
        assert re.search(r"<h1>View (session|event)</h1>", html) and "<h1>Change" not in html
        assert 'name="_save"' not in html and 'name="_continue"' not in html and 'name="_addanother"' not in html
        assert "/delete/" not in html and "Delete" not in html
        assert 'name="action"' not in listing.content.decode()  # no bulk delete


def test_the_admin_refuses_to_change_or_delete_them(staff, rows):
    for url, row in rows:
        before = type(row).objects.filter(pk=row.pk).values().get()

        assert staff.post(f"{url}change/", {"state": "halted", "tool_calls": 99, "_save": "Save"}).status_code == 403
        assert staff.post(f"{url}delete/", {"post": "yes"}).status_code == 403
        assert type(row).objects.filter(pk=row.pk).values().get() == before


def test_a_sessions_title_names_its_agent(staff, acme, rows):
    url, session = rows[0]

    html = staff.get(f"{url}change/").content.decode()

    title = re.search(r"<title>(.*?)</title>", html).group(1)
    heading = re.search(r"<h2>(.*?)</h2>", html).group(1)
    assert title.startswith(f"session {session.pk} of cleanup (running)") and heading == title.split(" | ")[0]
