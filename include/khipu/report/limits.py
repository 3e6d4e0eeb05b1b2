"""What a question to the view, its API or the CLI may hold: every number and text it takes is bounded here.

A value outside its bound is a :class:`ReportQueryError` (a 400 in the API and the pages) that names the
query value, what was received and the bound, never an error from the store or the archive underneath (an
integer past 64 bits overflows SQLite's and PostgreSQL's integers; PostgreSQL refuses a NUL in any text).
"""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime

from khipu.report.service import ReportQueryError

MIN_TIME_MS = 0  # 1970-01-01T00:00:00Z
MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: the last time an ISO date can write
MAX_TEXT_CHARS = 1_024  # any one text value (a name, an id, a cursor); a store column holds at most 520
TIME_EXPECTED = (
    "an ISO time such as 2026-11-23T10:00:00Z, or ms since the epoch, "
    f"from {MIN_TIME_MS} (1970-01-01T00:00:00Z) to {MAX_TIME_MS} (9999-12-31T23:59:59.999Z)"
)


def parse_time_ms(name: str, text: str) -> int:
    """A query's time (ISO with its zone, or ms since the epoch) as ms since the epoch, within
    [MIN_TIME_MS, MAX_TIME_MS]."""
    value = text.strip()
    if value.isascii() and value.isdigit():
        ms = int(value) if len(value) <= len(str(MAX_TIME_MS)) else MAX_TIME_MS + 1
    else:
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ReportQueryError(name, text, TIME_EXPECTED) from None
        if moment.tzinfo is None:
            raise ReportQueryError(name, text, f"a time with its zone (Z or +00:00): {TIME_EXPECTED}")
        try:
            ms = int(moment.astimezone(UTC).timestamp() * 1000)
        except (OverflowError, ValueError):  # 0001-01-01T00:00:00+14:00 is before year 1 in UTC
            raise ReportQueryError(name, text, TIME_EXPECTED) from None
    return check_time_ms(name, ms, shown=text)


def check_time_ms(name: str, ms: int, shown: object = None) -> int:
    """``ms`` when it lies within [MIN_TIME_MS, MAX_TIME_MS]."""
    if not MIN_TIME_MS <= ms <= MAX_TIME_MS:
        raise ReportQueryError(name, ms if shown is None else shown, TIME_EXPECTED)
    return ms


def check_count(name: str, value: int, low: int, high: int, unit: str) -> int:
    """A whole number of ``unit`` from ``low`` to ``high``."""
    if not low <= value <= high:
        raise ReportQueryError(name, value, f"{low} to {high} {unit}")
    return value


def check_text(name: str, value: str) -> str:
    """A text value of at most MAX_TEXT_CHARS characters, holding no control character (NUL among them)."""
    if len(value) > MAX_TEXT_CHARS:
        raise ReportQueryError(
            name, f"{value[:40]}... ({len(value)} characters)", f"at most {MAX_TEXT_CHARS} characters"
        )
    bad = next((c for c in value if unicodedata.category(c) in ("Cc", "Cs")), None)
    if bad is not None:
        raise ReportQueryError(
            name, value[:80], f"text without control characters (it holds U+{ord(bad):04X} at {value.index(bad)})"
        )
    return value
