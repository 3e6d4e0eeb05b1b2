"""Files per archive hour and a point lookup's time, before and after compaction (not a test).

    .venv/bin/python bench/compaction.py [--batches 1800] [--messages 2500] [--storage local|object-store|both]

Writes one UTC hour of micro-batches through Khipu's own writers, as the detector does at a 2 s trigger
(``--batches`` of them: 1,800 an hour): each batch ``--messages`` messages, a SENT and a RECEIVED trace each in the
trace archive (:func:`khipu.trace.archive.write_batch`) and one plain DELIVERED verdict each in the verdict archive
(:meth:`khipu.verdicts.archive.VerdictArchive.write_batch`) with its index rows (an SQLite store). Then it times
lookups of single messages, compacts the hour of both archives (:func:`khipu.retention.compaction.compact_archive`,
``KHIPU_ARCHIVE_FILE_MIB``'s default 128 MiB), and times the same lookups again. ``--storage object-store`` puts the
archives in a real S3 API (S3Proxy, started here, on this machine's disk); ``local`` in a local folder.

What each clock covers (wall time, median of the lookups, in this process):

- *verdict lookup, through the index*: ``VerdictArchive.search([id])``: the index query in the store, listing the
  message's batch folder and the hour's compacted folder (and the next hour's two), opening the Parquet file(s)
  there and decoding the row group holding the id;
- *verdict lookup, not in the index* (the detector keeps the index 2.5 h; older messages are searched by hour):
  the same call with an index that does not know the message: listing every batch folder of the newest hours (one
  here) and opening every file in them (after compaction: the part of the id's bucket);
- *trace lookup*: ``read_traces([id], hour)``, as the view and ``khipu trace`` read a message's traces: listing the
  hour and opening every file of it (after compaction: the part of the id's bucket);
- *compaction*: an hour of one archive, from the listing to the last input deleted, in a process of its own (its
  peak resident memory is the figure beside it: the interpreter and pyarrow included).

A local folder is read through the OS page cache (the files were just written): its figures are the floor of a
disk's. No figure has a target (each says "(no target)").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from figures import NO_TARGET
from khipu.localstack.object_store import ObjectStoreProcess, ObjectStoreSpec, start_object_store
from khipu.retention.compaction import CLOSED_MARGIN_MS, MIB
from khipu.storage.compaction import list_hour
from khipu.storage.location import Location
from khipu.store import Store
from khipu.trace import archive
from khipu.trace.archive import HOUR_MS, hour_of
from khipu.verdicts import archive as verdicts
from khipu.verdicts.archive import VerdictArchive

T0 = 1_796_000_000_000 // HOUR_MS * HOUR_MS
HOUR = hour_of(T0)
TRIGGER_MS = 2_000
FILE_MIB = 128  # KHIPU_ARCHIVE_FILE_MIB's default


COMPACTOR = """
import json, resource, sys
from khipu.retention.compaction import compact_archive
from khipu.storage.location import Location
from khipu.trace import archive
from khipu.verdicts import archive as verdicts
root, name, read_to, target = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
spec = archive.COMPACTION if name == "traces" else verdicts.COMPACTION
[hour] = compact_archive(Location.of(root), spec, read_to, target, progress=lambda line: None).hours
done = hour.compaction
peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"line": hour.describe(spec.name), "seconds": hour.seconds, "rows": done.rows_after,
                  "bytes_before": done.bytes_before, "peak_rss_kib": peak_kib}))
