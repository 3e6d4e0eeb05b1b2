"""The decided-messages index's two calls per detector micro-batch, timed (not a test).

    .venv/bin/python bench/decided_index.py [--held 1000000] [--batch 25000] [--runs 7] [--only sqlite|postgresql]

The detector's verdict writer, every micro-batch (25,000 messages at 25,000 traces/s), asks the verdict
archive's index which earlier batches decided the messages it judged (``find``) and records the batch's own
(``record``; a replayed batch replaces its rows). This fills the index with ``--held`` rows (batches of
``--batch`` random 32-hex message ids, as the writer records them), then times, ``--runs`` times after one
untimed warm-up of each: ``find`` of ``--batch`` ids, half of them held (random ones, from every batch) and half
never recorded; ``record`` of a new ``--batch``-message batch; ``record`` of that batch again (a replay, which
replaces its rows). Each clock covers the one call, as the writer makes it, commit included, on an index and store
kept open (the writer keeps its own, with the store's pooled connection). Prints the median and the range of the
runs; none has a target.

Backends: the index as this release keeps it, in the store (``store.decided`` through ``DecidedIndex(store)``): a
fresh SQLite store file, and a fresh database on the PostgreSQL server ``KHIPU_BENCH_POSTGRES_DSN`` names (an admin
DSN; default the local one ``make test`` starts), dropped afterwards. The release before kept it in an SQLite file
beside the verdict archive: this script at commit 1e96a77 times that file the same way.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from figures import NO_TARGET
from khipu.store import Store
from khipu.trace.archive import HOUR_MS, hour_of
from khipu.verdicts.archive import DecidedIndex
from postgres import postgres_database

T = TypeVar("T")
BACKENDS = {"sqlite": "SQLite store", "postgresql": "PostgreSQL store"}


def random_ids(count: int) -> list[str]:
    """``count`` random 32-hex message ids (the detector's are as random: UUIDs, hashes)."""
    raw = os.urandom(16 * count)
    return [raw[i : i + 16].hex() for i in range(0, len(raw), 16)]


def timed(call: Callable[..., T], *args: Any) -> tuple[T, float]:
    """What ``call(*args)`` returned, and the seconds it took."""
    start = time.perf_counter()
    result = call(*args)
    return result, time.perf_counter() - start


def measure(
    index: DecidedIndex, held: int, batch: int, runs: int, size_bytes: Callable[[], int]
) -> tuple[dict[str, list[float]], float]:
    """Fill the index with ``held`` rows, then time ``runs`` finds, records and replays (after a warm-up). Returns
    the seconds of each, and the bytes a row took once filled (``size_bytes``: the store's, before and after)."""
    empty = size_bytes()
    now_ms = int(time.time() * 1000)
    batches = held // batch
    recorded: list[list[str]] = []
    started = time.perf_counter()
    for number in range(batches):
        ids = random_ids(batch)
        index.record(number, [(m, now_ms, hour_of(now_ms - (batches - number) * 2_000)) for m in ids])
        recorded.append(ids)
    filled = index.count()
    per_row = (size_bytes() - empty) / filled
    print(f"  filled: {filled:,} rows in {time.perf_counter() - started:.1f} s, {per_row:.0f} bytes a row", flush=True)
    spent: dict[str, list[float]] = {"find": [], "record": [], "replay": []}
    for run in range(runs + 1):  # the first: a warm-up, not counted
        known = [recorded[(run * 7 + n) % batches][(run * 13 + n) % batch] for n in range(batch // 2)]
        asked = known + random_ids(batch - len(known))
        found, took = timed(index.find, asked)
        if len(found) != len(known):
            raise SystemExit(f"find: {len(found):,} of the {len(known):,} held ids asked were found")
        rows = [(m, now_ms, hour_of(now_ms + HOUR_MS)) for m in random_ids(batch)]
        number = batches + run
        _, wrote = timed(index.record, number, rows)
        _, again = timed(index.record, number, rows)
        if run:
            spent["find"].append(took)
            spent["record"].append(wrote)
            spent["replay"].append(again)
    return spent, per_row


def size_of(store: Store) -> int:
    """The bytes the store takes: SQLite's file, its write-ahead log folded in first; on PostgreSQL the index's
    tables with their indexes (nothing else of a fresh database grows)."""
    with store.engine.begin() as tx:
        if tx.dialect.name == "postgresql":
            sizes = " + ".join(f"pg_total_relation_size('{table}')" for table in ("decided", "decided_batches"))
            return int(tx.exec_driver_sql(f"SELECT {sizes}").scalar_one())
        tx.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    return store.engine.size_bytes() or 0


@contextmanager
def store_of(backend: str, work: Path) -> Iterator[Store]:
    """A fresh, migrated store: an SQLite file in ``work``, or a database of its own on the PostgreSQL server
    (dropped afterwards)."""
    if backend == "sqlite":
        store = Store(f"sqlite:///{work / 'khipu.db'}")
        store.migrate()
        try:
            yield store
        finally:
            store.close()
        return
    with postgres_database("khipu_bench_decided") as url:
        store = Store(url)
        store.migrate()
        try:
            yield store
        finally:
            store.close()


def figure(seconds: list[float]) -> str:
    """``81 ms (67-127 ms)``: the median and the range."""
    return f"{statistics.median(seconds) * 1000:.0f} ms ({min(seconds) * 1000:.0f}-{max(seconds) * 1000:.0f} ms)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--held", type=int, default=1_000_000, help="rows the index holds before the timed calls")
    parser.add_argument("--batch", type=int, default=25_000, help="messages a micro-batch judges (25,000 traces/s)")
    parser.add_argument("--runs", type=int, default=7, help="timed calls of each kind (after one warm-up)")
    parser.add_argument("--only", choices=sorted(BACKENDS), help="one backend (default: both, one after the other)")
    args = parser.parse_args()
    measured: list[tuple[str, dict[str, list[float]], float]] = []
    for backend in [args.only] if args.only else list(BACKENDS):
        work = Path(tempfile.mkdtemp(prefix="khipu-decided-"))
        try:
            print(f"{BACKENDS[backend]}: filling {args.held:,} rows", flush=True)
            with store_of(backend, work) as store:
                spent, per_row = measure(DecidedIndex(store), args.held, args.batch, args.runs, lambda: size_of(store))
                measured.append((BACKENDS[backend], spent, per_row))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    held = f"{args.held:,} rows held, random 32-hex ids"
    print()
    print(f"| measure ({held}; median (range) of {args.runs} runs after a warm-up) | figure | target |")
    print("|---|---|---|")
    for backend, spent, per_row in measured:
        print(f"| {backend}: bytes a row takes, {args.held:,} rows held (the store's growth from empty) | "
              f"{per_row:.0f} B | {NO_TARGET} |")  # fmt: skip
        lines = [
            (f"{backend}: find of {args.batch:,} ids, half held (clock: the call, to its dict of decisions)",
             spent["find"]),
            (f"{backend}: record of a new {args.batch:,}-message batch (clock: the call, commit included)",
             spent["record"]),
            (f"{backend}: record of the same batch again, a replay replacing its rows (clock: the call, commit "
             "included)", spent["replay"]),
        ]  # fmt: skip
        for label, seconds in lines:
            print(f"| {label} | {figure(seconds)} | {NO_TARGET} |")


if __name__ == "__main__":
    main()
