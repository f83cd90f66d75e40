"""The usage chart of an install, drawn here as SVG: runs per day by status (stacked
bars) and sandbox time per day, for the last N days. No script, no external asset."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from xml.sax.saxutils import escape

__all__ = ["usage_svg"]

WIDTH, PANEL, GAP, LEFT, BOTTOM = 720, 120, 36, 44, 18
COLORS = {"succeeded": "#2f855a", "failed": "#c53030", "timed_out": "#b7791f", "running": "#718096"}
TIME_COLOR = "#2b6cb0"


def _days(count: int) -> list[str]:
    today = datetime.now(UTC).date()
    return [(today - timedelta(days=count - 1 - i)).isoformat() for i in range(count)]


def usage_svg(rows: list[dict[str, Any]], days: int = 30) -> str:
    by_day = {r["day"]: r for r in rows}
    span = _days(days)
    slot = (WIDTH - LEFT - 8) / days
    bar = max(2.0, slot * 0.7)
    runs_max = max([sum(int(by_day.get(d, {}).get(s) or 0) for s in COLORS) for d in span] + [1])
    secs_max = max([int(by_day.get(d, {}).get("sandbox_ms") or 0) / 1000 for d in span] + [1])
    height = 2 * PANEL + GAP + BOTTOM + 24
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'width="{WIDTH}" height="{height}" role="img" font-family="system-ui, sans-serif" '
        'font-size="11">',
        f"<title>Runs and sandbox time per day, last {days} days</title>",
    ]

    def panel(top: float, label: str, top_value: str) -> None:
        parts.append(f'<text x="0" y="{top + 10}" fill="#1a202c">{escape(label)}</text>')
        parts.append(f'<text x="{LEFT - 4}" y="{top + 24}" text-anchor="end" fill="#4a5568">'
                     f"{escape(top_value)}</text>")  # fmt: skip
        parts.append(f'<text x="{LEFT - 4}" y="{top + PANEL}" text-anchor="end" '
                     'fill="#4a5568">0</text>')  # fmt: skip
        parts.append(f'<line x1="{LEFT}" y1="{top + PANEL}" x2="{WIDTH - 8}" y2="{top + PANEL}" '
                     'stroke="#a0aec0"/>')  # fmt: skip

    top1 = 8.0
    top2 = top1 + PANEL + GAP
    panel(top1, "Runs per day", str(runs_max))
    panel(top2, "Sandbox seconds per day", f"{secs_max:.1f}")
    scale1 = (PANEL - 16) / runs_max
    scale2 = (PANEL - 16) / secs_max
    for i, day in enumerate(span):
        x = LEFT + i * slot + (slot - bar) / 2
        row = by_day.get(day, {})
        y = top1 + PANEL
        for status, color in COLORS.items():
            count = int(row.get(status) or 0)
            if count:
                h = count * scale1
                y -= h
                what = f"{day}: {count} {status.replace('_', ' ')}"
                parts.append(
                    f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                    f'fill="{color}"><title>{what}</title></rect>'
                )
        secs = int(row.get("sandbox_ms") or 0) / 1000
        if secs:
            h = secs * scale2
            parts.append(
                f'<rect x="{x:.1f}" y="{top2 + PANEL - h:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{TIME_COLOR}"><title>{day}: {secs:.2f} s in sandboxes</title></rect>'
            )
        if i % 5 == 0 or i == days - 1:
            parts.append(
                f'<text x="{x + bar / 2:.1f}" y="{top2 + PANEL + 14}" text-anchor="middle" '
                f'fill="#4a5568">{day[5:]}</text>'
            )
    legend_x = LEFT
    for status, color in COLORS.items():
        parts.append(
            f'<rect x="{legend_x}" y="{height - 12}" width="10" height="10" fill="{color}"/>'
        )
        parts.append(f'<text x="{legend_x + 14}" y="{height - 3}" fill="#1a202c">'
                     f'{status.replace("_", " ")}</text>')  # fmt: skip
        legend_x += 96
    parts.append("</svg>")
    return "".join(parts)