"""


def message_ids(rng: np.random.Generator, count: int) -> list[str]:
    """Random ids in a UUID's form, as applications' are."""
    return [str(uuid.UUID(bytes=bytes(raw))) for raw in rng.integers(0, 256, (count, 16), dtype=np.uint8)]


def batch_tables(batch: int, ids: list[str], rng: np.random.Generator) -> tuple[pa.Table, pa.Table]:
    """A micro-batch's traces (a SENT and a RECEIVED a message) and its plain DELIVERED verdicts (one a message)."""
    n = len(ids)
    at = T0 + batch * TRIGGER_MS + rng.integers(0, TRIGGER_MS, n)
    offsets = batch * n + np.arange(n)
    partition = rng.integers(0, 12, n).astype(np.int32)
    traces = {
        "message_id": ids * 2,
        "stream": ["orders"] * 2 * n,
        "location": ["orders-api"] * n + ["enricher"] * n,
        "cluster": ["local"] * 2 * n,
        "type": ["SENT"] * n + ["RECEIVED"] * n,
        "timestamp_ms": np.concatenate([at, at + 40]),
        "topic": ["orders"] * 2 * n,
        "partition": np.concatenate([partition, partition]),
        "offset": np.concatenate([offsets, offsets]),
        "group": [None] * n + ["enricher"] * n,
        "emitter_id": ["orders-api-7f3a"] * n + ["enricher-9c1e"] * n,
        "emitter_seq": np.concatenate([offsets, offsets]),
        "sampling_percent": [100.0] * 2 * n,
        "kafka_timestamp_ms": np.concatenate([at + 3, at + 43]),
    }
    trace_table = pa.table(
        {f.name: traces.get(f.name, pa.nulls(2 * n, f.type)) for f in archive.SCHEMA}, schema=archive.SCHEMA
    )
    decided = at + 2_000
    verdict_columns = {
        "message_id": ids, "hop": ["local/orders -> enricher"] * n, "stream": ["orders"] * n,
        "hop_kind": ["read"] * n, "verdict": ["DELIVERED"] * n, "cause": pa.nulls(n, pa.string()), "count": [1] * n,
        "topic": ["orders"] * n, "partition": partition, "offset": offsets, "group_id": ["enricher"] * n,
        "location": ["enricher"] * n, "observed_ms": at + 40, "latency_ms": [40] * n, "e2e_latency_ms": [40] * n,
        "decided_ms": decided, "detail": [""] * n, "first_seen_ms": at, "decided_by": ["detector"] * n,
        "evidence_kind": pa.nulls(n, pa.string()), "late_evidence": [False] * n,
    }  # fmt: skip
    return trace_table, verdicts.conform(pa.table(verdict_columns))


def timed(lookups: list[str], look: Callable[[str], Any]) -> tuple[float, int]:
    """The median wall time of one lookup (ms), and how many rows the lookups found."""
    spent, found = [], 0
    for message in lookups:
        started = time.perf_counter()
        found += len(look(message))
        spent.append((time.perf_counter() - started) * 1000)
    return statistics.median(spent), found


