"""The rough edges a first visit met, in a real headless Chromium at a phone's width (390 px) and
a desktop's (1440 px): the Pending tab counts live, the whole card opens a request (its checkbox
still only selects it), the header reads as one person and fits one nav row on a phone, and the
bulk bar lines up and hides on an empty queue."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import open_session, register_standard_tools
from tests.dashboard.conftest import SCREENSHOTS, hold, log_in

pytestmark = pytest.mark.django_db(transaction=True)

WIDTHS = {"phone": {"width": 390, "height": 844}, "desktop": {"width": 1440, "height": 900}}


@pytest.fixture(params=list(WIDTHS))
def width(request) -> str:
    return request.param


def queue_page(new_page, persona, width: str, user=None):
    page = new_page(WIDTHS[width])
    log_in(page, user or persona.reviewer.user)
    return page


def test_the_pending_tab_counts_a_request_that_arrives_live(acme, server, new_page, width):
    register_standard_tools(acme)
    hold(acme, {"account_id": "acct-1"})
    page = queue_page(new_page, acme, width)
    assert page.locator("#tab-pending .count").inner_text() == "1"

    session = open_session(acme)
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {acme.key}"}) as agent:
        agent.post(f"/api/v1/sessions/{session}/intercept",
                   json={"tool": "delete_account", "args": {"account_id": "acct-2"}, "step_index": 1})
    page.wait_for_selector("tr.queue-row >> nth=1")

    page.wait_for_function("() => document.querySelector('#tab-pending .count').textContent === '2'")
    assert page.locator("#nav-pending").inner_text() == "2"
    assert page.locator("#queue-count").inner_text() == "2"


def test_tapping_anywhere_on_a_card_opens_its_request_and_the_checkbox_only_selects(acme, server, new_page, width):
    held = hold(acme, {"account_id": "acct-101"})
    page = queue_page(new_page, acme, width)
    row = page.locator(f'tr.queue-row[data-id="{held["approval"]["id"]}"]')

    row.locator("input.pick-row").click()
    assert row.locator("input.pick-row").is_checked()
    assert page.locator("#picked-count").inner_text() == "1 selected"
    assert "/approvals/" not in page.url  # the checkbox did not open the request

    row.locator(".impact").click()  # not the link: the card's text
    page.wait_for_url(f"**/approvals/{held['approval']['id']}/")
    assert page.locator("h1").inner_text().startswith("delete_account")


def test_the_header_sets_the_admin_link_apart_from_the_name_and_fits_a_phone(acme, server, new_page, width):
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.get(pk=acme.admin.user.pk)
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    page = queue_page(new_page, acme, width, user=user)

    admin_link = page.locator("header .admin-link")
    assert admin_link.inner_text() == "Django admin"
    header = page.locator("header.top").bounding_box()
    tops = page.eval_on_selector_all("header nav a", "links => links.map(a => a.getBoundingClientRect().top)")
    scroll_width = page.evaluate("document.documentElement.scrollWidth")
    page.screenshot(path=str(SCREENSHOTS / f"first-hour-header-{width}.png"))

    assert len(set(tops)) == 1  # the nav is one row
    assert scroll_width <= WIDTHS[width]["width"]  # the page itself never scrolls sideways
    if width == "phone":
        assert header["height"] < 80, header  # was ~175 px: three rows of nav
    else:
        assert header["height"] <= 60, header
        # The name sits with the role and Log out, not beside the admin link.
        order = page.eval_on_selector_all("header .who > *", "nodes => nodes.map(n => n.className)")
        assert order.index("user") == order.index("role role-admin") + 1
        assert abs(order.index("admin-link") - order.index("user")) > 1


def test_the_bulk_bar_lines_up_and_hides_on_an_empty_queue(acme, server, new_page, width):
    held = hold(acme, {"account_id": "acct-101"})
    page = queue_page(new_page, acme, width)
    bar = page.locator("#batch-bar")
    assert bar.is_visible()
    box, label, count = (page.locator(sel).bounding_box() for sel in
                         ("#pick-all", "#batch-bar label.check", "#picked-count"))
    page.screenshot(path=str(SCREENSHOTS / f"first-hour-bulk-{width}.png"))

    # "Select all" beside its checkbox, on the line of "0 selected".
    assert abs((box["y"] + box["height"] / 2) - (label["y"] + label["height"] / 2)) < 4
    assert abs((label["y"] + label["height"] / 2) - (count["y"] + count["height"] / 2)) < 4
    assert label["x"] < count["x"]

    acme.reviewer.post(f"/api/v1/approvals/{held['approval']['id']}/approve", {}, format="json")
    page.wait_for_selector("#queue-empty:not([hidden])")
    assert not bar.is_visible()
    assert not page.locator("#batch-approve").is_visible()

    page.reload()
    page.wait_for_selector("#queue-empty:not([hidden])")
    assert not page.locator("#batch-bar").is_visible()


def test_the_audit_facts_fit_one_line_its_rows_have_labels_and_a_live_run_has_no_end(acme, server, new_page,
                                                                                   width):
    from ops import audit

    held = hold(acme, {"account_id": "acct-101"})
    acme.reviewer.post(f"/api/v1/approvals/{held['approval']['id']}/approve", {}, format="json")
    audit.seal(acme.org.pk)
    page = new_page(WIDTHS[width])
    log_in(page, acme.admin.user)

    page.goto("/audit/")
    lines = page.eval_on_selector_all(".chain-facts dt", """dts => dts.map(dt => {
        const range = document.createRange(); range.selectNodeContents(dt); return range.getClientRects().length; })""")
    assert lines == [1] * 5  # "Sealed records" and "Waiting to be sealed" do not wrap
    if width == "phone":
        labels = page.eval_on_selector_all(".audit-row td",
                                           "tds => tds.map(td => getComputedStyle(td, '::before').content)")
        assert labels and all(label not in ("none", "normal", '""') for label in labels)

    page.goto("/sessions/")
    live_row = page.locator("tr.session-row", has=page.locator(".state-running"))
    assert "ended" not in live_row.inner_text() and "running" in live_row.inner_text().lower()
