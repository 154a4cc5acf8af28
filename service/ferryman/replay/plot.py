"""Plain SVG charts (no plotting library): one panel per series group, a line per series,
over seconds on the x axis."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["Panel", "Series", "svg"]

WIDTH, PANEL_HEIGHT, MARGIN = 760, 150, 48
COLOURS = ("#1565c0", "#ef6c00", "#6a1b9a", "#00838f", "#455a64")
# The colour of a series by what it counts: granted green, refused red.
MEANING = {"allowed": "#2e7d32", "granted": "#2e7d32", "handed": "#2e7d32", "refused": "#c62828"}


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]  # (second, value)


@dataclass(frozen=True)
class Panel:
    title: str
    series: Sequence[Series]


def _polyline(series: Series, x0: float, span: float, top: float, high: float) -> str:
    inner = WIDTH - 2 * MARGIN
    points = " ".join(
        f"{MARGIN + (x - x0) / span * inner:.1f},{top + PANEL_HEIGHT - y / high * PANEL_HEIGHT:.1f}"
        for x, y in series.points
    )
    return points


def svg(panels: Sequence[Panel], title: str = "") -> str:
    """The panels stacked, sharing the x axis (the seconds from the first point)."""
    xs = [x for p in panels for s in p.series for x, _ in s.points] or [0.0]
    x0, x1 = min(xs), max(xs)
    span = max(1.0, x1 - x0)
    height = 30 + len(panels) * (PANEL_HEIGHT + 50)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="{MARGIN}" y="18" font-size="13">{escape(title)}</text>',
    ]
    for n, panel in enumerate(panels):
        top = 40 + n * (PANEL_HEIGHT + 50)
        high = max([y for s in panel.series for _, y in s.points] or [1.0]) or 1.0
        out.append(f'<text x="{MARGIN}" y="{top - 6}">{escape(panel.title)}</text>')
        out.append(
            f'<rect x="{MARGIN}" y="{top}" width="{WIDTH - 2 * MARGIN}" '
            f'height="{PANEL_HEIGHT}" fill="none" stroke="#999"/>'
        )
        out.append(f'<text x="4" y="{top + 10}">{high:g}</text>')
        out.append(f'<text x="4" y="{top + PANEL_HEIGHT}">0</text>')
        count = len(panel.series)
        for i, series in enumerate(panel.series):
            colour = MEANING.get(series.name, COLOURS[i % len(COLOURS)])
            points = _polyline(series, x0, span, top, high)
            out.append(f'<polyline fill="none" stroke="{colour}" points="{points}"/>')
            out.append(
                f'<text x="{WIDTH - MARGIN - 110 * (count - i)}" y="{top - 6}" '
                f'fill="{colour}">{escape(series.name)}</text>'
            )
        out.append(
            f'<text x="{WIDTH - MARGIN - 40}" y="{top + PANEL_HEIGHT + 14}">{span:g} s</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"
