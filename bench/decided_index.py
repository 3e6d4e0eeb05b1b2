"""The decided-messages index's two calls per detector micro-batch, timed (not a test).

    .venv/bin/python bench/decided_index.py [--held 1000000] [--batch 25000] [--runs 7]

The detector's verdict writer, every micro-batch (25,000 messages at 25,000 traces/s), asks the verdict
archive's index which earlier batches decided the messages it judged (``find``) and records the batch's own
(``record``; a replayed batch replaces its rows). This fills the index with ``--held`` rows (batches of
``--batch`` random 32-hex message ids, as the writer records them), then times, ``--runs`` times after one
untimed warm-up of each: ``find`` of ``--batch`` ids, half of them held (random ones, from every batch) and half
never recorded; ``record`` of a new ``--batch``-message batch; ``record`` of that batch again (a replay, which
replaces its rows). Each clock covers the one call, as the writer makes it, commit included, on a kept index (the
writer keeps its own). Prints the median and the range of the runs; none has a target.

Backend: the index as this release keeps it, an SQLite file beside the verdict archive (``DecidedIndex(path)``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from figures import NO_TARGET
from khipu.trace.archive import HOUR_MS, hour_of
from khipu.verdicts.archive import DecidedIndex

T = TypeVar("T")


def random_ids(count: int) -> list[str]:
    """``count`` random 32-hex message ids (the detector's are as random: UUIDs, hashes)."""
    raw = os.urandom(16 * count)
    return [raw[i : i + 16].hex() for i in range(0, len(raw), 16)]


def timed(call: Callable[..., T], *args: Any) -> tuple[T, float]:
    """What ``call(*args)`` returned, and the seconds it took."""
    start = time.perf_counter()
    result = call(*args)
    return result, time.perf_counter() - start


def measure(index: DecidedIndex, held: int, batch: int, runs: int) -> dict[str, list[float]]:
    """Fill the index with ``held`` rows, then time ``runs`` finds, records and replays (after a warm-up)."""
    now_ms = int(time.time() * 1000)
    batches = held // batch
    recorded: list[list[str]] = []
    started = time.perf_counter()
    for number in range(batches):
        ids = random_ids(batch)
        index.record(number, [(m, now_ms, hour_of(now_ms - (batches - number) * 2_000)) for m in ids])
        recorded.append(ids)
    print(f"  filled: {index.count():,} rows in {time.perf_counter() - started:.1f} s", flush=True)
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
    return spent


def figure(seconds: list[float]) -> str:
    """``81 ms (67-127 ms)``: the median and the range."""
    return f"{statistics.median(seconds) * 1000:.0f} ms ({min(seconds) * 1000:.0f}-{max(seconds) * 1000:.0f} ms)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--held", type=int, default=1_000_000, help="rows the index holds before the timed calls")
    parser.add_argument("--batch", type=int, default=25_000, help="messages a micro-batch judges (25,000 traces/s)")
    parser.add_argument("--runs", type=int, default=7, help="timed calls of each kind (after one warm-up)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="khipu-decided-"))
    try:
        backend = "SQLite file (the verdict archive's _index/decided.sqlite)"
        print(f"{backend}: filling {args.held:,} rows", flush=True)
        index = DecidedIndex(work / "_index" / "decided.sqlite")
        try:
            spent = measure(index, args.held, args.batch, args.runs)
        finally:
            index.close()
        held = f"{args.held:,} rows held, random 32-hex ids"
        print()
        print(f"| measure ({held}; median (range) of {args.runs} runs after a warm-up) | figure | target |")
        print("|---|---|---|")
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
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
