"""How large the detector's and reconciliation's Spark applications are: settings a DAG passes (its Params, or the
Spark connection's extra), validated once, each refusal naming the setting, where it came from and what is expected.

- **Fixed for a checkpoint** (the detector's): ``buckets``, the hash buckets of message ids its state is kept in
  (``--buckets``), and ``shuffle_partitions``, the partitions of its one shuffle (``--shuffle-partitions``; Spark keeps
  the count in the checkpoint's offset log and would ignore another). Unset, they are the checkpoint's own (a new
  checkpoint: :data:`DEFAULT_BUCKETS`, :data:`DEFAULT_SHUFFLE_PARTITIONS`); set to another count than the
  checkpoint's, the start is refused (:func:`settle`): its state is kept per bucket.
- **Spark's resources** (:class:`SparkResources`): spark-submit's ``--driver-memory``, ``--executor-memory``,
  ``--executor-cores``, ``--total-executor-cores`` (standalone) and ``--num-executors`` (YARN, Kubernetes), passed
  as ``SparkSubmitHook``'s keyword arguments of the same names. Unset: Spark's own defaults.

A value asked for in the run (a Param) wins over the connection's extra; null means unset. Nothing here reads
Airflow or starts Spark: the DAGs' plugins hand the values in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from khipu.errors import InvalidSetting

if TYPE_CHECKING:
    from khipu.detector.checkpoint import CheckpointSizing

DEFAULT_BUCKETS = 32
MAX_BUCKETS = 4096
DEFAULT_SHUFFLE_PARTITIONS = 4
# A JVM memory size as spark-submit takes it (Spark's byteString): a whole number and a unit, b optional after it.
MEMORY_PATTERN = r"^[1-9][0-9]*[kKmMgGtTpP][bB]?$"
MEMORY_EXPECTED = "a JVM memory size: a whole number and a unit, k, m, g or t (512m, 4g)"
RESCALING = 'docs/detector.md, "Rescaling to another bucket count"'

RESOURCES = ("driver_memory", "executor_memory", "executor_cores", "total_executor_cores", "num_executors")
FIXED = ("buckets", "shuffle_partitions")
_MEMORY = ("driver_memory", "executor_memory")


class SizingError(InvalidSetting):
    kind = "Spark sizing"


@dataclass(frozen=True, slots=True)
class SparkResources:
    """spark-submit's resources for the driver and the executors; None: Spark's own default."""

    driver_memory: str | None = None
    executor_memory: str | None = None
    executor_cores: int | None = None
    total_executor_cores: int | None = None
    num_executors: int | None = None

    def hook_arguments(self) -> dict[str, Any]:
        """The ones set, as ``SparkSubmitHook``'s keyword arguments (the same names)."""
        found = {name: getattr(self, name) for name in RESOURCES}
        return {name: value for name, value in found.items() if value is not None}


@dataclass(frozen=True, slots=True)
class DetectorSizing:
    """What the detector is asked to run with; None: unset (the checkpoint's, or the default)."""

    buckets: int | None = None
    shuffle_partitions: int | None = None
    resources: SparkResources = field(default_factory=SparkResources)

    def settled(self, kept: CheckpointSizing) -> tuple[int, int]:
        """(buckets, shuffle partitions) to start with on a checkpoint that keeps ``kept``; refuses another count."""
        return (
            settle("buckets", self.buckets, kept.buckets, DEFAULT_BUCKETS, kept.url),
            settle("shuffle_partitions", self.shuffle_partitions, kept.shuffle_partitions,
                   DEFAULT_SHUFFLE_PARTITIONS, kept.url),
        )  # fmt: skip


def settle(name: str, asked: int | None, kept: int | None, default: int, checkpoint_url: str) -> int:
    """The count a checkpoint runs with: the one it keeps (asked for again, or not asked for), else the one asked
    for, else ``default``. Another count than the one it keeps is refused: its state is laid out by it."""
    if kept is None:
        return default if asked is None else asked
    if asked is None or asked == kept:
        return kept
    raise SizingError(
        name,
        asked,
        f"{kept}, the count the checkpoint {checkpoint_url} was started with: a checkpoint keeps its {name} (leave "
        f"it unset to take the checkpoint's; to change it, see {RESCALING})",
    )


def detector_sizing(
    params: Mapping[str, object], extra: Mapping[str, object], params_source: str, extra_source: str
) -> DetectorSizing:
    """The detector's sizing from the run's Params, then the connection's extra for what the Params leave unset."""
    counts, sizes = _chosen(params, extra, (*FIXED, *RESOURCES), params_source, extra_source)
    return DetectorSizing(counts.get("buckets"), counts.get("shuffle_partitions"), _resources(counts, sizes))


def spark_resources(
    params: Mapping[str, object], extra: Mapping[str, object], params_source: str, extra_source: str
) -> SparkResources:
    """A reconciliation's resources (it sizes its shuffles by the archive it reads: no buckets, no partitions)."""
    return _resources(*_chosen(params, extra, RESOURCES, params_source, extra_source))


def _resources(counts: Mapping[str, int], sizes: Mapping[str, str]) -> SparkResources:
    return SparkResources(
        driver_memory=sizes.get("driver_memory"),
        executor_memory=sizes.get("executor_memory"),
        executor_cores=counts.get("executor_cores"),
        total_executor_cores=counts.get("total_executor_cores"),
        num_executors=counts.get("num_executors"),
    )


def _chosen(
    params: Mapping[str, object],
    extra: Mapping[str, object],
    names: tuple[str, ...],
    params_source: str,
    extra_source: str,
) -> tuple[dict[str, int], dict[str, str]]:
    """(counts, memory sizes) set: the Params' over the extra's."""
    extra_counts, extra_sizes = _checked(extra, names, extra_source)
    param_counts, param_sizes = _checked(params, names, params_source)
    return extra_counts | param_counts, extra_sizes | param_sizes


def _checked(
    values: Mapping[str, object], names: tuple[str, ...], source: str
) -> tuple[dict[str, int], dict[str, str]]:
    """(counts, memory sizes) of the values set (not None), each checked; an unknown name is refused (a typo must
    not pass unnoticed)."""
    counts: dict[str, int] = {}
    sizes: dict[str, str] = {}
    for name, value in values.items():
        setting = f"{name} ({source})"
        if name not in names:
            raise SizingError(setting, value, f"one of {', '.join(names)}")
        if value is None:
            continue
        if name in _MEMORY:
            if not (isinstance(value, str) and re.fullmatch(MEMORY_PATTERN, value)):
                raise SizingError(setting, value, MEMORY_EXPECTED)
            sizes[name] = value
            continue
        high = MAX_BUCKETS if name == "buckets" else None
        if not isinstance(value, int) or isinstance(value, bool) or value < 1 or (high is not None and value > high):
            raise SizingError(setting, value, f"an integer from 1 to {high}" if high else "an integer >= 1")
        counts[name] = value
    return counts, sizes
