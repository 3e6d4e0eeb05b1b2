"""Keeping the detector running: is it healthy, and stopping a hung one so it can be restarted.

The detector's heartbeat (every batch, and every idle trigger) is its sign of life. A detector
whose newest heartbeat is older than ``stale_after_ms`` is down or hung: the supervising DAG stops
what is left of it (on this host, from the driver file the entry point writes) and submits it
again; it resumes from its checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

log = logging.getLogger(__name__)


class DetectorState(StrEnum):
    HEALTHY = "healthy"
    STALE = "stale"  # it ran, but has not reported for too long: down or hung
    NEVER_RAN = "never_ran"


@dataclass(frozen=True, slots=True)
class DetectorHealth:
    state: DetectorState
    last_beat_ms: int | None
    reason: str


def judge_detector(last_beat_ms: int | None, now_ms: int, stale_after_ms: int) -> DetectorHealth:
    if last_beat_ms is None:
        return DetectorHealth(DetectorState.NEVER_RAN, None, "no heartbeat has ever been stored")
    age = now_ms - last_beat_ms
    if age > stale_after_ms:
        return DetectorHealth(
            DetectorState.STALE,
            last_beat_ms,
            f"last heartbeat {age / 1000:.0f}s ago (stale after {stale_after_ms / 1000:.0f}s)",
        )
    return DetectorHealth(DetectorState.HEALTHY, last_beat_ms, f"last heartbeat {age / 1000:.0f}s ago")


def stop_driver(checkpoint_dir: Path, timeout_s: float = 30.0) -> str:
    """Stop the detector driver recorded in ``<checkpoint>/driver.json`` if it runs on this host."""
    driver_file = checkpoint_dir / "driver.json"
    try:
        driver = json.loads(driver_file.read_text())
        pid, host = int(driver["pid"]), str(driver["host"])
    except (OSError, ValueError, KeyError):
        return "no driver recorded"
    if host != socket.gethostname():
        return f"driver runs on {host}: stop it through its cluster manager"
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return f"driver {pid} already gone"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"driver {pid} stopped"
        time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    log.warning("detector driver %d did not stop within %.0fs: killed", pid, timeout_s)
    return f"driver {pid} killed"
