"""Small inline SVG charts for the Khipu view: no script, no external asset, readable in any browser.

A chart is read like any other: it names what it shows, its scale's top and bottom are written beside the plot, the
window's ends under it, and every known value is a point (a lone one is still seen); a step without data is a gap,
never a zero. A chart with no data at all says so in words.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

from khipu_airflow.view.formats import duration, pct

FONT_PX = 9
BAND = 12  # the height of the text rows above and under the plot
GUTTER = 44  # the scale's labels, right of the plot
UNITS: dict[str, Callable[[float], str]] = {  # how a chart's scale is written, by the unit of its values
    "rate": pct,
    "ms": duration,
    "count": lambda value: f"{value:,.0f}",
}


def sparkline(
    values: Sequence[float | None],
    *,
    label: str,
    unit: str,
    name: str = "",
    start: str = "",
    end: str = "now",
    empty: str = "no data",
    width: int = 176,
    height: int = 60,
    threshold: float | None = None,
    colour: str = "#2563eb",
) -> str:
    """A line of ``values`` in time order (None: no data, a gap in the line), scaled from 0 to the largest value or
    ``threshold`` (a dashed line), each value a point. ``unit`` says how the scale's labels are written (one of
    :data:`UNITS`: a rate as a percentage, a latency in ms as a duration, a count); ``name`` heads the chart;
    ``start`` and ``end`` name the window's ends (none: not written); ``empty`` is what a chart without a value says.
    ``label`` becomes the chart's accessible title."""
    shown = UNITS[unit]
    known = [v for v in values if v is not None]
    top = max([*known, threshold or 0.0, 0.0]) or 1.0
    left, right = 2.0, float(width - GUTTER)
    upper, lower = float(BAND + 2), float(height - BAND - 2)
    step = (right - left) / max(len(values) - 1, 1)

    def x(index: int) -> float:
        return round(left + index * step, 1)

    def y(value: float) -> float:
        return round(lower - (lower - upper) * value / top, 1)

    parts = [
        f'<svg class="spark" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'data-points="{len(known)}" font-size="{FONT_PX}" font-family="system-ui, sans-serif">'
        f"<title>{escape(label)}</title>",
        f'<rect x="{left}" y="{upper}" width="{right - left}" height="{lower - upper}" fill="#f8fafc"/>',
        f'<line x1="{left}" x2="{right}" y1="{lower}" y2="{lower}" stroke="#94a3b8" stroke-width="1"/>',
    ]
    if name:
        parts.append(_text(left, BAND - 3, name, "name", "start", "#334155"))
    parts += [
        _text(at, height - 3, text, role, role)
        for at, text, role in ((left, start, "start"), (right, end, "end"))
        if text
    ]
    if not known:
        parts.append(_text((left + right) / 2, (upper + lower) / 2 + 3, empty, "empty", "middle"))
        parts.append("</svg>")
        return "".join(parts)
    if threshold is not None and threshold > 0:
        parts.append(
            f'<line x1="{left}" x2="{right}" y1="{y(threshold)}" y2="{y(threshold)}" stroke="#dc2626" '
            'stroke-dasharray="3 3" stroke-width="1"/>'
        )
    parts += [
        _text(right + 3, upper + FONT_PX - 2, shown(top), "top", "start"),
        _text(right + 3, lower, shown(0.0), "bottom", "start"),
    ]
    run: list[str] = []
    for index, value in enumerate([*values, None]):  # a trailing None ends the last run
        if value is not None:
            run.append(f"{x(index)},{y(value)}")
            continue
        if len(run) > 1:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(run)}"/>')
        run = []
    parts += [
        f'<circle cx="{x(index)}" cy="{y(value)}" r="2" fill="{colour}"/>'
        for index, value in enumerate(values)
        if value is not None
    ]
    parts.append("</svg>")
    return "".join(parts)


def _text(x: float, y: float, text: str, role: str, anchor: str, colour: str = "#64748b") -> str:
    return (
        f'<text x="{round(x, 1)}" y="{round(y, 1)}" text-anchor="{anchor}" fill="{colour}" data-role="{role}">'
        f"{escape(text)}</text>"
    )
