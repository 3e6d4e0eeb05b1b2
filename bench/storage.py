"""Bytes on disk per trace and per verdict, and the disk a day of traffic takes (not a test).

    .venv/bin/python bench/storage.py [--traces 1000000] [--batch 50000] [--rate 25000] [--store-verdicts 100000]

Writes synthetic traffic through Khipu's own writers, as the detector does at ``--rate`` traces/s with a 2 s
trigger (``--batch`` traces a micro-batch): the trace archive (:func:`khipu.trace.archive.write_batch`), the
verdict archive (:meth:`khipu.verdicts.archive.VerdictArchive.write_batch`, one plain DELIVERED per read hop)
with its index (a row per message and micro-batch, in the SQL store), and the SQL store's verdict rows with their
history (:class:`khipu.verdicts.book.VerdictBook`, SQLite: the exceptions, a LOST or DUPLICATE, that the store
keeps as rows). The traffic: messages of one stream on a three-hop route (a producer, a processor, a sink), each
hop's SENT and RECEIVED trace: six traces and three verdicts a message. Prints bytes per trace, per verdict and per
index row and, from them, the disk per day at ``--rate`` (the index: its size at any time, the detector keeping
``--index-keep-h`` of it); none of these figures has a target (each says "(no target)"): they are what disk and
retention are planned by.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa

from figures import NO_TARGET
from khipu.retention.usage import folder_bytes
from khipu.store import Store
from khipu.trace import archive
from khipu.verdicts.archive import VerdictArchive, verdict_table
from khipu.verdicts.book import VerdictBook, verdict_of
from khipu.verdicts.settle import Change

HOPS = (("orders", "producer", "processor"), ("orders-enriched", "processor", "sink"))
DAY_S = 86_400


def traces_of(first: int, messages: int, at_ms: int) -> pa.Table:
    """Six traces per message: SENT and RECEIVED on each of two topics, and the sink's SENT to a third."""
    rng = np.random.default_rng(first)
    ids = [str(uuid.UUID(bytes=rng.bytes(16), version=4)) for _ in range(messages)]  # random, as applications' are
    rows: dict[str, list[object]] = {name: [] for name in archive.SCHEMA.names}
    for step, (topic, writer, reader) in enumerate((*HOPS, ("orders-final", "sink", "warehouse"))):
        for kind, location in (("SENT", writer), ("RECEIVED", reader)):
            rows["message_id"] += ids
            rows["stream"] += ["orders"] * messages
            rows["location"] += [location] * messages
            rows["cluster"] += ["local"] * messages
            rows["type"] += [kind] * messages
            times = at_ms + step * 40 + rng.integers(0, 2_000, messages)
            rows["timestamp_ms"] += times.tolist()
            rows["kafka_timestamp_ms"] += (times + 3).tolist()
            rows["topic"] += [topic] * messages
            rows["partition"] += rng.integers(0, 12, messages).tolist()
            rows["offset"] += (first // 12 + rng.integers(0, messages // 12 + 1, messages)).tolist()
            rows["group"] += [None if kind == "SENT" else f"{reader}-group"] * messages
            rows["emitter_id"] += [f"{location}-{kind.lower()}-7f3a9c"] * messages
            rows["emitter_seq"] += (first + np.arange(messages)).tolist()
            rows["sampling_percent"] += [100.0] * messages
            rows["attributes"] += [
                json.dumps({"customer": f"c-{i % 5000}"}) if kind == "SENT" else None for i in range(messages)
            ]
            rows["prev_offsets"] += [None] * messages
            rows["key_hash"] += [f"{h:08x}" for h in rng.integers(0, 2**32, messages)]
            rows["tombstone"] += [False] * messages
            rows["transactional"] += [False] * messages
            rows["read_uncommitted"] += [False] * messages
    return pa.table(rows, schema=archive.SCHEMA)


def delivered_of(table: pa.Table) -> list[dict[str, object]]:
    """One plain DELIVERED verdict per read hop of each message (three a message)."""
    received = table.filter(pa.compute.equal(table.column("type"), "RECEIVED")).to_pylist()
    return [
        {
            "message_id": r["message_id"],
            "hop": f"local/{r['topic']} -> {r['group']}",
            "stream": "orders",
            "hop_kind": "read",
            "verdict": "DELIVERED",
            "cause": None,
            "count": 1,
            "topic": r["topic"],
            "partition": r["partition"],
            "offset": r["offset"],
            "group": r["group"],
            "location": r["location"],
            "observed_ms": r["timestamp_ms"],
            "latency_ms": 40,
            "e2e_latency_ms": 120,
            "decided_ms": r["timestamp_ms"] + 3_000,
            "detail": "",
            "first_seen_ms": r["timestamp_ms"] - 40,
        }
        for r in received
    ]


def sqlite_bytes(store: Store) -> int:
    """The SQLite store's file, its write-ahead log folded in first (what its rows take, not what the log holds)."""
    with store.engine.begin() as tx:
        tx.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    return store.engine.size_bytes() or 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=int, default=1_200_000, help="traces written to the archives")
    parser.add_argument("--batch", type=int, default=50_000, help="traces per micro-batch (25,000/s x 2 s)")
    parser.add_argument("--rate", type=int, default=25_000, help="traces/s the disk per day is given for")
    parser.add_argument("--store-verdicts", type=int, default=50_000, help="verdict rows written to the SQL store")
    parser.add_argument(
        "--index-keep-h",
        type=float,
        default=2.5,
        help="hours the detector keeps the verdict archive's index (twice its max wait + 1 h: 2.5 by default)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="khipu-storage-"))
    try:
        at = int(time.time() * 1000) // 3_600_000 * 3_600_000
        per_batch = max(1, args.batch // 6)
        written = verdicts = indexed_rows = 0
        store = Store(f"sqlite:///{work / 'khipu.db'}")
        store.migrate()
        empty = sqlite_bytes(store)
        with VerdictArchive(work / "verdicts", store) as verdict_archive:
            batch = 0
            while written < args.traces:
                table = traces_of(batch * per_batch, per_batch, at + batch * 2_000)
                archive.write_batch(work / "archive", batch, table)
                rows = delivered_of(table)
                verdict_archive.write_batch(batch, verdict_table(rows))
                hour = archive.hour_of(at + batch * 2_000)
                indexed_rows += verdict_archive.index.record(
                    batch, {(r["message_id"], r["first_seen_ms"], hour) for r in rows}
                )
                written, verdicts, batch = written + table.num_rows, verdicts + len(rows), batch + 1
                print(f"  batch {batch}: {written:,} traces, {verdicts:,} archived verdicts", flush=True)
        trace_bytes = folder_bytes(work / "archive")
        verdict_files = folder_bytes(work / "verdicts")
        indexed = sqlite_bytes(store)
        index_bytes = indexed - empty  # the index's rows, in the store

        exceptions = [
            {**row, "verdict": "DUPLICATE", "count": 2}
            for row in delivered_of(traces_of(10**9, max(1, args.store_verdicts // 3), at))[: args.store_verdicts]
        ]
        book = VerdictBook(store.verdicts)
        for start in range(0, len(exceptions), 5_000):
            book.apply([Change(verdict_of(r), "decided") for r in exceptions[start : start + 5_000]], at)
        sql_bytes = sqlite_bytes(store) - indexed
        store.close()

        per_trace, per_verdict = trace_bytes / written, verdict_files / verdicts
        per_index_row, per_row = index_bytes / indexed_rows, sql_bytes / len(exceptions)
        day = args.rate * DAY_S
        index_rows = args.rate / 6 * args.index_keep_h * 3_600  # one row per message (six traces) and batch
        print()
        rows_label = f"SQL store (SQLite): bytes per verdict row with its history entry ({len(exceptions):,})"
        figures = [
            (f"trace archive: bytes per trace (zstd Parquet, {written:,} traces)", f"{per_trace:.1f} B"),
            (f"verdict archive: bytes per archived DELIVERED verdict (zstd Parquet, {verdicts:,})",
             f"{per_verdict:.1f} B"),
            (f"the verdict archive's index in the SQL store (SQLite): bytes per row, one per message and micro-batch "
             f"({indexed_rows:,})", f"{per_index_row:.0f} B"),
            (rows_label, f"{per_row:.0f} B"),
            (f"trace archive per day at {args.rate:,} traces/s", f"{per_trace * day / 1e9:,.0f} GB"),
            (f"verdict archive per day at {args.rate:,} traces/s (one verdict per two traces)",
             f"{per_verdict * day / 2 / 1e9:,.0f} GB"),
            (f"the verdict archive's index at {args.rate:,} traces/s, held {args.index_keep_h:g} h (the detector "
             "prunes it to that): its size at any time, not per day", f"{per_index_row * index_rows / 1e9:,.1f} GB"),
            ("SQL store per day per 1 % of messages kept as rows (3 hops a message)",
             f"{per_row * day / 6 * 3 * 0.01 / 1e9:,.1f} GB"),
        ]  # fmt: skip
        print(f"| measure (synthetic traffic through Khipu's writers, {args.batch:,}-trace micro-batches) | figure "
              "| target |")  # fmt: skip
        print("|---|---|---|")
        for label, figure in figures:  # sizes to plan disk and retention by: none has a target
            print(f"| {label} | {figure} | {NO_TARGET} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
