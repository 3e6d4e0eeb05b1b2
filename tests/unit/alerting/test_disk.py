"""The state-disk alert: a numbered table of cases, each with why its answer is right."""

from __future__ import annotations

from pathlib import Path

import pytest

from khipu.alerting.disk import DISK_ALERT_KIND, disk_alert
from khipu.alerting.model import AlertState
from khipu.retention.usage import DiskUsage

GB = 10**9
# (case, free GB of 100, limit %, firing, expected state or None, why)
CASES = [
    (1, 5, 10.0, False, AlertState.FIRING, "5 % free is below 10 %: fire"),
    (2, 5, 10.0, True, None, "already firing: never twice"),
    (3, 10, 10.0, True, AlertState.RESOLVED, "back at the limit: resolve"),
    (4, 50, 10.0, False, None, "plenty free, nothing firing: quiet"),
    (5, 9, 0.0, False, None, "a 0 % limit never fires"),
]


@pytest.mark.parametrize(
    ("case", "free", "limit", "firing", "expected", "why"), CASES, ids=[f"case{c[0]}" for c in CASES]
)
def test_disk_alert(case: int, free: int, limit: float, firing: bool, expected: AlertState | None, why: str) -> None:
    alert = disk_alert(DiskUsage(Path("/state"), 100 * GB, free * GB), limit, firing, 1_000)
    assert (alert.state if alert else None) == expected, why
    if alert is not None:
        assert alert.kind == DISK_ALERT_KIND and alert.details["free_bytes"] == free * GB
