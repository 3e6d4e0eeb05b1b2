"""What Khipu's archives hold on disk: bytes, hours, the oldest hour kept, and the state folder's free space.

The health page, the exporter and a retention run's report read these; nothing here removes anything.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

HOUR_PREFIX = "hour="


@dataclass(frozen=True, slots=True)
class ArchiveUsage:
    """One archive (by UTC hour folders) as found on disk."""

    name: str  # "trace archive" | "verdict archive"
    path: Path
    bytes: int  # every file under it, its index included
    hours: int  # hour folders
    oldest_hour: str | None  # YYYY-MM-DD-HH; None: empty
    newest_hour: str | None


@dataclass(frozen=True, slots=True)
class DiskUsage:
    """The file system holding the state folder."""

    path: Path
    total_bytes: int
    free_bytes: int

    @property
    def free_percent(self) -> float:
        return 100.0 * self.free_bytes / self.total_bytes if self.total_bytes else 0.0


def folder_bytes(path: Path) -> int:
    """The bytes of every file under ``path`` (0 when it does not exist); files vanishing meanwhile count 0."""
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name), follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
    return total


def archive_hours(root: Path) -> list[str]:
    """The archive's hours (YYYY-MM-DD-HH), oldest first."""
    if not root.is_dir():
        return []
    return sorted(p.name.removeprefix(HOUR_PREFIX) for p in root.glob(f"{HOUR_PREFIX}*") if p.is_dir())


def archive_usage(name: str, root: Path) -> ArchiveUsage:
    hours = archive_hours(root)
    return ArchiveUsage(
        name, root, folder_bytes(root), len(hours), hours[0] if hours else None, hours[-1] if hours else None
    )


def disk_usage(path: Path) -> DiskUsage:
    """The free space of the file system holding ``path`` (its nearest existing parent)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    found = shutil.disk_usage(probe)
    return DiskUsage(path, found.total, found.free)
