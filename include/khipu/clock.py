"""The wall clock, read at the edges (commands, the view, the exporter) and passed inward as ``now_ms``."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def elapsed_ms(since_ms: int, now_ms: int) -> int:
    """The time from ``since_ms`` to ``now_ms``: 0, never negative, when ``since_ms`` is later (a clock set back, a
    time stamped by another host's clock, a progress recorded after the ``now`` a check was given)."""
    return max(0, now_ms - since_ms)


def iso_text(ms: int) -> str:
    """``2026-11-23T10:00:00Z``, with its milliseconds when it has any (``...:00.250Z``): a time as a person types it
    (in a filter box, a DAG's Params) and as the parsers of times read it back."""
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000))
    return f"{text}.{ms % 1000:03d}Z" if ms % 1000 else f"{text}Z"


def utc_text(ms: int | None, missing: str = "-") -> str:
    """``2026-11-23 18:42:02Z`` (``missing`` for None): how people read a time in the CLI and the view."""
    if ms is None:
        return missing
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(int(ms) / 1000)) + "Z"
