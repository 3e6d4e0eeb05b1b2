"""Reconciliation on real Spark reads a compacted hour (partition discovery: ``batch_id=-2`` beside micro-batch ids)
as it read the hour's micro-batches: the same verdicts, the same history, the same report, whether the hours were
compacted or stopped half-way (the compacted files and the batch folders both there).

Both archives are written by the detector's writers (khipu.trace.archive.write_batch, VerdictArchive.write_batch),
a micro-batch of a few messages at a time, some traces archived twice (a checkpoint that read the topic again),
then compacted (khipu.retention.compaction) into several files an hour. Each layout is reconciled from the same
SQL verdicts into a store of its own.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from khipu.detector.decide import Lookups
from khipu.detector.model import DetectorConfig
from khipu.reconcile.run import reconcile
from khipu.reconcile.window import ReconcileWindow
from khipu.registry import parse_registry
from khipu.retention.compaction import compact_archive
from khipu.storage.compaction import COMPACTED_FOLDER
from khipu.storage.location import Location
from khipu.store import Store
from khipu.trace import archive
from khipu.trace.archive import HOUR_MS, hour_of
from khipu.verdicts import archive as verdicts
from khipu.verdicts.archive import VerdictArchive, verdict_table
from khipu.verdicts.book import VerdictBook, verdict_row
from khipu.verdicts.model import Cause, Verdict, VerdictKind
from khipu.verdicts.settle import Change

pytestmark = pytest.mark.integration

REGISTRY = parse_registry("""
version: 1
clusters: {local: {}}
streams:
  orders:
    owner: team-t
    route:
      producers: [{location: p, writes: [local/in]}]
      consumers:
        - {group: s1, reads: [local/in]}
