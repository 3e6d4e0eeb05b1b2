"""Reconciliation on real Spark over an archive laid out as the detector writes it, with a real store.

The archive holds one message per situation; the store holds what the streaming detector had
said of them. Committed offsets are the lookups' answers (every group past every message), given
as data: this test is about reading the archive and settling verdicts, the detector's tests
about asking brokers.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from khipu.detector.decide import Lookups
from khipu.detector.model import DetectorConfig
from khipu.reconcile.run import reconcile
from khipu.reconcile.window import ReconcileWindow
from khipu.registry import parse_registry
from khipu.store import Store
from khipu.trace.archive import HOUR_MS, hour_of
from khipu.verdicts.archive import VerdictArchive, verdict_table
from khipu.verdicts.book import VerdictBook, verdict_row
from khipu.verdicts.model import Cause, Verdict, VerdictKind
from khipu.verdicts.settle import Change

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
T0 = 1_795_000_000_000 // HOUR_MS * HOUR_MS  # an hour boundary
CONFIG = DetectorConfig(grace_ms=4_000, max_wait_ms=60_000, recheck_ms=1_000)
WINDOW = ReconcileWindow(T0, T0 + HOUR_MS, horizon_ms=HOUR_MS)
NOW = T0 + 3 * HOUR_MS
COLUMNS = (
    "message_id string, stream string, location string, cluster string, type string, timestamp_ms long, "
    "topic string, partition int, offset long, `group` string, emitter_id string, emitter_seq long, "
    "sampling_percent double, attributes string, prev_offsets array<long>"
)


def trace(message: str, kind: str, offset: int, at_ms: int, prev: list[int] | None = None) -> tuple[Any, ...]:
    location, group = ("p", None) if kind == "SENT" else ("s1", "s1")
    return (
        message,
        "orders",
        location,
        "local",
        kind,
        at_ms,
        "in",
        0,
        offset,
        group,
        f"{location}-e",
        offset,
        100.0,
        None,
        prev,
    )


def stored(message: str, kind: VerdictKind, offset: int, hop: str = "local/in -> s1") -> Verdict:
    read = hop.endswith("s1")
    return Verdict(
        message_id=message,
        stream="orders",
        hop=hop,
        hop_kind="read" if read else "write",
        kind=kind,
        cause=Cause.SKIPPED_BY_CONSUMER if kind is VerdictKind.LOST else None,
        count=1 if kind is VerdictKind.DELIVERED else 0,
        topic="in",
        partition=0,
        offset=offset,
        group="s1" if read else None,
        location=None if read else "p",
        observed_ms=None,
        latency_ms=None,
        e2e_latency_ms=None,
        decided_ms=T0 + 60_000,
        detail="streaming",
        first_seen_ms=T0 + 1_000,
    )


@pytest.fixture()
def archive(spark: Any, tmp_path: Path) -> Path:
    rows = [
        # m-late: LOST by the detector; its RECEIVED trace came 40 minutes later
        trace("m-late", "SENT", 1, T0 + 1_000),
        trace("m-late", "RECEIVED", 1, T0 + 2_400_000),
        # m-gone: LOST and still missing
        trace("m-gone", "SENT", 2, T0 + 2_000),
        # m-fine: delivered, final already
        trace("m-fine", "SENT", 3, T0 + 3_000),
        trace("m-fine", "RECEIVED", 3, T0 + 3_500),
        # m-unjudged: the detector never stored anything (it was down)
        trace("m-unjudged", "SENT", 4, T0 + 4_000),
        trace("m-unjudged", "RECEIVED", 4, T0 + 4_500),
        # m-next: first seen after the window: another run's
        trace("m-next", "SENT", 9, T0 + HOUR_MS + 5_000),
        # s1 points back at offset 7, where no trace of any message lies: a lead
        trace("m-after", "SENT", 8, T0 + 8_000),
        trace("m-after", "RECEIVED", 8, T0 + 8_500, prev=[7]),
    ]
    frame = spark.createDataFrame(rows, COLUMNS)
    directory = tmp_path / "archive"
    for hour in {hour_of(r[5]) for r in rows}:
        part = frame.where(f"date_format(timestamp_millis(timestamp_ms), 'yyyy-MM-dd-HH') = '{hour}'")
        part.write.parquet(str(directory / f"hour={hour}" / "batch_id=0"))
    return directory


def every_group_past(cluster: str, group: str, topic: str, partition: int) -> int | None:
    return 1_000


@pytest.mark.parametrize("chunk_messages", [5_000, 1], ids=["one chunk", "a chunk per message"])
def test_reconciliation_confirms_retracts_fills_in_and_is_idempotent(
    spark: Any, archive: Path, tmp_path: Path, chunk_messages: int
) -> None:
    # the driver judges the exceptions a chunk at a time: the verdicts must not depend on how they are split
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    first = [
        stored("m-late", VerdictKind.LOST, 1),
        stored("m-gone", VerdictKind.LOST, 2),
        stored("m-fine", VerdictKind.DELIVERED, 3),
        stored("m-fine", VerdictKind.DELIVERED, 3, hop="p -> local/in"),
    ]
    VerdictBook(store.verdicts).apply([Change(v, "decided") for v in first], T0 + 60_000)

    lines: list[str] = []
    report = reconcile(
        spark,
        archive,
        WINDOW,
        REGISTRY,
        VerdictBook(store.verdicts),
        Lookups(every_group_past),
        CONFIG,
        NOW,
        progress=lines.append,
        chunk_messages=chunk_messages,
    )

    assert report.window_messages == 5 and report.redecided == 4  # m-fine is final; m-next is not in the window
    rows = {(v["message_id"], v["hop"]): v for v in store.verdicts.rows()}
    late = rows[("m-late", "local/in -> s1")]
    assert (late["verdict"], late["evidence_kind"], late["decided_by"]) == ("RETRACTED", "DELIVERED", "reconciliation")
    assert "LOST at" in late["detail"] and "retracted: RECEIVED trace at" in late["detail"]
    gone = rows[("m-gone", "local/in -> s1")]
    assert (gone["verdict"], gone["cause"]) == ("CONFIRMED_LOST", "skipped_by_consumer")
    assert rows[("m-unjudged", "local/in -> s1")]["verdict"] == "DELIVERED"
    assert rows[("m-fine", "local/in -> s1")]["decided_by"] == "detector"  # not touched
    history = store.verdicts.history("m-late")
    read_hop = [(h["from_verdict"], h["to_verdict"], h["decided_by"]) for h in history if h["hop"] == "local/in -> s1"]
    assert read_hop == [(None, "LOST", "detector"), ("LOST", "RETRACTED", "reconciliation")]
    assert [(lead.offset, lead.location) for lead in report.leads] == [(7, "s1")]
    assert report.leads[0].message_id is None and report.leads[0].why_unknown
    chunked = [line for line in lines if line.startswith("re-decided ")]
    assert chunked[-1].startswith("re-decided 4 messages of 5")  # m-fine has no archived verdict: it is asked
    assert len(chunked) == (1 if chunk_messages > 5 else 5)  # one progress line per chunk

    again = reconcile(
        spark, archive, WINDOW, REGISTRY, VerdictBook(store.verdicts), Lookups(every_group_past), CONFIG, NOW
    )
    assert again.changes == () and again.redecided == 0  # every message of the window is final now
    assert {(v["message_id"], v["hop"]): v["verdict"] for v in store.verdicts.rows()} == {
        key: row["verdict"] for key, row in rows.items()
    }
    store.close()


def test_traces_archived_again_by_a_new_checkpoint_count_once(spark: Any, archive: Path, tmp_path: Path) -> None:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    hour = archive / f"hour={hour_of(T0)}"
    shutil.copytree(hour / "batch_id=0", hour / "batch_id=179500000000000003")  # the same records, read again
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    VerdictBook(store.verdicts).apply([Change(stored("m-gone", VerdictKind.LOST, 2), "decided")], T0 + 60_000)

    reconcile(spark, archive, WINDOW, REGISTRY, VerdictBook(store.verdicts), Lookups(every_group_past), CONFIG, NOW)

    rows = {(v["message_id"], v["hop"]): v for v in store.verdicts.rows()}
    unjudged = rows[("m-unjudged", "local/in -> s1")]
    assert (unjudged["verdict"], unjudged["count"]) == ("DELIVERED", 1)  # not a DUPLICATE of itself
    fine = rows[("m-fine", "p -> local/in")]
    assert (fine["verdict"], fine["count"]) == ("DELIVERED", 1)
    assert rows[("m-gone", "local/in -> s1")]["verdict"] == "CONFIRMED_LOST"
    store.close()


def test_a_dry_run_says_what_would_change_and_writes_nothing(spark: Any, archive: Path, tmp_path: Path) -> None:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    VerdictBook(store.verdicts).apply([Change(stored("m-gone", VerdictKind.LOST, 2), "decided")], T0 + 60_000)
    before = store.verdicts.rows()
    report = reconcile(
        spark,
        archive,
        WINDOW,
        REGISTRY,
        VerdictBook(store.verdicts),
        Lookups(every_group_past),
        CONFIG,
        NOW,
        dry_run=True,
    )
    assert [c.verdict.kind for c in report.confirmed_losses] == [VerdictKind.CONFIRMED_LOST]
    assert store.verdicts.rows() == before
    store.close()


def test_streams_filter_keeps_other_streams_out(spark: Any, archive: Path, tmp_path: Path) -> None:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    window = dataclasses.replace(WINDOW, streams=("payments",))
    report = reconcile(
        spark, archive, window, REGISTRY, VerdictBook(store.verdicts), Lookups(every_group_past), CONFIG, NOW
    )
    assert report.window_messages == 0 and report.changes == ()
    store.close()


WRITE, READ = "p -> local/in", "local/in -> s1"


def delivered(message: str, offset: int, hop: str) -> Verdict:
    return dataclasses.replace(stored(message, VerdictKind.DELIVERED, offset, hop=hop), count=1)


@pytest.fixture()
def verdict_archive(tmp_path: Path) -> Iterator[VerdictArchive]:
    """The plain DELIVERED verdicts the detector archived (not SQL rows): m-fine and m-after everywhere, the write
    hop of m-late and m-gone, and m-twice's read hop (read once, as the detector saw it; its write hop is an SQL
    PENDING)."""
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    archive = VerdictArchive(tmp_path / "verdicts", store)
    archived = [
        delivered("m-fine", 3, WRITE),
        delivered("m-fine", 3, READ),
        delivered("m-after", 8, WRITE),
        delivered("m-after", 8, READ),
        delivered("m-late", 1, WRITE),
        delivered("m-gone", 2, WRITE),
        delivered("m-twice", 5, READ),
    ]
    archive.write_batch(0, verdict_table([verdict_row(v) for v in archived]))
    yield archive
    store.close()


def test_an_all_archived_message_is_final_and_one_with_an_open_sql_verdict_is_redecided(
    spark: Any, archive: Path, verdict_archive: VerdictArchive, tmp_path: Path
) -> None:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    twice = [trace("m-twice", "SENT", 5, T0 + 5_000), trace("m-twice", "RECEIVED", 5, T0 + 5_500)]
    twice.append(trace("m-twice", "RECEIVED", 5, T0 + 900_000))  # read again after the detector decided
    frame = spark.createDataFrame(twice, COLUMNS)
    frame.write.parquet(str(archive / f"hour={hour_of(T0)}" / "batch_id=1"))
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    open_rows = [
        stored("m-late", VerdictKind.LOST, 1),
        stored("m-gone", VerdictKind.LOST, 2),
        dataclasses.replace(delivered("m-twice", 5, WRITE), kind=VerdictKind.PENDING, count=0),
    ]
    VerdictBook(store.verdicts).apply([Change(v, "decided") for v in open_rows], T0 + 60_000)

    def run() -> Any:
        return reconcile(
            spark,
            archive,
            WINDOW,
            REGISTRY,
            VerdictBook(store.verdicts),
            Lookups(every_group_past),
            CONFIG,
            NOW,
            verdict_archive_dir=verdict_archive.root,
        )

    report = run()
    # m-fine and m-after: archived DELIVERED everywhere, final; m-late, m-gone, m-twice: an open SQL verdict;
    # m-unjudged: no verdict anywhere
    assert report.window_messages == 6 and report.redecided == 4
    rows = {(v["message_id"], v["hop"]): v for v in store.verdicts.rows()}
    assert (rows[("m-late", READ)]["verdict"], rows[("m-gone", READ)]["verdict"]) == ("RETRACTED", "CONFIRMED_LOST")
    assert rows[("m-twice", WRITE)]["verdict"] == "DELIVERED"  # the PENDING decided
    assert (rows[("m-twice", READ)]["verdict"], rows[("m-twice", READ)]["count"]) == ("DUPLICATE", 2)
    assert [(h["from_verdict"], h["to_verdict"]) for h in store.verdicts.history("m-twice") if h["hop"] == READ] == [
        (None, "DELIVERED"),  # the archived verdict's first decision, written when something replaces it
        ("DELIVERED", "DUPLICATE"),  # the archived verdict, changed: the SQL row now wins over it
    ]
    assert {(v["message_id"], v["hop"]) for v in verdict_archive.read()} & set(rows) == {("m-twice", READ)}
    assert not any(m in ("m-fine", "m-after") for m, _ in rows)  # never re-decided, never copied into SQL
    assert not {("m-late", WRITE), ("m-gone", WRITE)} & set(rows)  # agreeing with the archive writes nothing
    assert {hop for m, hop in rows if m == "m-unjudged"} == {WRITE, READ}
    assert list(archive.parent.glob(".khipu-reconcile-*")) == []  # the open verdicts' file, written for Spark, gone

    again = run()
    assert again.redecided == 0 and again.changes == ()
    assert {(v["message_id"], v["hop"]): v["verdict"] for v in store.verdicts.rows()} == {
        key: row["verdict"] for key, row in rows.items()
    }
    store.close()
