"""The reviewer's daily tools in a real headless Chromium (one per module), against the real
ASGI server: the dashboard on a phone and a desktop, agents and keys, triage of the queue.

On a phone (390×844) and a desktop (1440×900) the queue, an approval and a session page lay
out within the window (no sideways scrolling), the dark header spans the width with every nav
link on screen or in the nav's own sideways-scrolling row, and the actions a reviewer needs are visible. Leaves
var/responsive-<page>-<size>.png for people to look at."""

from __future__ import annotations

import httpx
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
      // A link inside a row that scrolls sideways on its own (the phone's nav) is reached by
      // scrolling that row: the row is what must fit.
      let scroller = node.parentElement;
      while (scroller && !['auto', 'scroll'].includes(getComputedStyle(scroller).overflowX)) {
        scroller = scroller.parentElement;
      }
      const box = (scroller || node).getBoundingClientRect();
      if (!box.width || !box.height) out.push(`${selector} not shown`);
      else if (box.left < 0 || box.right > width + 0.5) out.push(`${selector} outside (${box.left}..${box.right})`);
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


# ---------------------------------------------------------------- agents and keys


def agent_call(server: str, key: str) -> int:
    """What an agent gets for opening a run with `key`."""
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {key}"}, timeout=10) as agent:
        return agent.post("/api/v1/sessions", json={"agent": "billing"}).status_code


def test_an_admin_creates_an_agent_and_issues_rotates_and_revokes_its_keys(acme, server, new_page):
    page = new_page()
    log_in(page, acme.admin.user)
    page.goto("/agents/")

    page.fill("#agent-name", "billing")
    page.click("#agent-form button")
    card = page.locator('article[data-agent="billing"]')
    card.locator('[data-action="issue-key"]').click()
    page.wait_for_selector("#new-key-value:text-matches('^ul_')")
    first = page.locator("#new-key-value").inner_text()
    card.locator("tr.key-row").wait_for()
    first_status = agent_call(server, first)
    card.locator('[data-action="rotate-key"]').click()
    page.click("#confirm-ok")
    # A function, not an expression: the page's CSP has no 'unsafe-eval' for Playwright's polling.
    page.wait_for_function(f"() => document.getElementById('new-key-value').textContent !== {first!r}")
    second = page.locator("#new-key-value").inner_text()
    grace = page.locator("#new-key-grace").inner_text()
    card.locator('tr.key-row[data-state="rotating"]').wait_for()
    during_grace = agent_call(server, first), agent_call(server, second)
    card.locator('tr.key-row[data-state="rotating"] [data-action="revoke-key"]').click()
    page.click("#confirm-ok")
    card.locator('tr.key-row[data-state="revoked"]').wait_for()

    assert first.startswith("ul_") and second.startswith("ul_") and first != second
    assert first_status == 201
    assert "keeps working until" in grace
    assert during_grace == (201, 201)
    assert (agent_call(server, first), agent_call(server, second)) == (401, 201)
    assert card.locator("tr.key-row").count() == 2
    assert first not in page.content().replace(page.locator("#new-key-value").inner_text(), "")


# ---------------------------------------------------------------- triage


def test_a_reviewer_decides_sees_the_history_live_goes_to_the_next_and_finds_it_under_decided(acme, server, new_page):
    first = hold(acme, {"account_id": "acct-1"})["approval"]["id"]
    second = hold(acme, {"account_id": "acct-2"})["approval"]["id"]
    page = new_page()
    log_in(page, acme.reviewer.user)
    page.select_option("#queue-filters select[name=tag]", "data-loss")
    page.click("#queue-filters button[type=submit]")
    page.wait_for_url("**/?*tag=data-loss*")
    filtered_rows = page.locator("tr.queue-row").count()
    page.goto(f"/approvals/{first}/")
    page.evaluate("window.notReloaded = true")
    waiting = page.inner_text("#approval-history")

    page.click("#approve-button")
    page.wait_for_selector("#approval-history >> text=approved")
    history = page.inner_text("#approval-history")
    not_reloaded = page.evaluate("window.notReloaded === true")
    page.keyboard.press("n")
    page.wait_for_url(f"**/approvals/{second}/")
    on_next = page.locator("#approve-button").is_visible()
    page.goto("/?tab=decided")
    decided = page.locator(f'tr.decided-row[data-id="{first}"]').inner_text()

    assert filtered_rows == 2
    assert waiting.startswith("Waiting since") and waiting.endswith("UTC.")
    assert "pending → approved by acme-reviewer" in history and not_reloaded
    assert on_next
    assert "approved" in decided and "acme-reviewer" in decided


# ---------------------------------------------------------------- the admin


def test_staff_reach_the_undolog_admin_from_the_dashboard_and_its_lists_fit(acme, server, new_page):
    hold(acme, reasoning="A long reason " * 20)
    user = acme.admin.user
    user.is_staff = user.is_superuser = True
    user.save()
    page = new_page()
    log_in(page, user)

    page.click("header .admin-link")
    page.wait_for_url("**/admin/")
    title = page.title()
    page.goto("/admin/effects/effect/")
    fits = page.eval_on_selector("#changelist .results", "el => el.scrollWidth <= el.clientWidth")
    page.screenshot(path=str(SCREENSHOTS / "admin-effects-desktop.png"))
    back = page.get_attribute("#user-tools a[href='/']", "href")

    assert title.endswith("undolog admin")
    assert fits
    assert back == "/"
