"""Inline SVG charts for the dashboard: drawn on the server, no script, no chart library.

Each function takes plain numbers and returns markup that is safe to put in a template
(every text is escaped here). Colours come from CSS classes, so the stylesheet decides them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 420, 170
LEFT, RIGHT, TOP, BOTTOM = 34, 12, 14, 40


def _nice_top(value: float) -> float:
    """A round axis maximum at or above `value` (1, 2, 5 × 10^n)."""
    if value <= 0:
        return 1
    magnitude = 1.0
    while magnitude * 10 <= value:
        magnitude *= 10
    while magnitude > value:
        magnitude /= 10
    for step in (1, 2, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude


def _fmt(value: float) -> str:
    if value == int(value):
        return str(int(value))
    return f"{value:.2f}".rstrip("0").rstrip(".")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _frame(title: str, body: list[str], height: int = HEIGHT) -> SafeString:
    return mark_safe(
        f'<svg class="chart" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(title)}" '
        f'preserveAspectRatio="xMidYMid meet"><title>{escape(title)}</title>{"".join(body)}</svg>')


def _axis(top: float, plot_h: float, *, counts: bool = False, plot_top: float = TOP) -> list[str]:
    """Grid lines and labels at 0, half and the top; a count's axis skips a half that is not a
    whole number (no "0.5 calls", no "2.5 decided")."""
    parts = []
    for fraction in (0, 0.5, 1):
        if counts and fraction == 0.5 and top * fraction != int(top * fraction):
            continue
        y = plot_top + plot_h * (1 - fraction)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(f'<text class="axis" x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">'
                     f'{escape(_fmt(top * fraction))}</text>')
    return parts


def decisions_per_day(per_day: Sequence[dict[str, Any]]) -> SafeString:
    """Stacked bars of approved / rejected / expired per day, each day's median time to decide
    under its bar."""
    totals = [day["approved"] + day["rejected"] + day["expired"] for day in per_day]
    top = _nice_top(max(totals, default=0))
    plot_h = HEIGHT - TOP - BOTTOM
    slot = (WIDTH - LEFT - RIGHT) / max(len(per_day), 1)
    bar_w = slot * 0.6
    body = _axis(top, plot_h, counts=True)
    for n, (day, total) in enumerate(zip(per_day, totals, strict=True)):
        x = LEFT + n * slot + (slot - bar_w) / 2
        y = TOP + plot_h
        for kind in ("approved", "rejected", "expired"):
            h = plot_h * day[kind] / top
            if h:
                y -= h
                body.append(f'<rect class="bar {kind}" x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" '
                            f'height="{h:.1f}"><title>{day[kind]} {kind}</title></rect>')
        if total:
            body.append(f'<text class="value" x="{x + bar_w / 2:.1f}" y="{y - 3:.1f}" '
                        f'text-anchor="middle">{total}</text>')
        label = day["date"].strftime("%a %d")
        cx = x + bar_w / 2
        body.append(f'<text class="axis" x="{cx:.1f}" y="{HEIGHT - BOTTOM + 13}" text-anchor="middle">'
                    f'{escape(label)}</text>')
        body.append(f'<text class="median" x="{cx:.1f}" y="{HEIGHT - BOTTOM + 27}" text-anchor="middle">'
                    f'{escape(duration(day["median_time_to_decide_s"]))}</text>')
    return _frame("Approvals decided per day, and the median time to decide", body)


def runs_against_cap(runs_per_day: Sequence[dict[str, Any]], caps: dict[str, dict[str, Any]]) -> dict[str, SafeString]:
    """Two charts per agent: the largest run of each day (irreversible calls, cost) as bars,
    with the current cap (red) and the suggested cap (blue dashed) as lines."""
    return {
        "irreversible": _against_cap(runs_per_day, "max_irreversible", caps.get("irreversible", {}),
                                     "Irreversible calls in the day's largest run", counts=True),
        "cost": _against_cap(runs_per_day, "max_cost", caps.get("cost", {}), "Cost of the day's largest run"),
    }


# The cap lines' key sits in a row above the plot: drawn at a line's end, "suggested 6" covered
# the bar of a day whose largest run reached it.
KEY_ROW = 24


def _against_cap(days: Sequence[dict[str, Any]], key: str, cap: dict[str, Any], title: str,
                 counts: bool = False) -> SafeString:
    height = 160
    plot_top = KEY_ROW
    plot_h = height - plot_top - 28
    current, suggested = cap.get("current"), cap.get("suggested")
    values = [day[key] for day in days]
    top = _nice_top(max([*values, current or 0, suggested or 0], default=0))
    slot = (WIDTH - LEFT - RIGHT) / max(len(days), 1)
    bar_w = slot * 0.55
    body = _axis(top, plot_h, counts=counts, plot_top=plot_top)
    for n, day in enumerate(days):
        x = LEFT + n * slot + (slot - bar_w) / 2
        h = plot_h * day[key] / top
        over = current is not None and day[key] > current
        if h:
            body.append(f'<rect class="bar {"over" if over else "run"}" x="{x:.1f}" y="{plot_top + plot_h - h:.1f}" '
                        f'width="{bar_w:.1f}" height="{h:.1f}"><title>{escape(_fmt(day[key]))} in the largest of '
                        f'{day["runs"]} runs</title></rect>')
        body.append(f'<text class="axis" x="{x + bar_w / 2:.1f}" y="{height - 14}" text-anchor="middle">'
                    f'{escape(day["date"].strftime("%a"))}</text>')
    key_x = float(WIDTH - RIGHT)
    for value, css, label in ((suggested, "suggested", "suggested"), (current, "cap", "cap")):
        if value is None:
            continue
        y = plot_top + plot_h * (1 - value / top)
        text = f"{label} {_fmt(value)}"
        body.append(f'<line class="{css}" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}">'
                    f'<title>{escape(text)}</title></line>')
        # Right-aligned, one after the other leftwards: a sample of the line, then its words.
        body.append(f'<text class="{css}-label" x="{key_x:.1f}" y="12" text-anchor="end">{escape(text)}</text>')
        key_x -= len(text) * 6 + 4
        body.append(f'<line class="{css}" x1="{key_x - 16:.1f}" x2="{key_x:.1f}" y1="8.5" y2="8.5"/>')
        key_x -= 16 + 14
    return _frame(title, body, height)
