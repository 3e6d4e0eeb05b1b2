"""Soak (not a test; issue 20 §3): the production detector under steady live traffic for an hour, on demand.

    .venv/bin/python bench/soak.py [--rate 10000] [--minutes 60] [--every-min 5] [--keep]

Demo-shaped messages (5 hops, ``config/registry.yaml``'s demo.orders; bench/detector.py's traces) are written
to a trace topic of the bench's own broker at ``--rate`` traces/s, the groups committing a second behind and
the slow group (demo-sink-audit) ``--hold-s`` behind on 10 % of them, as in bench/detector.py's live part.
About one message in ``--lost-every`` is skipped by demo-sink-store (its RECEIVED trace never written, its
emitter numbering and pointing past it as a consumer that skipped it would: LOST, skipped by consumer) and
one in ``--duplicate-every`` is read twice by demo-enricher (a replaying consumer of its own:
DUPLICATE, rewind/replay). The detector is ``spark/detector.py`` in a process of its own, every setting
its production default (``local[*]``, Spark's default driver memory unless ``--driver-memory``).

At every interval and at the end it prints three tables, one row per interval (each print repeats the
earlier rows, figures that settle later filled in): memory (the driver JVM's heap from ``jstat -gc``, the
JVM's and the Python processes' resident memory from /proc), disk (bytes added per hour of the interval and per
trace / verdict), and LOST latency with verdict exactness. Every verdict, the SQL store's and the verdict
archive's (SQL winning per hop, as :mod:`khipu.verdicts.read`), each as it says (kind, cause, a duplicate's
count), is compared with what the bench did to each message; a verdict of no (message, hop) the bench wrote is
counted as extra. Targets, after the first interval (the warm-up), each printed with "met" or "NOT met": LOST
p95 <= 15 s in every interval (a loss not seen LOST within 180 s of its commit counts as infinitely late, whether
seen later or never: ``figures.lost_latencies``, bench/detector.py's rule too; the run waits out the last losses'
180 s before its last report), every loss seen LOST and no LOST of a message the bench did not lose; memory flat
(the last interval of steady traffic within +10 % of the first); 0 mismatches and 0 extra verdicts.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from confluent_kafka import Consumer, TopicPartition

from detector import (  # bench/detector.py: the same messages, producer and commits as its live part
    AUDIT_SINK,
    ENRICHER,
    GROUPS,
    HOPS,
    IN,
    LOST_P95_TARGET_S,
    OUT,
    PARTITIONS,
    REGISTRY,
    ROOT,
    STORE_SINK,
    TRACE_PARTITIONS,
    first_offsets,
    held,
    job_for,
    new_producer,
    send,
    traces_of,
    wait_for,
)
from figures import LOST_DEADLINE_S, NO_TARGET, LostLatencies, against, lost_latencies, seconds, unjudged
from khipu.detector.job import DETECTOR_QUERY, DetectorJob
from khipu.kafka import KafkaAdmin, KafkaConnection
from khipu.localstack.broker import BrokerSpec, start_broker
from khipu.localstack.processes import stop_process_group
from khipu.retention.usage import folder_bytes
from khipu.store import Store
from khipu.trace import Trace, TraceType
from khipu.verdicts.archive import SCHEMA as ARCHIVE_SCHEMA
from khipu.verdicts.archive import VerdictArchive

RUN = "sk"  # message ids sk-000000000, sk-000000001, ...
STREAM = "demo.orders"
MIB = 1024 * 1024
# hop index of a verdict by (topic, group): the order traces_of writes them in
HOP_INDEX = {(IN, None): 0, (IN, ENRICHER): 1, (OUT, None): 2, (OUT, STORE_SINK): 3, (OUT, AUDIT_SINK): 4}
LOST_HOP, DUPLICATE_HOP = 3, 1  # demo-sink-store's read skips; demo-enricher's read replays
# code -> what a verdict says: kind, cause, a duplicate's reads (0: no verdict); others are added as seen
KINDS = ["", "DELIVERED", "LOST/skipped_by_consumer", "DUPLICATE/rewind_replay x2"]
MEMORY_GROWTH_LIMIT_PERCENT = 10.0  # "flat": the last steady interval's figure at most this much above the first's


# -- the traffic (a process of its own) --------------------------------------------------------------------------


def lost(message: int, every: int) -> bool:
    """demo-sink-store skips this message (never receives it, commits past it)."""
    return every > 0 and message % every == 7


def duplicated(message: int, every: int) -> bool:
    """demo-enricher reads this message twice (a consumer replaying it)."""
    return every > 0 and message % every == 13


class Emitters:
    """Numbers traces as the emitters that wrote them would: each emitter's ``emitter_seq`` without holes and each
    RECEIVED trace pointing back at that emitter's previous three RECEIVED offsets on the partition, whatever
    the bench left out (a skipped record is neither numbered nor pointed at) or added (a replayed read)."""

    def __init__(self) -> None:
        self.seq: dict[str, int] = {}
        self.back: dict[tuple[str, int], deque[int]] = {}

    def number(self, traces: Iterable[Trace]) -> Iterator[Trace]:
        for trace in traces:
            seq = self.seq.get(trace.emitter_id, 0)
            self.seq[trace.emitter_id] = seq + 1
            if trace.type is not TraceType.RECEIVED:
                yield trace._replace(emitter_seq=seq)
                continue
            back = self.back.setdefault((trace.emitter_id, trace.partition), deque(maxlen=3))
            yield trace._replace(emitter_seq=seq, prev_offsets=tuple(back))
            back.appendleft(trace.offset)


def message_traces(message: int, clock: int, args: argparse.Namespace) -> list[Trace]:
    """A message's traces as first written: the slow group's read of a held message comes later (late_read)."""
    traces = traces_of(message, RUN, clock, audit=not held(message), store=not lost(message, args.lost_every))
    if duplicated(message, args.duplicate_every):
        read = next(t for t in traces if t.location == ENRICHER and t.type is TraceType.RECEIVED)
        traces.append(read._replace(emitter_id=f"{ENRICHER}-replay-{RUN}", timestamp_ms=clock + 5))
    return traces


def late_read(message: int, clock: int) -> list[Trace]:
    return [t for t in traces_of(message, RUN, clock) if t.location == AUDIT_SINK]


def traffic(bootstrap: str, topic: str, args: argparse.Namespace, shared: dict[str, Any], losses: Any) -> None:
    """Traces at ``args.rate`` per second for ``args.minutes``; every second each group commits exactly past the
    messages produced a second before (demo-sink-audit on data partition 0: past the held messages it has
    read ``hold_s`` late). Reports the traces and messages produced, and, per lost message, when the first
    commit of demo-sink-store that passed it returned (epoch s) on ``losses``."""
    producer, emitters = new_producer(bootstrap), Emitters()
    committers = {g: Consumer({"bootstrap.servers": bootstrap, "group.id": g, "enable.auto.commit": False})
                  for g in GROUPS}  # fmt: skip
    per_second, seconds = args.rate / HOPS, args.minutes * 60
    held_queue: deque[tuple[float, int]] = deque()
    history: deque[tuple[float, int]] = deque()  # (when, messages produced by then)
    waiting: deque[int] = deque()  # lost messages no commit of demo-sink-store has passed yet
    produced, message, late_upto, tick, started = 0, 0, 0, 0.0, time.monotonic()

    def commit(group: str, offsets: dict[int, int]) -> None:
        committers[group].commit(
            offsets=[TopicPartition(GROUPS[group], p, o) for p, o in offsets.items()], asynchronous=False
        )

    while True:
        now = time.monotonic()
        elapsed = now - started
        clock = time.time_ns() // 1_000_000
        if elapsed < seconds:
            due = int(elapsed * per_second)
            batch = range(message, due)
            traces = emitters.number(t for m in batch for t in message_traces(m, clock, args))
            produced += send(producer, topic, traces)
            held_queue.extend((now + args.hold_s, m) for m in batch if held(m))
            waiting.extend(m for m in batch if lost(m, args.lost_every))
            message = due
        late = []
        while held_queue and held_queue[0][0] <= now:
            late.append(held_queue.popleft()[1])
        produced += send(producer, topic, emitters.number(t for m in late for t in late_read(m, clock)))
        if late:
            late_upto = late[-1] + 1
        history.append((now, message))
        if now - tick >= 1:
            tick = now
            while len(history) > 1 and history[1][0] <= now - 1:
                history.popleft()
            settled = history[0][1]  # every message below this one was produced a second ago or more
            if settled:
                producer.flush(30)  # its traces are on the trace topic before any group commits past it
                for group in GROUPS:
                    offsets = first_offsets(settled)
                    if group == AUDIT_SINK:
                        offsets[0] = first_offsets(late_upto)[0]
                    commit(group, offsets)
                    if group == STORE_SINK:
                        passed_at = time.time()
                        while waiting and waiting[0] < settled:
                            losses.put((waiting.popleft(), passed_at))
        shared["traces"].value, shared["messages"].value = produced, message
        if elapsed >= seconds and not held_queue:
            break
        time.sleep(0.02)
    producer.flush(120)
    passed_at = time.time()
    for group in GROUPS:  # everything read and committed past at the end
        commit(group, first_offsets(message))
        if group == STORE_SINK:  # the clock of the last losses starts at their group's commit, as every other's
            passed_at = time.time()
        committers[group].close()
    while waiting:
        losses.put((waiting.popleft(), passed_at))
    shared["traces"].value, shared["messages"].value = produced, message
    shared["ended"].value = time.time()


# -- what the bench reads: processes, sizes, verdicts ------------------------------------------------------------


def children(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc's parent ids)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        below = [p for p, pp in parent.items() if pp in frontier]
        found += below
        frontier = below
    return found


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def rss_bytes(pid: int) -> int:
    """VmRSS from /proc/<pid>/status (0 if the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def heap(jvm: int) -> dict[str, float]:
    """The JVM's heap from ``jstat -gc`` (KiB columns): used = S0U+S1U+EU+OU, committed = S0C+S1C+EC+OC, old
    generation used = OU."""
    out = subprocess.run(["jstat", "-gc", str(jvm)], capture_output=True, text=True, timeout=30).stdout.split()
    half = len(out) // 2
    gc = {k: float(v) for k, v in zip(out[:half], out[half:], strict=True) if v.replace(".", "", 1).isdigit()}
    if not gc:
        return {}
    return {
        "used": sum(gc.get(k, 0.0) for k in ("S0U", "S1U", "EU", "OU")) * 1024,
        "committed": sum(gc.get(k, 0.0) for k in ("S0C", "S1C", "EC", "OC")) * 1024,
        "old": gc.get("OU", 0.0) * 1024,
    }


def store_bytes(job: DetectorJob) -> int:
    db = Path(job.store_url.removeprefix("sqlite:///"))
    return sum(p.stat().st_size for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")) if p.exists())


@dataclass
class Truth:
    """What the bench did to each message, as the verdict each (message, hop) must get: key message x 5 + hop."""

    expected: np.ndarray  # int8 verdict code per key
    archived: np.ndarray  # int8: the verdict archive's verdict per key (0: none yet)
    archived_twice: int = 0
    archived_not_delivered: int = 0  # archive rows other than a plain DELIVERED (the archive should hold no other)
    unknown: int = 0  # archive rows of no (message, hop) the bench wrote
    files: set[Path] = field(default_factory=set)  # verdict-archive files read already

    @classmethod
    def of(cls, messages: int, args: argparse.Namespace) -> Truth:
        expected = np.full(messages * HOPS, KINDS.index("DELIVERED"), dtype=np.int8)
        numbers = np.arange(messages)
        if args.lost_every > 0:
            expected[numbers[numbers % args.lost_every == 7] * HOPS + LOST_HOP] = 2
        if args.duplicate_every > 0:
            expected[numbers[numbers % args.duplicate_every == 13] * HOPS + DUPLICATE_HOP] = 3
        return cls(expected, np.zeros(messages * HOPS, dtype=np.int8))


def said(row: dict[str, Any]) -> str:
    """A verdict row (the SQL store's or the verdict archive's) as the truth spells it: kind, cause, a duplicate's
    count."""
    cause = f"/{row['cause']}" if row.get("cause") else ""
    count = f" x{row['count']}" if row["verdict"] == "DUPLICATE" else ""
    return f"{row['verdict']}{cause}{count}"


def code(kind: str) -> int:
    if kind not in KINDS:
        KINDS.append(kind)
    return KINDS.index(kind)


def keys_of(message_ids: pa.Array, topics: pa.Array, groups: pa.Array) -> np.ndarray:
    """Key per verdict row (-1: not a message of this run, or a hop the route does not have)."""
    ours = pc.starts_with(message_ids, f"{RUN}-").to_numpy(zero_copy_only=False)
    digits = pc.if_else(ours, pc.utf8_slice_codeunits(message_ids, len(RUN) + 1), "-1")
    numbers = pc.cast(digits, pa.int64()).to_numpy(zero_copy_only=False)
    hops = pc.binary_join_element_wise(topics, pc.fill_null(groups, ""), "|")
    names = [f"{topic}|{group or ''}" for topic, group in HOP_INDEX]
    hop = pc.fill_null(pc.index_in(hops, value_set=pa.array(names)), -1).to_numpy(zero_copy_only=False)
    return np.where((numbers >= 0) & (hop >= 0), numbers * HOPS + hop, -1)


def read_archive(truth: Truth, archive: VerdictArchive) -> int:
    """Add the verdict archive's files not read yet (each part-0.parquet is renamed into place whole); returns the
    verdicts they hold."""
    files = [
        p
        for hour, batches in archive.batches().items()
        for b in batches
        if (p := archive.root / f"hour={hour}" / f"batch_id={b}" / "part-0.parquet").exists() and p not in truth.files
    ]
    if not files:
        return 0
    columns = ["message_id", "topic", "group_id", "verdict", "cause", "count"]
    table = ds.dataset([str(f) for f in files], schema=ARCHIVE_SCHEMA, format="parquet").to_table(columns=columns)
    truth.files.update(files)
    keys = keys_of(*(table[c].combine_chunks() for c in ("message_id", "topic", "group_id")))
    # each row as it says: a plain DELIVERED (what the archive should hold) at once, any other row by said()
    plain = pc.and_(pc.equal(table["verdict"], "DELIVERED"), pc.is_null(table["cause"])).to_numpy(zero_copy_only=False)
    codes = np.full(table.num_rows, KINDS.index("DELIVERED"), dtype=np.int8)
    others = np.flatnonzero(~plain)
    codes[others] = [code(said(row)) for row in table.take(pa.array(others)).to_pylist()]
    truth.archived_not_delivered += len(others)
    ok = (keys >= 0) & (keys < truth.archived.size)
    truth.unknown += int((~ok).sum())
    keys, codes = keys[ok], codes[ok]
    truth.archived_twice += int((truth.archived[keys] != 0).sum()) + len(keys) - len(np.unique(keys))
    truth.archived[keys] = codes
    return int(table.num_rows)


def every_verdict(truth: Truth, store: Store) -> tuple[np.ndarray, int]:
    """Every verdict per key: the archive's, with the SQL store's rows over them (SQL wins per hop); and the SQL rows
    of no (message, hop) the bench wrote (left out of the keys, counted)."""
    rows = store.verdicts.read(stream=STREAM)
    verdicts = truth.archived.copy()
    if not rows:
        return verdicts, 0
    keys = keys_of(
        pa.array([r["message_id"] for r in rows]),
        pa.array([r["topic"] for r in rows]),
        pa.array([r["group_id"] for r in rows]),
    )
    codes = np.array([code(said(r)) for r in rows], dtype=np.int8)
    ok = (keys >= 0) & (keys < verdicts.size)
    verdicts[keys[ok]] = codes[ok]
    return verdicts, int((~ok).sum())


@dataclass
class Exactness:
    judged: int  # messages judged (every hop should be decided)
    mismatches: int
    missing: int  # (message, hop)s judged that have no verdict
    counts: dict[str, tuple[int, int]]  # kind -> (Khipu, truth)
    extra: int  # verdicts (SQL store and verdict archive) of no (message, hop) the bench wrote


def judge(truth: Truth, found_verdicts: tuple[np.ndarray, int], messages: int) -> Exactness:
    verdicts, extra_sql = found_verdicts
    end = messages * HOPS
    got, want = verdicts[:end], truth.expected[:end]
    found = np.bincount(got, minlength=len(KINDS))
    true = np.bincount(want, minlength=len(KINDS))
    counts = {KINDS[c]: (int(found[c]), int(true[c])) for c in range(1, len(KINDS))}
    return Exactness(messages, int((got != want).sum()), int(found[0]), counts, extra_sql + truth.unknown)


# -- the report ------------------------------------------------------------------------------------------------


@dataclass
class Interval:
    start_s: float  # since the traffic started
    end_s: float
    phase: str = ""  # "warm-up" (left out of the targets), "" (steady traffic), "drain" (the slow group's last reads)
    traces: int = 0  # produced in the interval
    read: int = 0  # read by the detector (its heartbeat)
    in_flight: int = 0  # messages in flight at the end (heartbeat state_rows)
    heap_used: list[float] = field(default_factory=list)  # 10 s samples
    heap_committed: float = 0.0
    old_gen: list[float] = field(default_factory=list)  # 10 s samples
    jvm_rss: list[float] = field(default_factory=list)
    outside_heap: list[float] = field(default_factory=list)  # JVM RSS - heap committed, sampled together
    workers_sum: list[float] = field(default_factory=list)
    workers_max: float = 0.0
    workers_n: int = 0
    driver_rss: list[float] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)  # at the end of the interval
    archived: int = 0  # verdicts the verdict archive gained
    losses: list[int] = field(default_factory=list)  # lost messages whose commit passed in the interval
    exactness: Exactness | None = None


def mib(value: float) -> str:
    return f"{value / MIB:,.0f}"


def latencies_of(i: Interval, passed: dict[int, float], seen: dict[int, float], now: float) -> LostLatencies:
    """The LOST latencies of the interval's losses by the benches' one rule (:func:`figures.lost_latencies`): one not
    seen LOST within ``LOST_DEADLINE_S`` of its commit is infinitely late, seen later or never; one not seen yet
    whose deadline has not passed at ``now`` is waiting, not counted."""
    return lost_latencies({m: passed[m] for m in i.losses}, seen, now)


def table(title: str, legend: list[str], header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = [title, *(f"  {line}" for line in legend)]
    lines.append("| " + " | ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)) + " |")
    lines.append("|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
    lines += ["| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    return "\n".join(lines)


def report(
    intervals: list[Interval], passed: dict[int, float], seen: dict[int, float], false_lost: set[int], final: bool
) -> str:
    def at(i: Interval) -> str:
        return f"{i.phase} {i.start_s / 60:.0f}-{i.end_s / 60:.{0 if i.end_s % 60 < 1 else 1}f} min".lstrip()

    memory = [
        [
            at(i),
            f"{i.traces / max(1e-9, i.end_s - i.start_s):,.0f} / {i.read / max(1e-9, i.end_s - i.start_s):,.0f}",
            f"{i.in_flight:,}",
            f"{mib(statistics.median(i.heap_used))} / {mib(max(i.heap_used))}" if i.heap_used else "-",
            f"{mib(min(i.old_gen))} / {mib(i.old_gen[-1])}" if i.old_gen else "-",
            mib(i.heap_committed),
            mib(max(i.jvm_rss)) if i.jvm_rss else "-",
            mib(statistics.median(i.outside_heap)) if i.outside_heap else "-",
            f"{mib(statistics.median(i.workers_sum))} / {mib(i.workers_max)} ({i.workers_n})" if i.workers_sum else "-",
            mib(max(i.driver_rss)) if i.driver_rss else "-",
        ]
        for i in intervals
    ]
    hours = [(i.end_s - i.start_s) / 3600 for i in intervals]
    disk = []
    before: dict[str, int] = {"store": 0, "traces": 0, "verdicts": 0, "checkpoint": 0}
    for i, h in zip(intervals, hours, strict=True):
        grew = {k: i.sizes.get(k, 0) - before.get(k, 0) for k in before}
        before = dict(i.sizes) or before
        disk.append([
            at(i),
            *(f"{grew[k] / MIB / h:,.0f}" if h > 0 else "-" for k in ("store", "traces", "verdicts", "checkpoint")),
            f"{grew['store'] / max(1, i.read):,.1f}",
            f"{grew['traces'] / max(1, i.read):,.1f}",
            f"{grew['verdicts'] / max(1, i.archived):,.1f}",
        ])  # fmt: skip
    lost_rows = []
    now = time.time()
    for i in intervals:
        latencies = latencies_of(i, passed, seen, now)
        e = i.exactness
        kinds = (
            " ".join(f"{k} {n:,}/{t:,}" for k, (n, t) in e.counts.items() if n or t) if e and e.judged else "-"
        )  # fmt: skip
        lost_rows.append([
            at(i),
            f"{len(i.losses):,}",
            f"{latencies.within:,}",
            f"{latencies.late:,}",
            f"{latencies.never:,}",
            f"{latencies.pending:,}",
            seconds(latencies.at(0.5)).removesuffix(" s"),
            seconds(latencies.at(0.95)).removesuffix(" s"),
            seconds(latencies.worst()).removesuffix(" s"),
            f"{e.judged:,}" if e else "-",
            kinds,
            f"{e.missing:,}" if e else "-",
            f"{e.mismatches:,}" if e else "-",
            f"{e.extra:,}" if e else "-",
        ])  # fmt: skip
    parts = [
        table(
            "Memory (MiB; the detector's processes, sampled every 10 s):",
            [
                "traces/s: produced / read by the detector (its heartbeat's input rows) over the interval",
                "in flight: messages in the detector's state at the interval's end (heartbeat state_rows)",
                "heap: the driver JVM's Java heap from `jstat -gc` (local[*]: the executors run in it), used = "
                "S0U+S1U+EU+OU (garbage not yet collected included), median / max of the samples; old gen = OU, "
                "the least of the samples (near what survives collection) / at the end; committed = "
                "S0C+S1C+EC+OC at the end",
                "JVM RSS: VmRSS of the driver JVM (/proc/<pid>/status; heap, RocksDB state, Arrow, metaspace), max; "
                "it follows the heap's committed size, which the collector grows and shrinks up to the maximum heap",
                "outside heap: VmRSS minus the heap's committed size, read together at each sample, median: the "
                "resident memory outside the Java heap (metaspace, code, threads, native libraries such as "
                "RocksDB's), at least (committed heap pages not yet touched are not resident)",
                "py workers: VmRSS of Spark's Python worker processes (the JVM's Python children: pyspark.daemon "
                "and its forked workers; shared pages count in each), summed (median) / the largest (max), (how "
                "many at the end)",
                "driver py: VmRSS of the detector's Python driver process (spark/detector.py: the writer), max",
            ],
            [
                "interval",
                "traces/s",
                "in flight",
                "heap used",
                "old gen",
                "committed",
                "JVM RSS",
                "outside heap",
                "py workers",
                "driver py",
            ],
            memory,
        ),
        table(
            "Disk (what the detector wrote: MiB added per hour of the interval, the drain's included; bytes per trace "
            "read / verdict archived):",
            [
                "store: the SQLite store file with its -wal/-shm (the verdict archive's index included); traces: the "
                "trace archive folder; verdicts: the verdict archive folder (Parquet); checkpoint: Spark's checkpoint "
                "with RocksDB state",
                "B/trace: bytes added per trace the detector read in the interval; verdict archive B/verdict: per "
                "verdict it gained",
            ],
            [
                "interval",
                "store MiB/h",
                "traces MiB/h",
                "verdicts MiB/h",
                "checkpoint MiB/h",
                "store B/trace",
                "trace archive B/trace",
                "verdict archive B/verdict",
            ],
            disk,
        ),
        table(
            "LOST latency and exactness:",
            [
                "LOST latency: from demo-sink-store's commit passing a lost message (the commit returned, in the "
                "traffic process) to the bench first seeing its LOST row in the SQL store (polled every 0.5 s), "
                f"for the losses whose commit fell in the interval: how many; seen LOST within {LOST_DEADLINE_S:.0f} "
                f"s of the commit; seen later; not seen ({LOST_DEADLINE_S:.0f} s passed); waiting (not seen yet, "
                f"within their {LOST_DEADLINE_S:.0f} s: not counted; the run waits them out before its last report); "
                "p50, p95, max (s) of those counted, one seen later or not seen infinitely late ('not reached'), as "
                "bench/detector.py counts them (figures.lost_latencies)",
                "exactness, cumulative: messages judged (produced more than hold + 60 s before the interval's end; "
                "at the end every message), verdicts per kind (with cause, a duplicate's reads) Khipu/truth (SQL "
                "store and verdict archive, SQL winning per hop), (message, hop)s without a verdict, mismatches "
                "(any hop whose verdict, cause or count is not the truth's, missing ones included), and extra "
                "verdicts (of no (message, hop) the bench wrote)",
            ],
            [
                "interval",
                "losses",
                f"LOST in {LOST_DEADLINE_S:.0f} s",
                "later",
                "not seen",
                "waiting",
                "p50 s",
                "p95 s",
                "max s",
                "messages judged",
                "verdicts Khipu/truth",
                "missing",
                "mismatches",
                "extra",
            ],
            lost_rows,
        ),
    ]
    if final:
        parts.append(targets(intervals, passed, seen, false_lost))
    return "\n\n".join(parts)


def targets(intervals: list[Interval], passed: dict[int, float], seen: dict[int, float], false_lost: set[int]) -> str:
    """The targets, over the intervals after the warm-up: LOST p95 in each (a loss not seen LOST within
    ``LOST_DEADLINE_S`` of its commit counting as infinitely late, seen later or never), every loss seen and no false
    one, memory of the last steady interval vs the first, and the exactness of every verdict."""
    judged = [i for i in intervals if i.phase != "warm-up"] or intervals
    steady = [i for i in judged if not i.phase] or judged
    now = time.time()
    losses = [latencies_of(i, passed, seen, now) for i in judged]
    worst = max((f.at(0.95) for f in losses if f.latencies_s), default=math.nan)
    late, not_seen = sum(f.late for f in losses), sum(f.never for f in losses)
    waiting = sum(f.pending for f in losses)
    waited = f"; {waiting:,} still waiting, not counted" if waiting else ""
    never = passed.keys() - seen.keys()  # lost, never seen LOST
    wrongly = (seen.keys() - passed.keys()) | false_lost  # seen LOST, not lost there
    lines = [
        "Targets (the intervals after the warm-up):",
        f"  LOST p95 <= {LOST_P95_TARGET_S:g} s in every interval (a loss not seen LOST within "
        f"{LOST_DEADLINE_S:.0f} s of its commit: infinitely late; {late + not_seen:,} of "
        f"{sum(len(f.latencies_s) for f in losses):,} losses counted so, {late:,} seen later, {not_seen:,} never"
        f"{waited}): worst {seconds(worst)} -> {against(f'<= {LOST_P95_TARGET_S:g} s', worst <= LOST_P95_TARGET_S)}",
        f"  every loss seen LOST, and LOST of no message the bench did not lose there: {len(never):,} of "
        f"{len(passed):,} losses never seen LOST, {len(wrongly):,} message(s) seen LOST that the bench did not lose "
        f"at demo-sink-store -> {against('0 and 0', not never and not wrongly)}",
    ]
    lines.append(memory_target(steady))
    e = intervals[-1].exactness
    if e is not None:
        lines.append(f"  exactness: {e.mismatches:,} mismatches ({e.missing:,} of them without a verdict) over "
                     f"{e.judged:,} messages, {e.extra:,} extra verdicts (of no (message, hop) the bench wrote) -> "
                     f"{against('0 and 0', e.mismatches == 0 and e.extra == 0)}")  # fmt: skip
    else:
        lines.append("  exactness: not judged (the run ended before its first interval) -> NOT met")
    return "\n".join(lines)


def memory_target(steady: list[Interval]) -> str:
    """Memory of the last interval of steady traffic against the first: judged only when there are two, and each
    measure was sampled in both."""
    first, last = steady[0], steady[-1]
    samples: list[tuple[str, Callable[[list[float]], float], list[float], list[float]]] = [
        ("heap used (median)", statistics.median, first.heap_used, last.heap_used),
        ("old gen (least)", min, first.old_gen, last.old_gen),
        ("JVM RSS (max)", max, first.jvm_rss, last.jvm_rss),
        ("JVM RSS outside heap (median)", statistics.median, first.outside_heap, last.outside_heap),
        ("py workers (sum, median)", statistics.median, first.workers_sum, last.workers_sum),
        ("driver py (max)", max, first.driver_rss, last.driver_rss),
    ]
    grown: list[tuple[str, float, float, float]] = []
    unsampled: list[str] = []
    for name, of, before, after in samples:
        if not before or not after:
            unsampled.append(name)
            continue
        a, b = of(before), of(after)
        grown.append((name, a, b, (b - a) / a * 100 if a else math.inf))
    figures = "; ".join(f"{n} {mib(a)} -> {mib(b)} MiB ({g:+.0f} %)" for n, a, b, g in grown)
    target = f"flat, each within +{MEMORY_GROWTH_LIMIT_PERCENT:g} %"
    if len(steady) < 2 or any(i.phase for i in steady):
        verdict = unjudged(target, "fewer than two intervals of steady traffic")
    elif unsampled:
        verdict = unjudged(target, f"no samples of {', '.join(unsampled)} in one of them")
    else:
        verdict = against(target, all(g <= MEMORY_GROWTH_LIMIT_PERCENT for *_, g in grown))
    return (
        f"  memory, the last steady interval ({last.start_s / 60:.0f}-{last.end_s / 60:.0f} min) vs the first "
        f"({first.start_s / 60:.0f}-{first.end_s / 60:.0f} min): {figures or 'no samples'} -> {verdict}"
    )


# -- the run ---------------------------------------------------------------------------------------------------


def start_detector_process(bootstrap: str, job: DetectorJob, work: Path, args: argparse.Namespace) -> Any:
    """spark/detector.py as production runs it (every detector setting its default), in a session of its own."""
    command = [sys.executable, str(ROOT / "spark" / "detector.py"), "--registry", str(REGISTRY),
               "--bootstrap-servers", bootstrap, "--trace-topic", job.trace_topic, "--lost-topic", "",
               "--checkpoint", str(job.checkpoint_dir), "--archive", str(job.archive_dir),
               "--verdict-archive", str(job.verdicts_dir), "--master", "local[*]"]  # fmt: skip
    env = {**os.environ, "KHIPU_STORE_URL": job.store_url, "PYSPARK_PYTHON": sys.executable}
    if args.driver_memory:
        env["PYSPARK_SUBMIT_ARGS"] = f"--driver-memory {args.driver_memory} pyspark-shell"
    log = (work / "detector.log").open("wb")
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def sample(driver: int, interval: Interval) -> None:
    below = children(driver)
    jvm = next((pid for pid in below if command(pid).split(" ")[0].endswith("java")), None)
    interval.driver_rss.append(rss_bytes(driver))
    if jvm is None:
        return
    gc = heap(jvm)
    rss = rss_bytes(jvm)
    if gc and rss:  # rss 0: the JVM exited between the two reads
        interval.heap_used.append(gc["used"])
        interval.heap_committed = gc["committed"]
        interval.old_gen.append(gc["old"])
        interval.outside_heap.append(rss - gc["committed"])
    interval.jvm_rss.append(rss)
    workers = [rss_bytes(pid) for pid in children(jvm) if "python" in command(pid)]
    if workers:
        interval.workers_sum.append(sum(workers))
        interval.workers_max = max(interval.workers_max, *workers)
        interval.workers_n = len(workers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=10_000, help="traces per second offered")
    parser.add_argument("--minutes", type=float, default=60.0, help="how long the traffic runs")
    parser.add_argument("--every-min", type=float, help="minutes per interval (default 5, or 1 under 30 minutes)")
    parser.add_argument("--hold-s", type=float, default=120.0, help="how late the slow group reads 10 %% of them")
    parser.add_argument("--lost-every", type=int, default=2_000, help="one message in this many is lost (0: none)")
    parser.add_argument("--duplicate-every", type=int, default=2_000, help="one in this many read twice (0: none)")
    parser.add_argument("--driver-memory", help="the detector's spark.driver.memory (default: Spark's, 1g)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (broker data, store, archives)")
    args = parser.parse_args()
    for every in (args.lost_every, args.duplicate_every):
        if 0 < every < 20:
            parser.error("--lost-every and --duplicate-every: 0 or at least 20")
    every_s = 60 * (args.every_min or (5.0 if args.minutes >= 30 else 1.0))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="khipu-soak-"))
    broker = start_broker(BrokerSpec.scratch(work / "kafka", settings={"log.retention.check.interval.ms": "300000"}),
                          work / "broker.log")  # fmt: skip
    driver, traffic_process, store = None, None, None
    try:
        bootstrap, topic = broker.bootstrap_servers, "bench.soak"
        KafkaAdmin(KafkaConnection(bootstrap)).ensure_topics({IN: PARTITIONS, OUT: PARTITIONS, topic: TRACE_PARTITIONS})
        job = job_for(bootstrap, work, "soak", topic)
        store = Store(job.store_url)
        archive = VerdictArchive(job.verdicts_dir, store)
        capacity = int(args.rate / HOPS * args.minutes * 60 * 1.05) + 1_000
        truth = Truth.of(capacity, args)
        print(f"soak: {args.rate:,} traces/s for {args.minutes:g} min, intervals of {every_s / 60:g} min; one message "
              f"in {args.lost_every:,} lost, one in {args.duplicate_every:,} duplicated; the slow group "
              f"{args.hold_s:g} s behind on 10 %; spark/detector.py with its defaults, driver memory "
              f"{args.driver_memory or 'Spark default (1g)'}; {os.cpu_count()} CPUs shared with the broker and the "
              f"producer; work in {work}", flush=True)  # fmt: skip
        driver = start_detector_process(bootstrap, job, work, args)
        wait_for("the detector's first batch", lambda: store.heartbeat.latest(DETECTOR_QUERY) is not None, 300)

        context = multiprocessing.get_context("spawn")
        shared = {"traces": context.Value("q", 0), "messages": context.Value("q", 0), "ended": context.Value("d", 0.0)}
        losses = context.Queue()
        traffic_process = context.Process(target=traffic, args=(bootstrap, topic, args, shared, losses))
        passed: dict[int, float] = {}  # lost message -> when the commit passing it returned
        seen: dict[int, float] = {}  # message -> when the bench first saw a LOST row of it at demo-sink-store
        false_lost: set[int] = set()  # messages seen LOST at another hop (the bench loses none there)
        stop = threading.Event()

        def look() -> None:  # LOST rows, every 0.5 s
            watcher = Store(job.store_url)
            try:
                while not stop.is_set():
                    since = int((time.time() - 600) * 1000)
                    for row in watcher.verdicts.page(verdicts=["LOST"], stream=STREAM, since_ms=since, limit=100_000):
                        number = int(str(row["message_id"]).removeprefix(f"{RUN}-"))
                        if row["group_id"] == STORE_SINK:
                            seen.setdefault(number, time.time())
                        else:
                            false_lost.add(number)
                    stop.wait(0.5)
            finally:
                watcher.close()

        def take_losses() -> None:  # the losses the traffic process has reported, each to its interval
            while True:
                try:
                    message, at = losses.get_nowait()
                except queue.Empty:
                    return
                passed[message] = at
                next(i for i in intervals if at - started < i.end_s or i is intervals[-1]).losses.append(message)

        watcher = threading.Thread(target=look, daemon=True)
        watcher.start()
        started = time.time()
        traffic_process.start()
        intervals = [Interval(0.0, every_s, "warm-up")]  # the first interval: left out of the targets
        marks: list[tuple[float, int]] = [(started, 0)]  # (when, messages produced by then)
        last_traces, next_sample = 0, time.monotonic()
        finished = False
        while not finished:
            time.sleep(max(0.0, next_sample - time.monotonic()))
            next_sample += 10
            now, current = time.time(), intervals[-1]
            marks.append((now, int(shared["messages"].value)))
            take_losses()
            sample(driver.pid, current)
            traffic_over = not traffic_process.is_alive()
            if now - started < current.end_s and not traffic_over:
                continue
            # the interval ends: its figures
            current.end_s = min(current.end_s, now - started)
            traces = int(shared["traces"].value)
            current.traces, last_traces = traces - last_traces, traces
            since_ms = int((started + current.start_s) * 1000)
            beats = [b for b in store.heartbeat.series(DETECTOR_QUERY, since_ms) if b["batch_id"] >= 0]
            current.read = sum(int(b["input_rows"]) for b in beats)
            beat = store.heartbeat.latest(DETECTOR_QUERY) or {}
            current.in_flight = int(beat.get("state_rows") or 0)
            current.archived = read_archive(truth, archive)
            current.sizes = {
                "store": store_bytes(job),
                "traces": folder_bytes(job.archive_dir),
                "verdicts": folder_bytes(job.verdicts_dir),
                "checkpoint": folder_bytes(job.checkpoint_dir),
            }
            if traffic_over:
                finished = settle(store, truth, archive, int(shared["messages"].value), args)
                take_losses()  # the last, reported as the traffic ended
                wait_out(passed, seen)
                judged = int(shared["messages"].value)
            else:
                cut = now - args.hold_s - 60
                judged = max((n for t, n in marks if t <= cut), default=0)
            current.exactness = judge(truth, every_verdict(truth, store), judged)
            print(f"\n== {current.end_s / 60:.1f} min: {traces:,} traces produced ==\n", flush=True)
            # what the watcher thread has seen so far (it goes on adding)
            print(report(intervals, passed, dict(seen), set(false_lost), final=finished), flush=True)
            if not finished:
                phase = "drain" if current.end_s >= args.minutes * 60 - 1 else ""
                intervals.append(Interval(current.end_s, current.end_s + every_s, phase))
        stop.set()
        print(f"verdict archive: {truth.archived_twice:,} (message, hop)s archived twice, "
              f"{truth.archived_not_delivered:,} rows other than a plain DELIVERED, {truth.unknown:,} of no "
              f"(message, hop) the bench wrote -> {NO_TARGET} (those of no (message, hop) count as extra above; "
              "any other row is judged as it says, the SQL store's row for its hop winning)",
              flush=True)  # fmt: skip
        return 0
    finally:
        if traffic_process is not None and traffic_process.is_alive():
            traffic_process.terminate()
        if driver is not None:
            stop_process_group(driver.pid)
        if store is not None:
            store.close()
        stop_process_group(broker.pid)
        if args.keep:
            print(f"work kept in {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)  # the broker's data, the store and the archives


def wait_out(passed: dict[int, float], seen: dict[int, float]) -> None:
    """Until every loss is seen LOST or its ``LOST_DEADLINE_S`` has passed: the last report leaves none waiting."""
    while True:
        unseen = [at for message, at in list(passed.items()) if message not in seen]
        if not unseen or time.time() - max(unseen) > LOST_DEADLINE_S:
            return
        time.sleep(0.5)


def settle(store: Store, truth: Truth, archive: VerdictArchive, messages: int, args: argparse.Namespace) -> bool:
    """After the traffic: wait until every (message, hop) has a verdict, or the count holds still for 60 s (the
    rest are reported missing). Returns True (the run is over)."""
    deadline, last, still = time.monotonic() + args.hold_s + 600, -1, time.monotonic()
    while time.monotonic() < deadline:
        read_archive(truth, archive)
        decided = int((every_verdict(truth, store)[0][: messages * HOPS] != 0).sum())
        if decided >= messages * HOPS:
            return True
        if decided != last:
            last, still = decided, time.monotonic()
        elif time.monotonic() - still > 60:
            return True
        time.sleep(2)
    return True


if __name__ == "__main__":
    sys.exit(main())
