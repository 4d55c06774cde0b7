"""What a reviewer met in a real headless Chromium at a phone's width (390 px) and a desktop's
(1440 px): the nav shows the current page's link, an emptied queue does not leave "Select all"
ticked for the next request and the "Last 7 days" card counts decisions live, and the agents
page keeps its chart keys off the bars and its rollback link on the line of the buttons."""

from __future__ import annotations

from decimal import Decimal

import httpx
import pytest

from effects.models import Session
from tests.budgets.conftest import set_budget
from tests.conftest import open_session, register_standard_tools
from tests.dashboard.conftest import SCREENSHOTS, hold, log_in

pytestmark = pytest.mark.django_db(transaction=True)

WIDTHS = {"phone": {"width": 390, "height": 844}, "desktop": {"width": 1440, "height": 900}}


@pytest.fixture(params=list(WIDTHS))
def width(request) -> str:
    return request.param


def boxes(page, selector: str) -> list[dict]:
    return page.eval_on_selector_all(selector, """nodes => nodes.map(n => {
        const r = n.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; })""")


def centre(box: dict) -> float:
    return (box["top"] + box["bottom"]) / 2


@pytest.mark.parametrize("link", ["Settings", "Audit", "Sessions"])
def test_the_nav_shows_the_current_pages_link(acme, server, new_page, width, link):
    page = new_page(WIDTHS[width])
    log_in(page, acme.admin.user)
    page.goto(page.get_attribute(f'header nav a:has-text("{link}")', "href"))

    current = page.locator("header nav a[aria-current=page]")
    assert current.inner_text().startswith(link)
    page.wait_for_timeout(100)
    nav, box = boxes(page, "header nav")[0], boxes(page, "header nav a[aria-current=page]")[0]
    page.screenshot(path=str(SCREENSHOTS / f"reviewers-nav-{link}-{width}.png"))

    assert nav["left"] - 1 <= box["left"] and box["right"] <= nav["right"] + 1, (nav, box)
    assert box["right"] <= WIDTHS[width]["width"]


def test_an_emptied_queue_leaves_nothing_ticked_and_the_week_card_counts_live(acme, server, new_page, width):
    register_standard_tools(acme)
    for account in ("acct-1", "acct-2"):
        hold(acme, {"account_id": account})
    page = new_page(WIDTHS[width])
    log_in(page, acme.reviewer.user)
    decided = page.locator("#queue-stats .big-numbers strong").first
    assert decided.inner_text() == "0"

    page.check("#pick-all")
    assert page.locator("#picked-count").inner_text() == "2 selected"
    page.click("#batch-approve")
    page.wait_for_selector("#queue-empty:not([hidden])")
    page.wait_for_function("() => document.querySelector('#queue-stats .big-numbers strong').textContent === '2'")
    assert not page.locator("#pick-all").is_checked()

    session = open_session(acme)
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {acme.key}"}) as agent:
        approval = agent.post(f"/api/v1/sessions/{session}/intercept", json={
            "tool": "delete_account", "args": {"account_id": "acct-3"}, "step_index": 1}).json()["approval"]["id"]
    row = page.locator(f'tr.queue-row[data-id="{approval}"]')
    row.wait_for()
    page.screenshot(path=str(SCREENSHOTS / f"reviewers-queue-{width}.png"))

    assert not page.locator("#pick-all").is_checked()
    assert not row.locator("input.pick-row").is_checked()
    assert page.locator("#picked-count").inner_text() == "0 selected"
    assert page.locator("#batch-approve").is_disabled()

    acme.reviewer.post(f"/api/v1/approvals/{approval}/reject", {"reason": "not this one"}, format="json")
    page.wait_for_function("() => document.querySelector('#queue-stats .big-numbers strong').textContent === '3'")


