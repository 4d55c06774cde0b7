"""The dashboard on a phone (390×844) and a desktop (1440×900): the queue, an approval and a
session page lay out within the window (no sideways scrolling), the dark header spans the
width with every nav link on screen, and the actions a reviewer needs are visible. Leaves
var/responsive-<page>-<size>.png for people to look at."""

from __future__ import annotations

import pytest

from tests.conftest import intercept, open_session
from tests.dashboard.conftest import SCREENSHOTS, hold, log_in

pytestmark = pytest.mark.django_db(transaction=True)

SIZES = {"phone": {"width": 390, "height": 844}, "desktop": {"width": 1440, "height": 900}}

# Everything a page must keep inside the window: nothing wider than the viewport, and each
# listed element shown, with its box inside the window horizontally.
FITS = """(selectors) => {
  const width = window.innerWidth;
  const out = [];
  if (document.documentElement.scrollWidth > width) out.push(`page is ${document.documentElement.scrollWidth} px wide`);
  const header = document.querySelector('header.top').getBoundingClientRect();
  if (Math.round(header.width) !== width) out.push(`header is ${header.width} px wide`);
  for (const selector of selectors) {
    const nodes = document.querySelectorAll(selector);
    if (!nodes.length) out.push(`${selector} missing`);
    for (const node of nodes) {
      const box = node.getBoundingClientRect();
      if (!box.width || !box.height) out.push(`${selector} not shown`);
      else if (box.left < 0 || box.right > width + 0.5) out.push(`${selector} outside the window (${box.left}..${box.right})`);
    }
  }
  return out;
}"""
NAV = "header nav a"


@pytest.mark.parametrize("size", list(SIZES))
def test_it_fits_the_queue_an_approval_and_a_session_in_the_window(acme, server, new_page, size):
    held = hold(acme, reasoning="No login for 14 months; the owner asked for deletion in ticket 4411 after "
                                "a long exchange about invoices, exports and a second account.")
    hold(acme, {"account_id": "acct-a-very-long-identifier-that-does-not-wrap-on-its-own-0000000000001"})
    run = open_session(acme)
    sent = intercept(acme, run, "send_email", {"to": "owner@example.com", "subject": "Closing your account"}, 1,
                     reasoning="Tell the owner first.").json()["effect"]["id"]
    acme.api.post(f"/api/v1/effects/{sent}/commit", {"result": {"message_id": "m-1"}}, format="json")
    page = new_page(SIZES[size])
    log_in(page, acme.reviewer.user)

    page.wait_for_selector("tr.queue-row >> nth=1")
    queue = page.evaluate(FITS, [NAV, "tr.queue-row a.row-link", "tr.queue-row .countdown"])
    page.screenshot(path=str(SCREENSHOTS / f"responsive-queue-{size}.png"), full_page=True)
    page.goto(f"/approvals/{held['approval']['id']}/")
    approval = page.evaluate(FITS, [NAV, "#approve-button", "#reject-button", "#reject-reason",
                                    "#reject-rollback-button", "#extend-button", "#proposed-args"])
    approve_top = page.locator("#approve-button").bounding_box()["y"]
    page.screenshot(path=str(SCREENSHOTS / f"responsive-approval-{size}.png"), full_page=True)
    page.goto(f"/sessions/{run}/")
    page.wait_for_selector("#timeline .tl-item")
    session = page.evaluate(FITS, [NAV, "#fail-button", "#timeline .tl-item", "#undo-stack"])
    page.screenshot(path=str(SCREENSHOTS / f"responsive-session-{size}.png"), full_page=True)

    assert queue == []
    assert approval == []
    assert session == []
    assert approve_top < SIZES[size]["height"]  # approving needs no scrolling, on a phone too
    page.goto("/")
    cell = page.eval_on_selector("tr.queue-row td.tool", "td => getComputedStyle(td).display")
    assert cell == ("block" if size == "phone" else "table-cell")  # rows are cards on a phone
