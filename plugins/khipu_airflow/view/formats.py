"""How the Khipu view writes figures for people: rates, durations and times (the pages' filters and the route map)."""

from __future__ import annotations

import re

from markupsafe import Markup, escape

from khipu.clock import iso_text
from khipu.report.limits import parse_time_ms
from khipu.report.service import ReportQueryError


def breakable(text: object) -> Markup:
    """``text`` escaped, with a line-break opportunity after each ``_``, ``.``, ``-`` and ``/`` (``<wbr>``): a name such
    as ``skipped_by_consumer`` wraps at its parts in a narrow column, never inside a word."""
    parts = re.split(r"(?<=[_./-])", str(text))
    return Markup("<wbr>").join(escape(part) for part in parts)


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


def as_typed(text: str | None) -> str:
    """A filter box's time shown as it would be typed: ms since the epoch (an old link's) as :func:`iso_text`;
    anything the page refused, as it came."""
    if not text:
        return ""
    try:
        return iso_text(parse_time_ms("since", text))
    except ReportQueryError:
        return text
