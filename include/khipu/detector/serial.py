"""The serial part of the detector's batches, and what it caps: how fast the detector could go on C cores.

Each micro-batch runs one Spark job (the executors judge the batch) and, around it, work on the driver alone:
Spark's own bookkeeping (planning the batch, its offset and commit logs) and the writer (``foreachBatch``), which
writes what the job collected. While the driver works the query runs no task, so more executors shorten only the job.
From the heartbeats (:class:`khipu.detector.outputs.SerialTime`, per batch):

- ``job_s``: the Spark jobs' wall time (the collect, from its start to its results decoded on the driver);
- ``serial_s``: the rest of each batch's duration (Spark's ``batchDuration`` less the job): the executors wait;
- ``driver_cpu_s``: the writer thread's CPU.

The projected ceiling on C cores, from the per-core rate ``r`` (traces per second of job wall time, per core the job
had) and the serial seconds per trace ``s``: without overlap, ``1 / (1 / (C r) + s)``; if the driver's work
overlapped the next batch's tasks, ``min(C r, 1 / s)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SerialPart:
    batches: int  # batches with the writer's figures (a batch without them is left out)
    traces: int  # what they read
    batch_s: float  # their durations, summed (Spark's batchDuration)
    job_s: float
    driver_s: float  # of the serial time, the writer's (the rest is Spark's bookkeeping)
    driver_cpu_s: float

    @property
    def serial_s(self) -> float:
        return max(0.0, self.batch_s - self.job_s)

    def per_trace_us(self, seconds: float) -> float:
        return seconds / self.traces * 1e6 if self.traces else float("nan")

    def per_core_rate(self, job_cores: int) -> float:
        """Traces per second of the Spark jobs' wall time, per core they had."""
        return self.traces / (self.job_s * job_cores) if self.job_s > 0 and job_cores > 0 else float("nan")

    def ceiling(self, cores: int, job_cores: int, *, overlapped: bool) -> float:
        """Traces/s the detector could keep up with on ``cores`` cores (the module's formulas)."""
        rate = cores * self.per_core_rate(job_cores)
        serial = self.serial_s / self.traces if self.traces else float("nan")
        if overlapped:
            return min(rate, 1 / serial) if serial > 0 else rate
        return 1 / (1 / rate + serial)


def serial_part(beats: Iterable[Mapping[str, Any]], skip_first: bool = True) -> SerialPart:
    """The serial part of the batches these heartbeats report (``detector_heartbeat`` rows): only batches the
    writer finished (``collect_ms`` set) and that read something; the query's first batch left out by default (it
    starts Spark's executors and state stores once)."""
    rows = [b for b in beats if b.get("collect_ms") is not None and int(b.get("input_rows") or 0) > 0]
    if skip_first and rows:
        first = min(int(b["batch_id"]) for b in rows)
        rows = [b for b in rows if int(b["batch_id"]) != first]
    return SerialPart(
        batches=len(rows),
        traces=sum(int(b["input_rows"]) for b in rows),
        batch_s=sum(int(b["batch_duration_ms"] or 0) for b in rows) / 1000,
        job_s=sum(int(b["collect_ms"]) for b in rows) / 1000,
        driver_s=sum(int(b["driver_ms"] or 0) for b in rows) / 1000,
        driver_cpu_s=sum(int(b["driver_cpu_ms"] or 0) for b in rows) / 1000,
    )
