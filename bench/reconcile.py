"""Reconciliation at volume (not a test): one window of a synthetic archive reconciled at N and at 4N traces, against
issue 20's targets.

    .venv/bin/python bench/reconcile.py [--traces 1000000] [--growth 4] [--keep]

For each size the bench builds, straight as Parquet in the trace archive's layout and schema
(``hour=YYYY-MM-DD-HH/batch_id=N/part-0.parquet``, one batch a minute), hours of demo.orders traffic
(``config/registry.yaml``'s route: 5 hops) at a steady rate: the window's hour (at least ``--traces`` traces: a lost
message has one trace fewer and a duplicate one more, so the messages an hour are topped up until the window holds
that many) and the horizon's hours either side (two by default: five hours in all), as an hourly run reads them.
Each message is, by the bench's truth:

- delivered (5 traces);
- lost: demo-sink-store skipped it (no RECEIVED; the next read's back-pointer passes over it);
- late: demo-sink-store got it, its trace reached the trace topic 10-100 minutes later (another hour);
- duplicate: demo-sink-audit read it twice (a rewind: two RECEIVED traces at one offset);
- never judged: the detector was down (no verdict stored; it was delivered);

and a share of traces is archived twice (a replayed micro-batch: one trace, not a re-read). The store holds
what the detector said: every plain DELIVERED verdict in the verdict archive (by hour and batch, as the
detector's writer puts them), the exceptions as SQL rows in a SQLite store (LOST for the lost and the late,
DUPLICATE for the duplicates: the shapes :func:`khipu.detector.decide.decide` gives for them). Every group
has committed past every message.

The window is reconciled by :func:`khipu.reconcile.run.reconcile` (what ``spark/reconcile.py``, the hourly
DAG's job, runs) in a child process with a Spark session built as the job builds it (``local[*]``, Spark's
default 1 GiB driver heap, the DAG's submit settings), with the store's committed offsets standing in for the
broker (the bench has none: every group is past every message). Measured:

- traces/s: the window hour's traces / the seconds of the ``reconcile()`` call (Spark session already up);
  also the traces it read (the window's hour and the horizon's either side) per second;
- the Python driver's peak RSS (``VmHWM`` of the child process) and the Spark driver JVM's (``VmHWM`` of the
  ``java`` process under it; in ``local[*]`` it is the executor too), both read from /proc every 0.2 s until
  the child exits, and the JVM's peak heap used as Spark's own executor metrics report it (event log,
  polled every 200 ms);
- verdicts against the truth for every message of the window: the SQL rows and the verdict archive's,
  the SQL row winning per hop (:func:`khipu.verdicts.read.merged`'s rule, applied vectorised; a sample is
  read through :func:`khipu.verdicts.read.verdicts_of` too, which must agree).

Targets (2 CPUs), each printed beside its figure with "met" or "NOT met" (a figure without one says "(no target)"):
>= 75,000 traces/s (3x the detector's 25,000/s: an hour of 90 M traces in under 20 min); the hour itself, 90 M
in under 20 min, judged only by a run whose window held at least 90 M traces (a smaller run's figure for it is
extrapolated from its rate and says "not judged"); driver memory flat when
the window grows 4x (the Python driver's peak and the Spark driver JVM's peak RSS each within +10 %); verdicts exact
(a lost message CONFIRMED_LOST, as reconciliation leaves every loss of a window whose horizon has passed; a late
one DELIVERED or RETRACTED with evidence DELIVERED; a duplicate DUPLICATE; every other hop DELIVERED).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from figures import NO_TARGET, against, unjudged

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "config" / "registry.yaml"
STREAM = "demo.orders"
IN, OUT = "demo.orders", "demo.orders-enriched"
PRODUCER, ENRICHER, STORE_SINK, AUDIT_SINK = "demo-producer", "demo-enricher", "demo-sink-store", "demo-sink-audit"
PARTITIONS = 10
HOUR_MS = 3_600_000
MINUTE_MS = 60_000
TRACES_PER_MESSAGE = 5
TARGET_TRACES_S = 75_000
TARGET_HOUR_MIN = 20  # an hour of 90 M traces
HOUR_TRACES = 90_000_000  # an hour at the detector's 25,000 traces/s: the size the hour's target is about
FLAT_PERCENT = 10.0  # "flat": the 4x window's peak at most this much above the first's
DELIVERED, LOST, LATE, DUPLICATE, UNJUDGED = range(5)  # the bench's truth per message
KINDS = ("delivered", "lost", "late", "duplicate", "never judged")
# hops in route order: (location, type, topic, group, ms after the message's first trace)
HOPS = (
    (PRODUCER, "SENT", IN, None, 0),
    (ENRICHER, "RECEIVED", IN, ENRICHER, 5),
    (ENRICHER, "SENT", OUT, None, 10),
    (STORE_SINK, "RECEIVED", OUT, STORE_SINK, 20),
    (AUDIT_SINK, "RECEIVED", OUT, AUDIT_SINK, 30),
)
STORE_HOP, AUDIT_HOP = 3, 4
ARRIVAL_MS = 1  # a trace reaches the trace topic this long after it was made (its Kafka timestamp)
DECIDED_AFTER_MS = 3_000  # the detector decided a message this long after its first trace
REWIND_AFTER_MS = 5_000  # a duplicate's second read


# -- the synthetic traffic ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mix:
    lost: float
    late: float
    duplicate: float
    unjudged: float
    rearchived: float  # traces archived twice

    def kinds(self, rng: np.random.Generator, count: int) -> np.ndarray:
        draw = rng.random(count)
        kinds = np.full(count, DELIVERED, dtype=np.int8)
        edge = 0.0
        for kind, share in (
            (LOST, self.lost),
            (LATE, self.late),
            (DUPLICATE, self.duplicate),
            (UNJUDGED, self.unjudged),
        ):
            kinds[(draw >= edge) & (draw < edge + share)] = kind
            edge += share
        return kinds


def message_ids(prefix: str, numbers: np.ndarray) -> pa.Array:
    """Fixed-width ids ``<prefix><12 digits>`` built from bytes (no per-row Python)."""
    digits = 12
    head = np.frombuffer(prefix.encode(), dtype=np.uint8)
    powers = 10 ** np.arange(digits - 1, -1, -1, dtype=np.int64)
    body = ((numbers[:, None] // powers) % 10 + 48).astype(np.uint8)
    width = len(head) + digits
    data = np.empty((len(numbers), width), dtype=np.uint8)
    data[:, : len(head)] = head
    data[:, len(head) :] = body
    offsets = np.arange(0, (len(numbers) + 1) * width, width, dtype=np.int32)
    return pa.StringArray.from_buffers(len(numbers), pa.py_buffer(offsets), pa.py_buffer(data.tobytes()))


def hop_ids() -> list[str]:
    from khipu.registry.model import Hop, TopicRef

    hops = []
    for location, kind, topic, group, _ in HOPS:
        ref = TopicRef("local", topic)
        hops.append((Hop.write(location, ref) if kind == "SENT" else Hop.read(ref, group or "")).id)
    return hops


class Traffic:
    """The bench's messages: message number g (over the whole timeline) is first seen at ``t[g]``, written at
    partition g % 10, offset g // 10 of both topics, and is of kind ``kinds[g]``."""

    def __init__(self, first_ms: int, hours: int, per_hour: int, mix: Mix, seed: int, prefix: str) -> None:
        self.first_ms, self.per_hour, self.prefix = first_ms, per_hour, prefix
        count = hours * per_hour
        rng = np.random.default_rng(seed)
        self.t = first_ms + (np.arange(count, dtype=np.int64) * HOUR_MS) // per_hour  # steady, in order
        self.kinds = mix.kinds(rng, count)
        # a lost message's next read on the partition points past it: never two lost in a row on one partition
        after_lost = np.zeros(count, dtype=bool)
        after_lost[PARTITIONS:] = self.kinds[:-PARTITIONS] == LOST
        self.kinds[after_lost & (self.kinds == LOST)] = DELIVERED
        self.late_ms = rng.integers(10 * MINUTE_MS, 100 * MINUTE_MS, count, dtype=np.int64)
        self.rearchived = rng.random(count) < mix.rearchived
        self.after_lost = after_lost

    @property
    def count(self) -> int:
        return len(self.t)

    def window_traces(self, start_ms: int, end_ms: int) -> int:
        """The traces of the messages first seen in ``[start_ms, end_ms)``: five a message, a lost one's four, a
        duplicate's six (a trace archived twice is one trace)."""
        first_arrival = self.t + ARRIVAL_MS
        kinds = self.kinds[(first_arrival >= start_ms) & (first_arrival < end_ms)]
        return TRACES_PER_MESSAGE * len(kinds) - int((kinds == LOST).sum()) + int((kinds == DUPLICATE).sum())

    def traces(self, numbers: np.ndarray) -> pa.Table:
        """Every trace of these messages (vectorised; the late ones at their late arrival)."""
        kinds, t = self.kinds[numbers], self.t[numbers]
        ids = message_ids(self.prefix, numbers)
        partition, offset = (numbers % PARTITIONS).astype(np.int32), numbers // PARTITIONS
        parts = []
        for hop_no, (location, kind, topic, group, delay) in enumerate(HOPS):
            keep = np.ones(len(numbers), dtype=bool)
            if hop_no == STORE_HOP:
                keep = kinds != LOST
            made = t + delay
            arrived = made + ARRIVAL_MS
            if hop_no == STORE_HOP:
                arrived = np.where(kinds == LATE, made + self.late_ms[numbers], arrived)
            reads = [(keep, made, arrived, 0)]
            if hop_no == AUDIT_HOP:
                rewind = kinds == DUPLICATE
                reads.append((rewind, made + REWIND_AFTER_MS, made + REWIND_AFTER_MS + ARRIVAL_MS, 1))
            for mask, made_ms, arrived_ms, again in reads:
                index = np.flatnonzero(mask)
                prev: pa.Array
                if kind == "RECEIVED":  # the emitter's previous read on the partition (none after a skipped one)
                    back = offset[index] - 1
                    skipped = (back < 0) | (self.after_lost[numbers[index]] if hop_no == STORE_HOP else False)
                    flat = pa.array(back[~skipped], pa.int64())
                    lengths = np.where(skipped, 0, 1).astype(np.int32)
                    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
                    prev = pa.ListArray.from_arrays(pa.array(offsets), flat)
                else:
                    prev = pa.nulls(len(index), pa.list_(pa.int64()))
                n = len(index)
                parts.append(
                    pa.table(
                        {
                            "message_id": ids.take(pa.array(index)),
                            "stream": pa.array(np.full(n, STREAM, dtype=object), pa.string()),
                            "location": pa.array(np.full(n, location, dtype=object), pa.string()),
                            "cluster": pa.array(np.full(n, "local", dtype=object), pa.string()),
                            "type": pa.array(np.full(n, kind, dtype=object), pa.string()),
                            "timestamp_ms": pa.array(made_ms[index], pa.int64()),
                            "topic": pa.array(np.full(n, topic, dtype=object), pa.string()),
                            "partition": pa.array(partition[index], pa.int32()),
                            "offset": pa.array(offset[index], pa.int64()),
                            "group": pa.array(np.full(n, group, dtype=object), pa.string()),
                            "emitter_id": pa.array(np.full(n, f"{location}-bench", dtype=object), pa.string()),
                            "emitter_seq": pa.array(numbers[index] * 4 + hop_no % 2 + 2 * again, pa.int64()),
                            "sampling_percent": pa.array(np.full(n, 100.0)),
                            "attributes": pa.nulls(n, pa.string()),
                            "prev_offsets": prev,
                            "key_hash": pa.nulls(n, pa.string()),
                            "tombstone": pa.array(np.zeros(n, dtype=bool)),
                            "transactional": pa.array(np.zeros(n, dtype=bool)),
                            "read_uncommitted": pa.array(np.zeros(n, dtype=bool)),
                            "kafka_timestamp_ms": pa.array(arrived_ms[index], pa.int64()),
                        }
                    )
                )
        return pa.concat_tables(parts)


