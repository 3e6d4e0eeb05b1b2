"""The state-disk alert: the disk holding Khipu's state folder (the archives, a local store) is nearly full."""

from __future__ import annotations

from khipu.alerting.model import Alert, AlertState, Severity
from khipu.retention.usage import DiskUsage

DISK_ALERT_KIND = "state_disk_low"


def disk_alert(disk: DiskUsage, min_free_percent: float, firing: bool, now_ms: int) -> Alert | None:
    """The alert to raise now, given whether one is firing: one when the free share falls below
    ``min_free_percent``, one resolve when it is back at or above it, nothing otherwise."""
    low = disk.total_bytes > 0 and disk.free_percent < min_free_percent
    details = {
        "path": str(disk.path),
        "free_bytes": disk.free_bytes,
        "total_bytes": disk.total_bytes,
        "free_percent": round(disk.free_percent, 2),
        "min_free_percent": min_free_percent,
    }
    if low and not firing:
        return Alert(
            key=f"disk:low:{now_ms}",
            subject=f"khipu state disk {disk.path}",
            kind=DISK_ALERT_KIND,
            state=AlertState.FIRING,
            severity=Severity.CRITICAL,
            title=f"Khipu's state disk is {disk.free_percent:.1f} % free ({disk.free_bytes / 1e9:.1f} GB), below "
            f"{min_free_percent:g} %: shorten the retention (khipu_retention) or grow the disk",
            at_ms=now_ms,
            details=details,
        )
    if not low and firing:
        return Alert(
            key=f"disk:resolved:{now_ms}",
            subject=f"khipu state disk {disk.path}",
            kind=DISK_ALERT_KIND,
            state=AlertState.RESOLVED,
            severity=Severity.INFO,
            title=f"resolved: Khipu's state disk is {disk.free_percent:.1f} % free again",
            at_ms=now_ms,
            details=details,
        )
    return None
