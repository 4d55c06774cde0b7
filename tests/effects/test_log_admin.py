"""The effect log and undo entries in the Django admin are view-only: an operator reads them, and
no form can add, change (no Save) or delete a row the guarded transitions own."""

from __future__ import annotations

import pytest

from effects.models import Effect, UndoEntry
from tests.effects.conftest import build_stack

pytestmark = pytest.mark.django_db


@pytest.fixture
def stack(acme):
    return build_stack(acme, "https://hooks.example.com/undo", 1)


def pages(stack) -> list[tuple[str, object]]:
    effect, entry = Effect.objects.get(pk=stack.effects[0]), UndoEntry.objects.get(pk=stack.entries[0])
    return [(f"/admin/effects/effect/{effect.pk}/", effect), (f"/admin/effects/undoentry/{entry.pk}/", entry)]


def test_it_shows_effects_and_undo_entries_without_a_save_button(staff, stack):
    for url, row in pages(stack):
        page = staff.get(f"{url}change/")

        assert page.status_code == 200
        html = page.content.decode()
        assert "View " in html and str(row.pk) in html
        assert 'name="_save"' not in html and 'name="_continue"' not in html
        assert "/delete/" not in html


def test_the_admin_refuses_a_change_and_the_row_stays_as_it_was(staff, stack):
    for url, row in pages(stack):
        before = type(row).objects.filter(pk=row.pk).values().get()

        answer = staff.post(f"{url}change/", {"state": "compensated", "step_index": 99, "_save": "Save"})

        assert answer.status_code == 403
        assert type(row).objects.filter(pk=row.pk).values().get() == before


def test_the_admin_refuses_to_add_or_delete_log_rows(staff, stack):
    for url, row in pages(stack):
        assert staff.post(f"{url}delete/", {"post": "yes"}).status_code == 403
        assert type(row).objects.filter(pk=row.pk).exists()
    assert staff.get("/admin/effects/effect/add/").status_code == 403
    assert staff.get("/admin/effects/undoentry/add/").status_code == 403
    listing = staff.get("/admin/effects/effect/").content.decode()
    assert "send_email" in listing and 'name="action"' not in listing  # no bulk delete either
