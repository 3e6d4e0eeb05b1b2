"""Small inline SVG charts for the Khipu view: no script, no external asset, readable in any browser."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape


def sparkline(
    values: Sequence[float | None],
    *,
    label: str,
    width: int = 180,
    height: int = 36,
    threshold: float | None = None,
    colour: str = "#2563eb",
) -> str:
    """A line of ``values`` (None: no data, a gap in the line), scaled to the largest value or threshold, with a
    dashed line at ``threshold``. ``label`` becomes the chart's accessible title."""
    known = [v for v in values if v is not None]
    top = max([*known, threshold or 0.0, 0.0]) or 1.0
    step = width / max(len(values) - 1, 1)

    def y(value: float) -> float:
        return round(height - 2 - (height - 4) * value / top, 1)

    segments: list[list[str]] = [[]]
    for i, value in enumerate(values):
        if value is None:
            if segments[-1]:
                segments.append([])
            continue
        segments[-1].append(f"{round(i * step, 1)},{y(value)}")
    parts = [
        f'<svg class="spark" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'data-points="{len(known)}"><title>{escape(label)}</title>',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#f8fafc"/>',
    ]
    if threshold is not None and threshold > 0:
        parts.append(
            f'<line x1="0" x2="{width}" y1="{y(threshold)}" y2="{y(threshold)}" stroke="#dc2626" '
            'stroke-dasharray="3 3" stroke-width="1"/>'
        )
    for points in segments:
        if len(points) == 1:
            x, y_ = points[0].split(",")
            parts.append(f'<circle cx="{x}" cy="{y_}" r="1.8" fill="{colour}"/>')
        elif points:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{" ".join(points)}"/>')
    if not known:
        parts.append(f'<text x="4" y="{height // 2 + 4}" font-size="10" fill="#64748b">no verdicts</text>')
    parts.append("</svg>")
    return "".join(parts)