def run(label: str, data: Location, work: Path, args: argparse.Namespace) -> list[tuple[str, str, str]]:
    print(f"\n{label}: writing {args.batches:,} micro-batches of {args.messages:,} messages ...", flush=True)
    store, empty = Store(f"sqlite:///{work / 'khipu.db'}"), Store(f"sqlite:///{work / 'empty.db'}")
    store.migrate()
    empty.migrate()
    traces, verdict_root = data / "archive", data / "verdicts"
    rng = np.random.default_rng(7)
    sample: list[str] = []
    started = time.monotonic()
    with VerdictArchive(verdict_root, store) as verdict_archive:
        for batch in range(args.batches):
            ids = message_ids(rng, args.messages)
            trace_table, verdict_table = batch_tables(batch, ids, rng)
            archive.write_batch(traces, batch, trace_table)
            verdict_archive.write_batch(batch, verdict_table)
            verdict_archive.index.record(batch, [(m, None, HOUR) for m in ids])
            if batch % max(1, args.batches // args.lookups) == 0:
                sample.append(ids[int(rng.integers(0, len(ids)))])
            if batch % 200 == 0:
                print(f"  batch {batch:,} ({time.monotonic() - started:.0f} s)", flush=True)
        archive.write_batch(traces, args.batches, archive.SCHEMA.empty_table())  # the next batch, in the next hour
        verdict_archive.write_batch(args.batches, verdicts.SCHEMA.empty_table())
    unindexed = VerdictArchive(verdict_root, empty)
    indexed = VerdictArchive(verdict_root, store)
    sample = sample[: args.lookups]
    few = sample[: args.scans]

    def measure() -> dict[str, tuple[float, int]]:
        return {
            "index": timed(sample, lambda m: indexed.search([m]).rows),
            "scan": timed(few, lambda m: unindexed.search([m]).rows),
            "traces": timed(few, lambda m: archive.read_traces(traces, [m], T0, T0 + HOUR_MS - 1)),
        }

    before = {name: list_hour(root, f"hour={HOUR}") for name, root in (("traces", traces), ("verdicts", verdict_root))}
    print("  timing lookups before compaction ...", flush=True)
    looked_before = measure()
    compacted = {}
    for name, root in (("traces", traces), ("verdicts", verdict_root)):
        print(f"  compacting the {name} hour (a process of its own) ...", flush=True)
        read_to = T0 + HOUR_MS + CLOSED_MARGIN_MS
        ran = subprocess.run(
            [sys.executable, "-c", COMPACTOR, root.url, name, str(read_to), str(FILE_MIB * MIB)],
            capture_output=True, text=True, check=True, env=os.environ.copy(),
        )  # fmt: skip
        compacted[name] = json.loads(ran.stdout.strip().splitlines()[-1])
        print(f"  {compacted[name]['line']}", flush=True)
    after = {name: list_hour(root, f"hour={HOUR}") for name, root in (("traces", traces), ("verdicts", verdict_root))}
    print("  timing lookups after compaction ...", flush=True)
    looked_after = measure()
    for key in looked_before:  # the same lookups find the same rows
        assert looked_before[key][1] == looked_after[key][1], (key, looked_before[key], looked_after[key])
    store.close()
    empty.close()

    rows = []
    for name, what in (("traces", "trace archive"), ("verdicts", "verdict archive")):
        rows.append(
            (f"{label}: {what}, files in the hour ({_mib(before[name].bytes)} of Parquet)",
             f"{len(before[name].files):,}", f"{len(after[name].files):,} ({_mib(after[name].bytes)})")
        )  # fmt: skip
    for key, what, count in (
        ("index", "verdict point lookup through the index (median)", len(sample)),
        ("scan", "verdict point lookup of a message the index does not hold, one hour scanned (median)", len(few)),
        ("traces", "trace lookup of a message in its hour, read_traces (median)", len(few)),
    ):
        rows.append(
            (f"{label}: {what}, {count} lookups", f"{looked_before[key][0]:,.1f} ms", f"{looked_after[key][0]:,.1f} ms")
        )
    for name, what in (("traces", "trace archive"), ("verdicts", "verdict archive")):
        done = compacted[name]
        rows.append(
            (f"{label}: compacting the {what}'s hour ({done['rows']:,} rows): seconds, and the compacting process's "
             "peak resident memory", "-",
             f"{done['seconds']:,.1f} s ({done['bytes_before'] / MIB / done['seconds']:,.1f} MiB/s of input), "
             f"{done['peak_rss_kib'] / 1024:,.0f} MiB")
        )  # fmt: skip
    return rows


def _mib(n: int) -> str:
    return f"{n / MIB:,.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=1_800, help="micro-batches in the hour (2 s trigger: 1,800)")
    parser.add_argument("--messages", type=int, default=2_500, help="messages a micro-batch (2 traces, 1 verdict each)")
    parser.add_argument("--lookups", type=int, default=20, help="lookups through the index timed")
    parser.add_argument("--scans", type=int, default=3, help="lookups scanning the hour timed (slow before compaction)")
    parser.add_argument("--storage", choices=("local", "object-store", "both"), default="both")
    args = parser.parse_args()
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="khipu-compaction-bench-") as folder:
        work = Path(folder)
        if args.storage in ("local", "both"):
            (work / "local").mkdir()
            rows += run("local folder", Location.of(work / "local"), work / "local", args)
        if args.storage in ("object-store", "both"):
            (work / "s3").mkdir()
            proxy: ObjectStoreProcess = start_object_store(
                ObjectStoreSpec.scratch(work / "s3" / "data"), work / "s3.log"
            )
            try:
                os.environ.update(proxy.environment())
                rows += run("object store (S3Proxy)", Location.of(f"s3a://{proxy.bucket}/bench"), work / "s3", args)
            finally:
                proxy.stop()
    print(f"\n{args.batches:,} micro-batches of {args.messages:,} messages in one hour; lookups: wall time in this "
          "process (see the module doc for what each clock covers)\n")  # fmt: skip
    print("| measure | before compaction | after compaction | target |")
    print("|---|---|---|---|")
    for measure, before, after in rows:
        print(f"| {measure} | {before} | {after} | {NO_TARGET} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