""")
T0 = 1_795_000_000_000 // HOUR_MS * HOUR_MS
CONFIG = DetectorConfig(grace_ms=4_000, max_wait_ms=60_000, recheck_ms=1_000)
WINDOW = ReconcileWindow(T0, T0 + HOUR_MS, horizon_ms=HOUR_MS)
NOW = T0 + 3 * HOUR_MS
WRITE, READ = "p -> local/in", "local/in -> s1"
FILLER = 400  # delivered messages, archived everywhere: what makes an hour many files


def trace(message: str, kind: str, offset: int, at_ms: int, prev: list[int] | None = None) -> dict[str, Any]:
    location, group = ("p", None) if kind == "SENT" else ("s1", "s1")
    return {"message_id": message, "stream": "orders", "location": location, "cluster": "local", "type": kind,
            "timestamp_ms": at_ms, "topic": "in", "partition": 0, "offset": offset, "group": group,
            "emitter_id": f"{location}-e", "emitter_seq": at_ms - T0, "sampling_percent": 100.0, "attributes": None,
            "prev_offsets": prev, "kafka_timestamp_ms": at_ms}  # fmt: skip


def verdict(message: str, kind: VerdictKind, offset: int, hop: str, decided_ms: int) -> Verdict:
    read = hop == READ
    return Verdict(
        message_id=message, stream="orders", hop=hop, hop_kind="read" if read else "write", kind=kind,
        cause=Cause.SKIPPED_BY_CONSUMER if kind is VerdictKind.LOST else None,
        count=1 if kind is VerdictKind.DELIVERED else 0, topic="in", partition=0, offset=offset,
        group="s1" if read else None, location=None if read else "p", observed_ms=None, latency_ms=None,
        e2e_latency_ms=None, decided_ms=decided_ms, detail="streaming", first_seen_ms=T0 + 1_000,
    )  # fmt: skip


def situations() -> list[dict[str, Any]]:
    """One message per situation reconciliation settles (as test_reconcile_archive.py), offsets 1..9."""
    return [
        trace("m-late", "SENT", 1, T0 + 1_000), trace("m-late", "RECEIVED", 1, T0 + 2_400_000),  # LOST, found late
        trace("m-gone", "SENT", 2, T0 + 2_000),  # LOST and still missing
        trace("m-unjudged", "SENT", 4, T0 + 4_000), trace("m-unjudged", "RECEIVED", 4, T0 + 4_500),  # never judged
        trace("m-twice", "SENT", 5, T0 + 5_000), trace("m-twice", "RECEIVED", 5, T0 + 5_500),
        trace("m-twice", "RECEIVED", 5, T0 + 900_000),  # read again after the detector decided: a DUPLICATE
        trace("m-next", "SENT", 9, T0 + HOUR_MS + 5_000),  # another window's
        trace("m-after", "SENT", 8, T0 + 8_000), trace("m-after", "RECEIVED", 8, T0 + 8_500, prev=[7]),  # a lead
    ]  # fmt: skip


@pytest.fixture
def layouts(tmp_path: Path) -> dict[str, Path]:
    """The same archives three ways: as the detector wrote them, compacted, and stopped half-way through a
    compaction (its files written, the batch folders not deleted yet)."""
    written = tmp_path / "written"
    index = Store(f"sqlite:///{tmp_path / 'index.db'}")
    index.migrate()
    rows = situations()
    for n in range(FILLER):  # delivered filler, a trace a few seconds apart over the window's hour and the next
        at = T0 + 10_000 + n * 15_000
        rows += [trace(f"f-{n}", "SENT", 100 + n, at), trace(f"f-{n}", "RECEIVED", 100 + n, at + 300)]
    rows.sort(key=lambda r: r["timestamp_ms"])
    with VerdictArchive(written / "verdicts", index) as verdict_archive:
        for batch, start in enumerate(range(0, len(rows), 8)):  # 8 traces a micro-batch
            chunk = rows[start : start + 8]
            archive.write_batch(written / "archive", batch, pa.Table.from_pylist(chunk, schema=archive.SCHEMA))
            done = sorted({r["message_id"] for r in chunk if r["message_id"].startswith("f-")})
            decided = max(r["timestamp_ms"] for r in chunk) + 2_000
            archived = [verdict(m, VerdictKind.DELIVERED, 0, hop, decided) for m in done for hop in (WRITE, READ)]
            archived += [verdict(m, VerdictKind.DELIVERED, o, WRITE, decided) for m, o in (("m-late", 1), ("m-gone", 2))
                         if any(r["message_id"] == m for r in chunk)]  # fmt: skip
            verdict_archive.write_batch(batch, verdict_table([verdict_row(v) for v in archived]))
        last = batch
        again = [r for r in rows if T0 + 600_000 <= r["timestamp_ms"] < T0 + 700_000]  # read again: archived twice
        again_table = pa.Table.from_pylist(again, schema=archive.SCHEMA)
        archive.write_batch(written / "archive", 179_500_000_000_000_000 + last, again_table)
        # the batches after, empty: no hour holds the one batch Spark may still replay
        archive.write_batch(written / "archive", 179_500_000_000_000_001 + last, again_table.slice(0, 0))
        verdict_archive.write_batch(last + 1, verdict_table([]))
    index.close()

    compacted = tmp_path / "compacted"
    shutil.copytree(written, compacted)
    for name, spec in (("archive", archive.COMPACTION), ("verdicts", verdicts.COMPACTION)):
        size = sum(p.stat().st_size for p in (written / name).rglob("*.parquet"))
        done = compact_archive(Location.of(compacted / name), spec, NOW, size // 8)
        assert [h.hour for h in done.hours] == [hour_of(T0), hour_of(T0 + HOUR_MS)]
        assert all(h.compaction and 1 < h.compaction.files_after < h.compaction.files_before for h in done.hours)
    half_way = tmp_path / "half-way"
    shutil.copytree(compacted, half_way)
    shutil.copytree(written, half_way, dirs_exist_ok=True)  # the batch folders back beside the compacted files
    return {"written": written, "compacted": compacted, "half-way": half_way}


def every_group_past(cluster: str, group: str, topic: str, partition: int) -> int | None:
    return 100_000


def reconciled(spark: Any, data: Path, tmp_path: Path) -> tuple[list[dict[str, Any]], list[Any], dict[str, Any]]:
    """Reconcile the window over these archives from the detector's SQL verdicts: the store's rows and history
    after, and the report's figures."""
    store = Store(f"sqlite:///{tmp_path / f'{data.name}.db'}")
    store.migrate()
    stored = [
        verdict("m-late", VerdictKind.LOST, 1, READ, T0 + 60_000),
        verdict("m-gone", VerdictKind.LOST, 2, READ, T0 + 60_000),
        verdict("m-twice", VerdictKind.PENDING, 5, WRITE, T0 + 60_000),
    ]
    VerdictBook(store.verdicts).apply([Change(v, "decided") for v in stored], T0 + 60_000)
    report = reconcile(
        spark, data / "archive", WINDOW, REGISTRY, VerdictBook(store.verdicts), Lookups(every_group_past), CONFIG,
        NOW, verdict_archive_dir=data / "verdicts",
    )  # fmt: skip
    rows = sorted(store.verdicts.rows(), key=lambda r: (r["message_id"], r["hop"]))
    history = [(m, h["hop"], h["from_verdict"], h["to_verdict"]) for m in ("m-late", "m-gone", "m-twice", "m-unjudged")
               for h in store.verdicts.history(m)]  # fmt: skip
    figures = {"window": report.window_messages, "redecided": report.redecided, "by_kind": report.by_kind,
               "leads": [(lead.offset, lead.location) for lead in report.leads]}  # fmt: skip
    store.close()
    return rows, history, figures


def test_a_compacted_hour_reconciles_to_the_same_verdicts_as_its_micro_batches(
    spark: Any, layouts: dict[str, Path], tmp_path: Path
) -> None:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    assert sorted(p.name for p in (layouts["compacted"] / "archive").glob("hour=*/*")) == [COMPACTED_FOLDER] * 2
    rows, history, figures = reconciled(spark, layouts["written"], tmp_path)
    # what the written layout settles: the situations' verdicts (the filler, archived DELIVERED, is final)
    verdict_of = {(r["message_id"], r["hop"]): (r["verdict"], r["count"]) for r in rows}
    assert verdict_of[("m-late", READ)][0] == "RETRACTED" and verdict_of[("m-gone", READ)][0] == "CONFIRMED_LOST"
    assert verdict_of[("m-twice", READ)] == ("DUPLICATE", 2) and verdict_of[("m-twice", WRITE)][0] == "DELIVERED"
    assert figures["window"] == 240 + 5 and figures["leads"] == [(7, "s1")]  # 240 fillers start in the window

    for layout in ("compacted", "half-way"):
        assert reconciled(spark, layouts[layout], tmp_path) == (rows, history, figures), layout