def test_the_agents_page_keeps_chart_keys_off_the_bars_and_the_rollback_link_in_line(acme, server, new_page, width):
    set_budget(acme, max_irreversible_per_run=5, max_cost_per_run=12)
    # Today: a healthy run (the suggestion sits just above it) and a failed, larger one whose bar
    # rises past the suggested line at the chart's right end, where its label used to be drawn.
    Session.objects.create(org=acme.org, agent=acme.agent, state="completed", irreversible_calls=2, cost=Decimal(5))
    Session.objects.create(org=acme.org, agent=acme.agent, state="failed", irreversible_calls=4, cost=Decimal(9))
    page = new_page(WIDTHS[width])
    log_in(page, acme.admin.user)
    page.goto("/agents/")
    card = f'article.agent-card[data-agent="{acme.agent.name}"]'
    page.locator(card).scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / f"reviewers-agents-{width}.png"), full_page=True)

    for n in range(page.locator(f"{card} svg.chart").count()):
        chart = f"{card} figure.chart-box:nth-of-type({n + 1}) svg.chart"
        keys = boxes(page, f"{chart} text.cap-label, {chart} text.suggested-label")
        bars = boxes(page, f"{chart} rect.bar")
        assert len(keys) == 2 and bars, (keys, bars)
        for key in keys:
            for bar in bars:
                apart = (key["right"] <= bar["left"] or bar["right"] <= key["left"]
                         or key["bottom"] <= bar["top"] or bar["bottom"] <= key["top"])
                assert apart, (n, key, bar)
        assert keys[0]["right"] <= keys[1]["left"] or keys[1]["right"] <= keys[0]["left"]  # side by side

    head = f"{card} header.agent-head"
    suspend, stop, rollback = (boxes(page, f'{head} [data-action="{action}"]')[0]
                               for action in ("suspend", "agent-incident-on", "rollback"))
    # The rollback is a link to the agent's page, drawn as the buttons beside it: their height.
    assert abs((rollback["bottom"] - rollback["top"]) - (stop["bottom"] - stop["top"])) < 2, (rollback, stop)
    controls = [suspend, stop, rollback]
    for a in controls:  # a phone wraps them onto rows; on a row they share a centre line
        for b in controls:
            if a["top"] < b["bottom"] and b["top"] < a["bottom"]:
                assert abs(centre(a) - centre(b)) < 2, (a, b)
    if width == "desktop":
        assert len({round(centre(box)) for box in controls}) == 1  # one row with Suspend and Stop


def test_a_rotation_inside_the_last_ones_overlap_says_so_and_times_carry_the_orgs_zone(acme, server, new_page, width):
    acme.org.time_zone = "Asia/Tokyo"
    acme.org.save(update_fields=["time_zone"])
    page = new_page(WIDTHS[width])
    log_in(page, acme.admin.user)
    page.goto("/settings/")

    bodies = []
    for _ in range(2):
        page.click("#rotate-secret-form button[type=submit]")
        page.wait_for_selector("#confirm-dialog[open]")
        bodies.append(page.inner_text("#confirm-body"))
        page.click("#confirm-ok")
        page.wait_for_selector("#secret-overlap:not([hidden])")
        page.wait_for_function("() => !document.querySelector('#confirm-dialog').open")

    assert "stops signing now" not in bodies[0]
    assert "The secret before it, still signing from the last rotation, stops signing now" in bodies[1]
    note = page.inner_text("#secret-overlap")
    assert note.endswith("GMT+9."), note  # the org's zone, said; not the browser's locale without a zone


def test_choosing_an_organization_puts_the_user_menu_on_the_right(acme, outsider, server, new_page, width):
    from orgs.models import Membership

    page = new_page(WIDTHS[width])
    log_in(page, acme.reviewer.user)
    Membership.objects.create(user=acme.reviewer.user, org=outsider.org, role="reviewer")
    page.goto("/orgs/")
    page.wait_for_selector("ul.org-list")
    page.screenshot(path=str(SCREENSHOTS / f"reviewers-pick-org-{width}.png"))

    brand, who = boxes(page, "header.top .brand")[0], boxes(page, "header.top .who")[0]
    assert WIDTHS[width]["width"] - who["right"] < 40 and who["left"] - brand["right"] > 40, (brand, who)
