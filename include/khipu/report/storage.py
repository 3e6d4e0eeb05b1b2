"""Khipu's own storage, as the health page, the API and the exporter show it: bytes and hours per archive, the
oldest hour kept, the store's size and the free space of the disk holding the archives, against the retention's
limits. Archives in an object store have no local disk: no disk figure is given for them, and the storage says so
(``disk_note``; the exporter's ``khipu_archive_local`` gauge is 0 for them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric

from khipu.reconcile.window import hour_start_ms
from khipu.retention.policy import RetentionPolicy, disk_low
from khipu.retention.usage import ArchiveUsage, DiskUsage, archive_usage, disk_usage
from khipu.storage.location import Location


@dataclass(frozen=True, slots=True)
class StorageHealth:
    archives: list[ArchiveUsage]  # the trace archive, the verdict archive
    store_bytes: int | None  # None: the store cannot say (or could not be read)
    disk: DiskUsage | None  # the file system holding the local archives' folder; None: no archive is local
    disk_low: bool  # less free than the policy's disk_free_min_percent
    disk_free_min_percent: float
    oldest_metric_ms: int | None  # the first minute (or rolled-up hour) with metrics
    disk_note: str | None = None  # why there is no disk figure (the archives are in an object store)


def storage_health(
    archives: Mapping[str, Location | Path],
    policy: RetentionPolicy,
    store_bytes: int | None = None,
    oldest_metric_ms: int | None = None,
) -> StorageHealth:
    """What the archives (by name) hold now, and the disk of the folder holding the local ones (the state
    folder, by default); archives in an object store have no local disk, and ``disk_note`` says so."""
    located = {name: Location.of(where, name) for name, where in archives.items()}
    local = [location.local_path.parent for location in located.values() if location.is_local]
    disk = disk_usage(local[0]) if local else None
    remote = [f"the {name} ({location.url})" for name, location in located.items() if not location.is_local]
    note = None
    if remote:
        note = f"{' and '.join(remote)}: in an object store, on no local disk (no disk figure covers {_it(remote)})"
    return StorageHealth(
        [archive_usage(name, location) for name, location in located.items()],
        store_bytes,
        disk,
        disk is not None and disk_low(disk.free_bytes, disk.total_bytes, policy),
        policy.disk_free_min_percent,
        oldest_metric_ms,
        note,
    )


def storage_families(health: StorageHealth) -> list[Metric]:
    """The exporter's storage gauges."""
    size = GaugeMetricFamily(
        "khipu_archive_bytes",
        "Bytes of the files per Khipu archive (on the local disk or in the object store).",
        labels=("archive",),
    )
    local = GaugeMetricFamily(
        "khipu_archive_local",
        "1 when the Khipu archive is a local folder (on the disk the khipu_state_disk_* gauges measure), 0 when it is "
        "in an object store (no local disk: no disk gauge covers it).",
        labels=("archive",),
    )
    hours = GaugeMetricFamily("khipu_archive_hours", "UTC hours kept per Khipu archive.", labels=("archive",))
    oldest = GaugeMetricFamily(
        "khipu_archive_oldest_hour_seconds",
        "Start of the oldest UTC hour kept per Khipu archive, in seconds since the epoch.",
        labels=("archive",),
    )
    for archive in health.archives:
        label = archive.name.replace(" ", "_")
        size.add_metric([label], archive.bytes)
        local.add_metric([label], int(archive.local))
        hours.add_metric([label], archive.hours)
        if archive.oldest_hour is not None:
            oldest.add_metric([label], hour_start_ms(archive.oldest_hour) / 1000)
    families: list[Metric] = [size, local, hours, oldest]
    if health.store_bytes is not None:
        families.append(
            GaugeMetricFamily("khipu_store_bytes", "Bytes the Khipu store takes.", value=health.store_bytes)
        )
    if health.disk is None:  # the archives are in an object store: khipu_archive_local says so
        return families
    families += [
        GaugeMetricFamily(
            "khipu_state_disk_free_bytes",
            "Free bytes on the disk of Khipu's state folder.",
            value=health.disk.free_bytes,
        ),
        GaugeMetricFamily(
            "khipu_state_disk_size_bytes", "Size of the disk of Khipu's state folder.", value=health.disk.total_bytes
        ),
        GaugeMetricFamily(
            "khipu_state_disk_low",
            "1 when the state folder's disk has less free space than the retention's disk_free_min_percent.",
            value=int(health.disk_low),
        ),
    ]
    return families


def _it(items: list[str]) -> str:
    return "it" if len(items) == 1 else "them"
