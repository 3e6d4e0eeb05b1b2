"""What Khipu's archives hold: bytes, hours, the oldest hour kept, and the free space of the disk holding them.

An archive is a :class:`~khipu.storage.location.Location`: a local folder or an object-store prefix; its sizes
are its files' (pyarrow's ``FileInfo.size``), wherever they are. Only a local archive has a disk whose free space
means something here; an object store's is not Khipu's to watch. The health page, the exporter and a retention
run's report read these; nothing here removes anything.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from khipu.storage.location import Location, StorageUnreachable

HOUR_PREFIX = "hour="
_HOUR_FOLDER = re.compile(r"hour=(\d{4}-\d{2}-\d{2}-\d{2})")


@dataclass(frozen=True, slots=True)
class ArchiveUsage:
    """One archive (by UTC hour folders) as found."""

    name: str  # "trace archive" | "verdict archive"
    path: str  # where it is, as a setting names it: a local folder, or an object store's URL
    local: bool  # a local folder (on the disk of DiskUsage), not an object store
    bytes: int  # every file under it, its index and commit record included
    hours: int  # hour folders
    oldest_hour: str | None  # YYYY-MM-DD-HH; None: empty
    newest_hour: str | None


@dataclass(frozen=True, slots=True)
class DiskUsage:
    """The file system holding the state folder (or the local archives)."""

    path: Path
    total_bytes: int
    free_bytes: int

    @property
    def free_percent(self) -> float:
        return 100.0 * self.free_bytes / self.total_bytes if self.total_bytes else 0.0


def folder_bytes(root: Location | Path) -> int:
    """The bytes of every file under ``root`` (0 when it does not exist); on a local disk, files vanishing
    meanwhile count 0."""
    location = Location.of(root, "archive")
    if not location.is_local:
        return sum(info.size or 0 for info in _listed(location) if info.type == pafs.FileType.File)
    total = 0
    for folder, _dirs, files in os.walk(location.local_path):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name), follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
    return total


def archive_hours(root: Location | Path) -> list[str]:
    """The archive's hours (YYYY-MM-DD-HH), oldest first (none when it does not exist)."""
    location = Location.of(root, "archive")
    return sorted(
        matched.group(1) for name in location.child_folders(HOUR_PREFIX) if (matched := _HOUR_FOLDER.fullmatch(name))
    )


def hour_data_bytes(root: Location | Path) -> dict[str, int]:
    """Per hour (YYYY-MM-DD-HH), the bytes of its Parquet files, from one listing of the whole archive; files and
    folders whose name starts with ``.`` or ``_`` (a write in progress, bookkeeping) are not data and not counted.
    An hour folder holding no data file counts 0."""
    location = Location.of(root, "archive")
    sizes = dict.fromkeys(archive_hours(location), 0)
    prefix = location.path.rstrip("/") + "/"
    for info in _listed(location):
        parts = info.path.removeprefix(prefix).split("/")
        matched = _HOUR_FOLDER.fullmatch(parts[0])
        if (
            info.type == pafs.FileType.File
            and matched is not None
            and info.base_name.endswith(".parquet")
            and not any(part.startswith((".", "_")) for part in parts)
        ):
            sizes[matched.group(1)] = sizes.get(matched.group(1), 0) + (info.size or 0)
    return sizes


def archive_usage(name: str, root: Location | Path) -> ArchiveUsage:
    location = Location.of(root, name)
    hours = archive_hours(location)
    return ArchiveUsage(
        name,
        str(location),
        location.is_local,
        folder_bytes(location),
        len(hours),
        hours[0] if hours else None,
        hours[-1] if hours else None,
    )


def disk_usage(path: Path) -> DiskUsage:
    """The free space of the file system holding ``path`` (its nearest existing parent)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    found = shutil.disk_usage(probe)
    return DiskUsage(path, found.total, found.free)


def _listed(location: Location) -> list[pafs.FileInfo]:
    """Everything under the location, at any depth, with sizes (nothing when it does not exist)."""
    selector = pafs.FileSelector(location.path, allow_not_found=True, recursive=True)
    try:
        return list(location.filesystem().get_file_info(selector))
    except OSError as exc:
        raise StorageUnreachable(f"{location.url}: {exc}") from exc
