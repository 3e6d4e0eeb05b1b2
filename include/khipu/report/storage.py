"""Khipu's own storage, as the health page, the API and the exporter show it: bytes and hours per archive, the
oldest hour kept, the store's size and the state folder's free disk, against the retention's limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric

from khipu.reconcile.window import hour_start_ms
from khipu.retention.policy import RetentionPolicy, disk_low
from khipu.retention.usage import ArchiveUsage, DiskUsage, archive_usage, disk_usage


@dataclass(frozen=True, slots=True)
class StorageHealth:
    archives: list[ArchiveUsage]  # the trace archive, the verdict archive
    store_bytes: int | None  # None: the store cannot say (or could not be read)
    disk: DiskUsage  # the file system holding the state folder
    disk_low: bool  # less free than the policy's disk_free_min_percent
    disk_free_min_percent: float
    oldest_metric_ms: int | None  # the first minute (or rolled-up hour) with metrics


def storage_health(
    archives: Mapping[str, Path],
    state_dir: Path,
    policy: RetentionPolicy,
    store_bytes: int | None = None,
    oldest_metric_ms: int | None = None,
) -> StorageHealth:
    """What the archives (by name) and the state folder's disk hold now."""
    disk = disk_usage(state_dir)
    return StorageHealth(
        [archive_usage(name, path) for name, path in archives.items()],
        store_bytes,
        disk,
        disk_low(disk.free_bytes, disk.total_bytes, policy),
        policy.disk_free_min_percent,
        oldest_metric_ms,
    )


def storage_families(health: StorageHealth) -> list[Metric]:
    """The exporter's storage gauges."""
    size = GaugeMetricFamily("khipu_archive_bytes", "Bytes on disk per Khipu archive.", labels=("archive",))
    hours = GaugeMetricFamily("khipu_archive_hours", "UTC hours kept per Khipu archive.", labels=("archive",))
    oldest = GaugeMetricFamily(
        "khipu_archive_oldest_hour_seconds",
        "Start of the oldest UTC hour kept per Khipu archive, in seconds since the epoch.",
        labels=("archive",),
    )
    for archive in health.archives:
        label = archive.name.replace(" ", "_")
        size.add_metric([label], archive.bytes)
        hours.add_metric([label], archive.hours)
        if archive.oldest_hour is not None:
            oldest.add_metric([label], hour_start_ms(archive.oldest_hour) / 1000)
    families: list[Metric] = [size, hours, oldest]
    if health.store_bytes is not None:
        families.append(
            GaugeMetricFamily("khipu_store_bytes", "Bytes the Khipu store takes.", value=health.store_bytes)
        )
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