def window_traffic(traces: int, first_ms: int, hours: int, window_ms: int, mix: Mix, seed: int) -> Traffic:
    """The bench's traffic, its window hour (from ``window_ms``) holding at least ``traces`` traces: the messages an
    hour are topped up by the shortfall and a margin (a few standard deviations of the lost and duplicated ones'
    count) until it does."""
    per_hour = -(-traces // TRACES_PER_MESSAGE)
    while True:
        traffic = Traffic(first_ms, hours, per_hour, mix, seed, "rb-")
        short = traces - traffic.window_traces(window_ms, window_ms + HOUR_MS)
        if short <= 0:
            return traffic
        del traffic  # at the full size it is gigabytes: one at a time
        per_hour += -(-short // (TRACES_PER_MESSAGE - 1)) + int(3 * (per_hour * (mix.lost + mix.duplicate)) ** 0.5)


def build_archive(traffic: Traffic, archive: Path, chunk: int = 200_000) -> tuple[int, int]:
    """Write every trace as the detector's archive does: one batch a minute, by the hour each trace arrived;
    a late trace lands in the batch of the minute it arrived. Returns (traces written, files)."""
    from khipu.trace.archive import SCHEMA, hour_folder

    written, files = 0, 0
    pending: dict[int, list[pa.Table]] = {}  # batch (minute since the first) -> tables not written yet
    base = traffic.first_ms

    def flush(upto: int | None) -> None:
        nonlocal written, files
        for batch in sorted(b for b in pending if upto is None or b < upto):
            table = pa.concat_tables(pending.pop(batch)).cast(SCHEMA)
            hours = pc.divide(table.column("kafka_timestamp_ms"), HOUR_MS)
            for hour in pc.unique(hours).to_pylist():
                folder = archive / hour_folder(hour * HOUR_MS) / f"batch_id={batch}"
                folder.mkdir(parents=True, exist_ok=True)
                part = table.filter(pc.equal(hours, hour))
                pq.write_table(part, folder / "part-0.parquet", compression="zstd")
                written, files = written + part.num_rows, files + 1

    for start in range(0, traffic.count, chunk):
        numbers = np.arange(start, min(start + chunk, traffic.count), dtype=np.int64)
        table = traffic.traces(numbers)
        tables = [(table, 0)]
        again = traffic.rearchived[numbers]
        if again.any():  # a replayed batch: the same traces archived again, a few batches later
            ids = message_ids(traffic.prefix, numbers[again])
            tables.append((table.filter(pc.is_in(table.column("message_id"), ids)), 7))
        for part, later in tables:
            batches = pc.divide(pc.subtract(part.column("kafka_timestamp_ms"), base), MINUTE_MS).to_numpy() + later
            for batch in np.unique(batches):
                pending.setdefault(int(batch), []).append(part.filter(pa.array(batches == batch)))
        flush(int((traffic.t[numbers[-1]] - base) // MINUTE_MS))
        print(f"\r  archive: {numbers[-1] + 1:,} of {traffic.count:,} messages", end="", flush=True)
    flush(None)
    print()
    return written, files


# -- what the detector said -------------------------------------------------------------------------------------


def templates(hops: list[str]) -> dict[int, list[dict[str, Any]]]:
    """Per kind, the verdicts the detector gives a message of that kind (its own rules on one message's traces,
    first seen at 0, every group past it): the shapes the bench's stored verdicts are copied from."""
    from khipu.detector.decide import decide
    from khipu.detector.model import DetectorConfig
    from khipu.reconcile.window import _PassedLongAgo
    from khipu.registry import load_registry
    from khipu.trace.model import trace_from_columns
    from khipu.verdicts.book import verdict_row

    stream = load_registry(REGISTRY).stream(STREAM)
    traffic = Traffic(0, 1, 1000, Mix(0, 0, 0, 0, 0), 0, "template-")
    found = {}
    for kind in (DELIVERED, LOST, LATE, DUPLICATE):
        traffic.kinds[:] = kind
        traffic.after_lost[:] = False
        rows = traffic.traces(np.array([PARTITIONS * 5], dtype=np.int64)).to_pylist()
        if kind == LATE:  # the detector decided before the late trace came
            rows = [r for r in rows if r["location"] != STORE_SINK]
        traces = [trace_from_columns(r) for r in rows]
        first = min(t.timestamp_ms for t in traces)
        decision = decide(
            traces[0].message_id,
            stream,
            traces,
            PassedEverything(),
            _PassedLongAgo(first),  # the detector's memo: every group passed it long ago (the grace is over)
            first,
            first + 600_000,
            DetectorConfig(),
            read_to_ms=first + 600_000,
        )
        by_hop = {v.hop: verdict_row(v) for v in decision.verdicts}
        found[kind] = [by_hop[hop] for hop in hops]
    return found


def verdict_columns(template: dict[str, Any], traffic: Traffic, numbers: np.ndarray) -> dict[str, pa.Array]:
    """The template's verdict for these messages: their ids, positions and times."""
    from khipu.verdicts.archive import SCHEMA

    n, t = len(numbers), traffic.t[numbers]
    shift = t - int(template["first_seen_ms"])
    columns: dict[str, pa.Array] = {}
    for field in SCHEMA:
        name = field.name
        value = template.get("group" if name == "group_id" else name)
        if name == "message_id":
            columns[name] = message_ids(traffic.prefix, numbers)
        elif name == "partition":
            columns[name] = pa.array((numbers % PARTITIONS).astype(np.int32))
        elif name == "offset":
            columns[name] = pa.array(numbers // PARTITIONS)
        elif name in ("observed_ms", "first_seen_ms") and value is not None:
            columns[name] = pa.array(shift + int(value))
        elif name == "decided_ms":
            columns[name] = pa.array(t + DECIDED_AFTER_MS)
        elif name == "late_evidence":
            columns[name] = pa.array(np.zeros(n, dtype=bool))
        else:
            columns[name] = pa.repeat(pa.scalar(value, field.type), n)
    return columns


def build_verdicts(traffic: Traffic, verdict_root: Path, store_url: str, hops: list[str]) -> tuple[int, int]:
    """The detector's verdicts: plain DELIVERED ones in the verdict archive (a batch a minute, by the hour
    decided), the others SQL rows. Returns (archived, SQL rows)."""
    from sqlalchemy import insert

    from khipu.store import Store
    from khipu.store import schema as store_schema
    from khipu.verdicts.archive import SCHEMA, VerdictArchive

    shapes = templates(hops)
    store = Store(store_url)
    store.migrate()
    archive = VerdictArchive(verdict_root, store)
    judged = np.flatnonzero(traffic.kinds != UNJUDGED)
    minutes = (traffic.t[judged] + DECIDED_AFTER_MS - traffic.first_ms) // MINUTE_MS
    archived, sql_rows = 0, []
    bounds = np.flatnonzero(np.diff(minutes)) + 1
    for numbers in np.split(judged, bounds):
        if not len(numbers):
            continue
        tables = []
        for kind in (DELIVERED, LOST, LATE, DUPLICATE):
            mine = numbers[traffic.kinds[numbers] == kind]
            if not len(mine):
                continue
            for template in shapes[kind]:
                table = pa.table(verdict_columns(template, traffic, mine), schema=SCHEMA)
                if template["verdict"] == "DELIVERED" and not template["late_evidence"]:
                    tables.append(table)
                else:
                    sql_rows.extend(table.to_pylist())  # the few exceptions
        batch = int((traffic.t[numbers[0]] + DECIDED_AFTER_MS - traffic.first_ms) // MINUTE_MS)
        table = pa.concat_tables(tables)
        archive.write_batch(batch, table)
        archived += table.num_rows
    archive.close()
    try:
        with store.engine.begin() as tx:
            for start in range(0, len(sql_rows), 10_000):
                tx.execute(insert(store_schema.verdicts), sql_rows[start : start + 10_000])
    finally:
        store.close()
    return archived, len(sql_rows)


# -- the run (a child process, measured from outside) -------------------------------------------------------------


class PassedEverything:
    """Committed offsets as the bench set them: every group past every message."""

    def __call__(self, cluster: str, group: str, topic: str, partition: int) -> int | None:
        return 10**12


def child(config: dict[str, Any]) -> int:
    """Reconcile the window as ``spark/reconcile.py`` does (its Spark settings and the DAG's), print the report."""
    from pyspark.sql import SparkSession

    from khipu.detector.decide import Lookups
    from khipu.detector.launch import driver_settings
    from khipu.detector.model import DetectorConfig
    from khipu.reconcile.run import SPARK_SETTINGS, reconcile
    from khipu.reconcile.window import ReconcileWindow
    from khipu.registry import load_registry
    from khipu.store import Store
    from khipu.verdicts.book import VerdictBook

    builder = SparkSession.builder.appName("khipu-reconcile-bench").master("local[*]")
    settings = {
        **driver_settings("local[*]"),
        **SPARK_SETTINGS,  # as spark/reconcile.py builds its session
        "spark.ui.enabled": "false",  # as the DAG submits it
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        "spark.eventLog.enabled": "true",  # for the JVM's own heap figures
        "spark.eventLog.dir": f"file://{config['event_log']}",
        "spark.eventLog.logStageExecutorMetrics": "true",
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
        "spark.executor.metrics.pollingInterval": "200ms",
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    store = Store(config["store_url"])
    try:
        started = time.monotonic()
        profiler = cProfile.Profile() if config.get("profile") else None
        if profiler is not None:
            profiler.enable()
        report = reconcile(
            spark,
            Path(config["archive"]),
            ReconcileWindow(config["start_ms"], config["end_ms"], config["horizon_ms"]),
            load_registry(REGISTRY),
            VerdictBook(store.verdicts),
            Lookups(PassedEverything()),
            DetectorConfig(),
            config["now_ms"],
            progress=lambda line: print(f"    reconcile: {time.monotonic() - started:6.1f} s: {line}", flush=True),
            verdict_archive_dir=Path(config["verdict_archive"]),
            chunk_messages=config["chunk_messages"],
        )
        seconds = time.monotonic() - started
        if profiler is not None:  # the Python driver's own time (Spark's work shows as waits on py4j)
            profiler.disable()
            profiler.dump_stats(config["profile"])
            pstats.Stats(config["profile"]).sort_stats("cumulative").print_stats(30)
        summary = report.summary()
        result = {
            key: summary[key]
            for key in ("traces_read", "window_messages", "redecided", "chunks", "changes", "changes_by_kind")
        }
        result.update(seconds=seconds, leads=len(report.leads), chunk_messages=config["chunk_messages"])
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        store.close()
        spark.stop()
    return 0


def _status_kib(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found.extend(children)
            todo.extend(children)
    return found


class PeakMemory(threading.Thread):
    """Polls /proc every 0.2 s: the peak RSS (VmHWM) of the child (the Python driver) and of the java process
    under it (the Spark driver JVM)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.python_kib, self.jvm_kib, self.done = pid, 0, 0, False

    def run(self) -> None:
        while not self.done:
            self.python_kib = max(self.python_kib, _status_kib(self.pid, "VmHWM") or 0)
            for pid in _descendants(self.pid):
                try:
                    name = Path(f"/proc/{pid}/comm").read_text().strip()
                except OSError:
                    continue
                if name == "java":
                    self.jvm_kib = max(self.jvm_kib, _status_kib(pid, "VmHWM") or 0)
            time.sleep(0.2)


def jvm_heap_peak_bytes(event_log: Path) -> int | None:
    """The Spark driver's peak JVM heap used, from the executor metrics its event log holds."""
    peak = None
    for path in (p for p in event_log.rglob("*") if p.is_file()):
        for line in path.read_text().splitlines():
            if "Executor Metrics" not in line:
                continue
            event = json.loads(line)  # in local[*] the driver runs the tasks: every figure is the driver JVM's
            metrics = event.get("Executor Metrics") or event.get("Task Executor Metrics") or {}
            heap = metrics.get("JVMHeapMemory")
            if heap is not None:
                peak = heap if peak is None else max(peak, heap)
    return peak


def task_cpu_seconds(event_log: Path) -> float:
    """The CPU time every Spark task used (the event log's task metrics): the work, whatever else shares the CPUs."""
    total = 0.0
    for path in (p for p in event_log.rglob("*") if p.is_file()):
        for line in path.read_text().splitlines():
            if '"SparkListenerTaskEnd"' in line:
                total += (json.loads(line).get("Task Metrics") or {}).get("Executor CPU Time", 0) / 1e9
    return total


def slowest_jobs(event_log: Path, count: int = 6) -> list[str]:
    """The Spark jobs that took longest, with where in the code they were started and their CPU time (a
    profile of the run: wall time on a shared machine is more than the CPU the tasks used)."""
    jobs: dict[int, list[Any]] = {}
    stage_cpu: dict[int, float] = {}
    for path in (p for p in event_log.rglob("*") if p.is_file()):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            kind = event["Event"]
            if kind == "SparkListenerJobStart":
                site = event.get("Properties", {}).get("callSite.short", "") or "?"
                jobs[event["Job ID"]] = [event["Submission Time"], 0, site, event["Stage IDs"]]
            elif kind == "SparkListenerJobEnd" and event["Job ID"] in jobs:
                jobs[event["Job ID"]][1] = event["Completion Time"]
            elif kind == "SparkListenerTaskEnd":
                cpu = (event.get("Task Metrics") or {}).get("Executor CPU Time", 0) / 1e9
                stage_cpu[event["Stage ID"]] = stage_cpu.get(event["Stage ID"], 0.0) + cpu
    ranked = sorted(jobs.values(), key=lambda j: j[0] - j[1])[:count]
    total = sum(stage_cpu.values())
    return [f"{len(jobs)} jobs, {total:.1f} s task CPU in all"] + [
        f"{(end - begin) / 1000:6.1f} s wall, {sum(stage_cpu.get(s, 0.0) for s in stages):6.1f} s task CPU: {site}"
        for begin, end, site, stages in ranked
    ]


# -- the verdicts against the truth -------------------------------------------------------------------------------


def check_verdicts(
    traffic: Traffic, window: tuple[int, int], store_url: str, verdict_root: Path, hops: list[str]
) -> dict[str, Any]:
    """Every window message's verdicts (SQL winning per hop over the verdict archive) against the truth."""
    from khipu.store import Store
    from khipu.verdicts.archive import VerdictArchive
    from khipu.verdicts.read import verdicts_of

    codes = {"DELIVERED": 1, "LOST": 2, "CONFIRMED_LOST": 3, "DUPLICATE": 4, "RETRACTED": 5}
    width = len(traffic.prefix)
    found = np.zeros((traffic.count, len(hops)), dtype=np.int8)
    evidence_delivered = np.zeros((traffic.count, len(hops)), dtype=bool)

    def place(table: pa.Table) -> None:
        numbers = pc.cast(pc.utf8_slice_codeunits(table.column("message_id"), width), pa.int64()).to_numpy()
        hop = pc.index_in(table.column("hop"), pa.array(hops)).to_numpy(zero_copy_only=False).astype(np.int64)
        code = pc.fill_null(pc.add(pc.index_in(table.column("verdict"), pa.array(list(codes))), 1), 9)
        found[numbers, hop] = code.to_numpy().astype(np.int8)
        delivered = pc.fill_null(pc.equal(table.column("evidence_kind"), "DELIVERED"), False)
        evidence_delivered[numbers, hop] = delivered.to_numpy(zero_copy_only=False)

    columns = ["message_id", "hop", "verdict", "evidence_kind"]
    archived = ds.dataset(str(verdict_root), format="parquet", partitioning="hive", exclude_invalid_files=True)
    for batch in archived.to_batches(columns=columns):  # a batch at a time: the full size's archive is 450 M rows
        place(pa.Table.from_batches([batch]))
    with sqlite3.connect(store_url.removeprefix("sqlite:///")) as db:
        rows = db.execute("SELECT message_id, hop, verdict, evidence_kind FROM verdicts").fetchall()
    if rows:
        place(pa.table({name: [r[i] for r in rows] for i, name in enumerate(columns)}))  # SQL wins: placed last
    first_arrival = traffic.t + ARRIVAL_MS
    mine = np.flatnonzero((first_arrival >= window[0]) & (first_arrival < window[1]))
    kinds = traffic.kinds[mine]
    got = found[mine]
    expect_delivered = got == 1
    ok = expect_delivered.copy()
    store, audit = got[:, STORE_HOP], got[:, AUDIT_HOP]
    late_ok = (store == 1) | ((store == 5) & evidence_delivered[mine, STORE_HOP])
    # after reconciliation a loss is confirmed: a plain LOST (the detector's provisional verdict) is not exact
    ok[:, STORE_HOP] = np.select([kinds == LOST, kinds == LATE], [store == 3, late_ok], ok[:, STORE_HOP])
    ok[:, AUDIT_HOP] = np.where(kinds == DUPLICATE, audit == 4, ok[:, AUDIT_HOP])
    wrong = ~ok.all(axis=1)
    per_kind = {}
    for kind, name in enumerate(KINDS):
        of_kind = kinds == kind
        per_kind[name] = (int(of_kind.sum()), int((wrong & of_kind).sum()))
    confirmed = int(((kinds == LOST) & (store == 3)).sum())
    still_lost = int(((kinds == LOST) & (store == 2)).sum())
    retracted = int(((kinds == LATE) & (store == 5)).sum())
    examples = [f"{traffic.prefix}{n:012d}" for n in mine[wrong][:5]]
    # a sample read through the product's reader (SQL rows + archive, SQL winning) must say the same
    sample = sorted(mine[random.Random(1).sample(range(len(mine)), min(200, len(mine)))])
    store_ = Store(store_url)
    try:
        hours = sorted(p.name.removeprefix("hour=") for p in verdict_root.glob("hour=*"))
        read = verdicts_of(
            store_.verdicts, VerdictArchive(verdict_root, store_), [f"{traffic.prefix}{n:012d}" for n in sample], hours
        )
    finally:
        store_.close()
    disagree = sum(
        1
        for row in read.rows
        if found[int(row["message_id"][width:]), hops.index(row["hop"])] != codes.get(row["verdict"], 9)
    )
    return {
        "messages": len(mine),
        "wrong": int(wrong.sum()),
        "per_kind": per_kind,
        "confirmed": confirmed,
        "still_lost": still_lost,
        "retracted": retracted,
        "examples": examples,
        "sample": len(sample),
        "sample_disagree": disagree,
    }


# -- one size ------------------------------------------------------------------------------------------------------


def run_size(traces: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    hops = hop_ids()
    horizon_h = args.horizon_ms // HOUR_MS
    now_ms = int(time.time() * 1000)
    window_start = (now_ms // HOUR_MS - 1 - horizon_h) * HOUR_MS  # its horizon ended at the current hour's start
    first_ms = window_start - horizon_h * HOUR_MS
    mix = Mix(args.lost, args.late, args.duplicates, args.unjudged, args.rearchived)
    folder = work / f"size-{traces}"
    archive, verdicts, store_url = folder / "archive", folder / "verdicts", f"sqlite:///{folder / 'khipu.db'}"
    folder.mkdir(parents=True)
    started = time.monotonic()
    traffic = window_traffic(traces, first_ms, 2 * horizon_h + 1, window_start, mix, args.seed)
    written, files = build_archive(traffic, archive)
    archived, sql_rows = build_verdicts(traffic, verdicts, store_url, hops)
    build_s = time.monotonic() - started
    size_gb = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e9
    print(f"  built {written:,} traces in {files:,} files ({2 * horizon_h + 1} hours), {archived:,} archived verdicts, "
          f"{sql_rows:,} SQL rows, {size_gb:.2f} GB, in {build_s:.0f} s", flush=True)  # fmt: skip

    event_log = folder / "events"
    event_log.mkdir()
    config = {
        "archive": str(archive),
        "verdict_archive": str(verdicts),
        "store_url": store_url,
        "start_ms": window_start,
        "end_ms": window_start + HOUR_MS,
        "horizon_ms": args.horizon_ms,
        "now_ms": int(time.time() * 1000),
        "event_log": str(event_log),
        "profile": str(args.profile.with_suffix(f".{traces}.prof")) if args.profile else None,
        "chunk_messages": args.chunk_messages,
    }
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(config)], env=env,
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    memory = PeakMemory(process.pid)
    memory.start()
    result: dict[str, Any] = {}
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("RESULT "):
            result = json.loads(line.removeprefix("RESULT "))
        elif args.progress or "reconcile:" in line:
            print(line, end="", flush=True)
    code = process.wait()
    memory.done = True
    memory.join()
    child_s = time.monotonic() - started
    if code or not result:
        raise SystemExit(f"the reconciliation child failed (exit {code})")
    window_traces = traffic.window_traces(window_start, window_start + HOUR_MS)
    print(f"  reconcile() took {result['seconds']:.1f} s; checking every window message's verdicts against the "
          "truth", flush=True)  # fmt: skip
    check = check_verdicts(traffic, (window_start, window_start + HOUR_MS), store_url, verdicts, hops)
    result.update(
        window_traces=window_traces,
        child_s=child_s,
        python_mib=memory.python_kib / 1024,
        jvm_rss_mib=memory.jvm_kib / 1024,
        jvm_heap_mib=(jvm_heap_peak_bytes(event_log) or 0) / 2**20,
        slowest=slowest_jobs(event_log),
        task_cpu_s=task_cpu_seconds(event_log),
        check=check,
        build_s=build_s,
        hours_built=2 * horizon_h + 1,
        disk_gb=size_gb,
    )
    return result


def report(traces: int, r: dict[str, Any]) -> None:
    rate = r["window_traces"] / r["seconds"]
    check = r["check"]
    print(f"  {r['window_traces']:,} traces in the window hour (asked for at least {traces:,}):")
    print(f"    reconcile() {r['seconds']:.1f} s (child process {r['child_s']:.1f} s with Spark's start and stop): "
          f"{rate:,.0f} window traces/s -> {against(f'>= {TARGET_TRACES_S:,} /s', rate >= TARGET_TRACES_S)}; "
          f"{r['traces_read'] / r['seconds']:,.0f} traces read/s ({r['traces_read']:,} read, {r['hours_built']} "
          f"hours) -> {NO_TARGET}")  # fmt: skip
    print(f"    {hour_of_90m(r['window_traces'], r['seconds'])}")
    cpus = os.cpu_count() or 1
    print(f"    Spark tasks used {r['task_cpu_s']:.0f} s of CPU: {r['window_traces'] / (r['task_cpu_s'] / cpus):,.0f} "
          f"window traces/s if they had all {cpus} CPUs to themselves (the driver's own work not counted) -> "
          f"{NO_TARGET}")  # fmt: skip
    print(f"    {r['window_messages']:,} window messages, {r['redecided']:,} re-decided in {r['chunks']} chunk(s) "
          f"of at most {r['chunk_messages']:,}, {r['changes']:,} changed "
          f"{r['changes_by_kind']}, {r['leads']} lead(s)")  # fmt: skip
    print(f"    peak memory: Python driver VmHWM {r['python_mib']:,.0f} MiB; Spark driver JVM VmHWM "
          f"{r['jvm_rss_mib']:,.0f} MiB, heap used {r['jvm_heap_mib']:,.0f} MiB (Spark executor metrics) -> "
          f"{NO_TARGET} at one size (the target is how they grow with the window: below)")  # fmt: skip
    print(f"    Spark: {r['slowest'][0]}; the slowest jobs:" + "".join(f"\n      {line}" for line in r["slowest"][1:]))
    kinds = ", ".join(f"{name} {n:,} ({bad:,} wrong)" for name, (n, bad) in check["per_kind"].items())
    exact = not check["wrong"] and not check["sample_disagree"]
    print(f"    verdicts: {check['messages']:,} window messages, {check['wrong']:,} wrong: {kinds}; "
          f"{check['confirmed']:,} CONFIRMED_LOST, {check['still_lost']:,} lost still plain LOST (wrong), "
          f"{check['retracted']:,} RETRACTED; sample of {check['sample']} through verdicts_of: "
          f"{check['sample_disagree']} disagree -> {against('exact', exact)}")  # fmt: skip
    if check["examples"]:
        print(f"    e.g. wrong: {check['examples']}")


def hour_of_90m(window_traces: int, seconds: float) -> str:
    """The hour's target, judged only when the window held at least ``HOUR_TRACES`` traces: then ``reconcile()``'s
    own time is the hour's (or more). A smaller run's figure is its rate carried over to 90 M, not judged."""
    target = f"an hour of {HOUR_TRACES / 1e6:g} M traces in < {TARGET_HOUR_MIN} min"
    if window_traces >= HOUR_TRACES:
        minutes = seconds / 60
        return (f"the hour itself: {window_traces:,} window traces reconciled in {minutes:.1f} min -> "
                f"{against(target, minutes < TARGET_HOUR_MIN)}")  # fmt: skip
    extrapolated = HOUR_TRACES / (window_traces / seconds) / 60
    return (f"an hour of {HOUR_TRACES / 1e6:g} M traces at this run's rate: {extrapolated:.1f} min, extrapolated -> "
            f"{unjudged(target, f'extrapolated from {window_traces:,} traces')}")  # fmt: skip


def main() -> int:
    from khipu.reconcile.run import CHUNK_MESSAGES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=int, default=1_000_000, help="traces in the window's hour (N): at least")
    parser.add_argument("--growth", type=int, default=4, help="the second run's window holds this many times N")
    parser.add_argument("--only-n", action="store_true", help="run N only (no growth run)")
    parser.add_argument("--horizon-ms", type=int, default=2 * HOUR_MS, help="whole hours; default 2 h")
    parser.add_argument("--lost", type=float, default=0.002)
    parser.add_argument("--late", type=float, default=0.002)
    parser.add_argument("--duplicates", type=float, default=0.002)
    parser.add_argument("--unjudged", type=float, default=0.001, help="messages the detector never judged")
    parser.add_argument("--rearchived", type=float, default=0.001, help="messages whose traces are archived twice")
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--work", type=Path, default=None, help="where to build (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the built archives")
    parser.add_argument("--progress", action="store_true", help="show the child's whole output")
    chunk_help = f"exceptions the driver holds and judges at a time (the job's: {CHUNK_MESSAGES:,})"
    parser.add_argument("--chunk-messages", type=int, default=CHUNK_MESSAGES, help=chunk_help)
    parser.add_argument("--profile", type=Path, help="cProfile the driver's reconcile() into FILE.<size>.prof")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))
    if args.horizon_ms % HOUR_MS or args.horizon_ms <= 0:
        parser.error("--horizon-ms: whole hours, e.g. 7200000")
    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)  # the bench's own folder is made inside it
    work = Path(tempfile.mkdtemp(prefix="khipu-reconcile-bench-", dir=args.work))
    sizes = [args.traces] if args.only_n else [args.traces, args.traces * args.growth]
    listed = ", ".join(f"{s:,}" for s in sizes)
    print(f"reconcile bench: {os.cpu_count()} CPUs, sizes {listed} traces per window hour, "
          f"horizon {args.horizon_ms // HOUR_MS} h; lost {args.lost:.1%}, late {args.late:.1%}, duplicates "
          f"{args.duplicates:.1%}, never judged {args.unjudged:.1%}, archived twice {args.rearchived:.1%}",
          flush=True)  # fmt: skip
    results = {}
    try:
        for traces in sizes:
            print(f"size {traces:,}:", flush=True)
            results[traces] = run_size(traces, args, work)
            report(traces, results[traces])
            if not args.keep:
                shutil.rmtree(work / f"size-{traces}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    if len(results) == 2:
        small, large = (results[s] for s in sizes)
        flat = f"flat, within +{FLAT_PERCENT:g} %"
        python, jvm = large["python_mib"] / small["python_mib"], large["jvm_rss_mib"] / max(small["jvm_rss_mib"], 1)
        print(f"growth x{args.growth}: time x{large['seconds'] / small['seconds']:.2f} -> {NO_TARGET}")
        print(f"growth x{args.growth}: Python driver peak x{python:.2f} ({small['python_mib']:,.0f} -> "
              f"{large['python_mib']:,.0f} MiB) -> {against(flat, python <= 1 + FLAT_PERCENT / 100)}")  # fmt: skip
        print(f"growth x{args.growth}: Spark driver JVM peak RSS x{jvm:.2f} ({small['jvm_rss_mib']:,.0f} -> "
              f"{large['jvm_rss_mib']:,.0f} MiB) -> {against(flat, jvm <= 1 + FLAT_PERCENT / 100)}; its heap peak "
              f"x{large['jvm_heap_mib'] / max(small['jvm_heap_mib'], 1):.2f} ({small['jvm_heap_mib']:,.0f} -> "
              f"{large['jvm_heap_mib']:,.0f} MiB) -> {NO_TARGET} (the heap fills up to its maximum before it is "
              "collected)")  # fmt: skip
    else:
        print("growth: not measured (--only-n: one size) -> the target of driver memory flat in the window's size "
              "is not judged by this run", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
