"""How the Khipu view writes figures for people: rates, durations and times (the pages' filters and the route map)."""

from __future__ import annotations

import time

from khipu.report.limits import parse_time_ms
from khipu.report.service import ReportQueryError


def pct(rate: float | None) -> str:
    """A share as a percentage: 0.0123 -> ``1.23 %``; None -> an en dash."""
    return "\N{EN DASH}" if rate is None else f"{100 * rate:.2f} %"


def duration(value: int | float | None) -> str:
    """A duration in ms for people: 850 ms, 12.5 s, 3.0 min, 2.0 h, 7.0 d; None -> an en dash."""
    if value is None:
        return "\N{EN DASH}"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000)):
        if value >= 2 * size:
            return f"{value / size:.1f} {unit}"
    return f"{value / 1000:.1f} s" if value >= 10_000 else f"{value:.0f} ms"


def typed_time(ms: int) -> str:
    """A time as a person types it in a filter box (and :func:`khipu.report.limits.parse_time_ms` reads it):
    ``2026-11-23T10:00:00Z``, with its milliseconds when it has any (``...:00.250Z``)."""
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000))
    return f"{text}.{ms % 1000:03d}Z" if ms % 1000 else f"{text}Z"


def as_typed(text: str | None) -> str:
    """A filter box's time shown as it would be typed: ms since the epoch (an old link's) as :func:`typed_time`;
    anything the page refused, as it came."""
    if not text:
        return ""
    try:
        return typed_time(parse_time_ms("since", text))
    except ReportQueryError:
        return text
