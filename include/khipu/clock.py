"""The wall clock, read at the edges (commands, the view, the exporter) and passed inward as ``now_ms``."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def utc_text(ms: int | None, missing: str = "-") -> str:
    """``2026-11-23 18:42:02Z`` (``missing`` for None): how people read a time in the CLI and the view."""
    if ms is None:
        return missing
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(int(ms) / 1000)) + "Z"
