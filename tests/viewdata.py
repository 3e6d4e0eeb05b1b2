"""A store and a trace archive holding what the Khipu view shows, for the view's, API's, CLI's and exporter's tests.

Written through the store's own repositories (and the archive as the detector lays it out: Parquet
under ``hour=YYYY-MM-DD-HH/batch_id=N``), so the pages read exactly what production writes. The
figures the tests expect are computed by the tests from what is written here, never copied.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import insert

from khipu.alerting.decide import Transition
from khipu.alerting.model import Alert, AlertState, Severity
from khipu.detector.model import DETECTOR_QUERY
from khipu.health.evaluate import PartitionHealth
from khipu.health.rules import PartitionStatus
from khipu.health.windows import OffsetWindow, WindowKind
from khipu.offsets.model import PartitionKey, PartitionSnapshot, SnapshotRun
from khipu.registry.model import Registry
from khipu.store import Store, schema
from khipu.store.heartbeat import PartitionTrail, TraceSkip
from khipu.trace.archive import hour_folder
from khipu.verdicts.metrics import counts_by_minute, metrics_of

STREAM = "demo.orders"
PRODUCE = "demo-producer -> local/demo.orders"
ENRICH_READ = "local/demo.orders -> demo-enricher"
ENRICH_WRITE = "demo-enricher -> local/demo.orders-enriched"
STORE_READ = "local/demo.orders-enriched -> demo-sink-store"
AUDIT_READ = "local/demo.orders-enriched -> demo-sink-audit"
HOPS = (PRODUCE, ENRICH_READ, ENRICH_WRITE, STORE_READ, AUDIT_READ)
KIND = {PRODUCE: "write", ENRICH_READ: "read", ENRICH_WRITE: "write", STORE_READ: "read", AUDIT_READ: "read"}
SEED_PART = "seed"  # the metric part the seeded verdicts are counted in
GROUP = {ENRICH_READ: "demo-enricher", STORE_READ: "demo-sink-store", AUDIT_READ: "demo-sink-audit"}


# What the figures count, as docs/detector.md and docs/view.md say, for the tests' own expectations: ABORTED and
# SUPERSEDED are Kafka working as designed (in no rate's denominator); a duplicate an exactly-once processor made
# reprocessing after an abort is no duplicate against the stream; a negative latency is clock skew, in no percentile.
APART = ("ABORTED", "SUPERSEDED")


def judged(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The verdicts a rate is a share of."""
    return [row for row in rows if row["verdict"] not in APART]


def a_duplicate(row: dict[str, Any]) -> bool:
    """A DUPLICATE counted against the stream."""
    return row["verdict"] == "DUPLICATE" and row.get("cause") != "reprocessed_after_abort"


def a_latency(row: dict[str, Any]) -> bool:
    """The row has a latency a percentile counts (one clock skew made negative is not)."""
    return row["latency_ms"] is not None and row["latency_ms"] >= 0


@dataclass
class Seeded:
    now_ms: int
    skipped: str  # LOST at AUDIT_READ, skipped_by_consumer (traces in the archive, with an order_id)
    dropped: str  # CONFIRMED_LOST at ENRICH_WRITE, dropped_in_processor, history LOST -> CONFIRMED_LOST
    retracted: str  # RETRACTED at STORE_READ, history LOST -> RETRACTED
    duplicated: str  # DUPLICATE at STORE_READ
    order_id: str  # the skipped message's recovery attribute
    aborted: str = "view-abort-1"  # ABORTED at PRODUCE (its transaction aborted) and at ENRICH_READ (never seen)
    superseded: str = "view-compacted-1"  # SUPERSEDED/compacted at AUDIT_READ
    reprocessed: str = "view-reprocessed-1"  # DUPLICATE/reprocessed_after_abort at ENRICH_READ
    skewed: str = "view-skew-1"  # DELIVERED at STORE_READ with a latency of -30.4 s (clock skew)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    stalled: PartitionKey | None = None
    gaps: int = 0
    quarantined: int = 0


def verdict(message_id: str, hop: str, kind: str, decided_ms: int, **extra: Any) -> dict[str, Any]:
    topic = hop.split(" -> ")[1] if KIND[hop] == "write" else hop.split(" -> ")[0]
    return {
        "message_id": message_id,
        "hop": hop,
        "stream": STREAM,
        "hop_kind": KIND[hop],
        "verdict": kind,
        "cause": None,
        "count": 1,
        "topic": topic.split("/", 1)[1],
        "partition": 0,
        "offset": int(decided_ms // 1000) % 100_000,
        "group": GROUP.get(hop),
        "location": hop.split(" -> ")[0] if KIND[hop] == "write" else None,
        "observed_ms": decided_ms - 500,
        "latency_ms": 120 + int(decided_ms // 1000) % 50 if kind in ("DELIVERED", "DUPLICATE") else None,
        "e2e_latency_ms": None,
        "decided_ms": decided_ms,
        "detail": f"{kind.lower()} at {hop}",
        "first_seen_ms": decided_ms - 2_000,
        "decided_by": "detector",
        "evidence_kind": None,
        "late_evidence": False,
        **extra,
    }


def seed(store: Store, archive_dir: Path, registry: Registry, now_ms: int) -> Seeded:
    assert set(HOPS) == {hop.id for hop in registry.stream(STREAM).route.hops}, "the seed follows demo.orders"
    minute = 60_000
    seeded = Seeded(now_ms, "view-skip-1", "view-drop-1", "view-retract-1", "view-dup-1", "order-4711")
    rows: list[dict[str, Any]] = []
    for i in range(40):  # delivered everywhere, spread over the last 40 minutes
        rows += [verdict(f"view-ok-{i}", hop, "DELIVERED", now_ms - (i + 1) * minute + j) for j, hop in enumerate(HOPS)]
    for i in range(12):  # and earlier in the day: the day's figures differ from the hour's
        rows += [verdict(f"view-old-{i}", hop, "DELIVERED", now_ms - 5 * 3_600_000 - i * minute) for hop in HOPS]
    at = now_ms - 10 * minute
    rows += [verdict(seeded.skipped, hop, "DELIVERED", at) for hop in (PRODUCE, ENRICH_READ, ENRICH_WRITE, STORE_READ)]
    rows.append(
        verdict(
            seeded.skipped, AUDIT_READ, "LOST", at + 1, cause="skipped_by_consumer", detail="skipped by demo-sink-audit"
        )
    )
    rows += [verdict(seeded.dropped, hop, "DELIVERED", at - minute) for hop in (PRODUCE, ENRICH_READ)]
    rows.append(
        verdict(
            seeded.dropped,
            ENRICH_WRITE,
            "CONFIRMED_LOST",
            at - minute + 5,
            cause="dropped_in_processor",
            decided_by="reconciliation",
            detail="dropped in demo-enricher",
        )
    )
    rows.append(verdict(seeded.retracted, STORE_READ, "RETRACTED", at - 2 * minute, evidence_kind="DELIVERED"))
    rows.append(verdict(seeded.duplicated, STORE_READ, "DUPLICATE", at - 3 * minute, cause="rewind_replay", count=2))
    # Kafka's own semantics, shown apart from losses; reprocessing after an abort; a latency clock skew made impossible
    rows += [verdict(seeded.aborted, hop, "ABORTED", at - 4 * minute, count=0) for hop in (PRODUCE, ENRICH_READ)]
    rows.append(verdict(seeded.superseded, AUDIT_READ, "SUPERSEDED", at - 4 * minute, cause="compacted", count=0))
    rows.append(
        verdict(seeded.reprocessed, ENRICH_READ, "DUPLICATE", at - 5 * minute, cause="reprocessed_after_abort", count=2)
    )
    rows.append(verdict(seeded.skewed, STORE_READ, "DELIVERED", at - 5 * minute, latency_ms=-30_412))
    store.verdicts.upsert(rows)
    history = [
        history_change(seeded.dropped, ENRICH_WRITE, None, "LOST", at - minute, "detector", "lost: dropped"),
        history_change(
            seeded.dropped, ENRICH_WRITE, "LOST", "CONFIRMED_LOST", at - minute + 5, "reconciliation", "confirmed"
        ),
        history_change(seeded.retracted, STORE_READ, None, "LOST", at - 3 * minute, "detector", "lost: no trace"),
        history_change(
            seeded.retracted, STORE_READ, "LOST", "RETRACTED", at - 2 * minute, "reconciliation", "retracted"
        ),
    ]
    with store.engine.begin() as tx:
        tx.execute(insert(schema.verdict_history), history)
    store.verdicts.replace_part(SEED_PART, counts_by_minute(rows), metrics_of)  # every seeded verdict is a row
    seeded.verdicts = rows

    _write_archive(archive_dir, seeded, at)
    seeded.stalled = _health(store, now_ms)
    for i in range(6):
        store.heartbeat.record(
            {
                "query_name": DETECTOR_QUERY,
                "run_id": "view-run",
                "batch_id": 100 + i,
                "at_ms": now_ms - (6 - i) * 10_000,
                "input_rows": 50 + i,
                "input_rows_per_s": 10.0 + i,
                "processed_rows_per_s": 20.0 + i,
                "batch_duration_ms": 900 + 10 * i,
                "state_rows": 300 + i,
                "state_bytes": 90_000,
                "caught_up": True,
                "collect_ms": 700 + i,  # the batch's Spark job; the rest of its duration the driver's alone
                "driver_ms": 150 + i,
                "driver_cpu_ms": 120 + i,
            }
        )
    # how far the detector trails the trace topic: partition 0 60 offsets behind, its oldest 42 s old; and a skip
    store.heartbeat.record_trail(
        DETECTOR_QUERY,
        [
            PartitionTrail(0, 1_200, 105, 0, 1_260, now_ms - 5_000, 1_200, now_ms - 42_000),
            PartitionTrail(1, 900, 105, 0, 900, now_ms - 5_000),
        ],
    )
    store.heartbeat.record_skips(DETECTOR_QUERY, [TraceSkip(1, 850, 870, 90, now_ms - 3_600_000)])
    seeded.quarantined = store.channel.add_quarantine(
        [
            {
                "source_topic": "khipu.traces",
                "source_partition": 1,
                "source_offset": 77 + i // 2,  # the first two: lines 0 and 1 of one batch record
                "source_line": i % 2,
                "quarantine_reason": f"field 'timestamp_ms': expected an integer, got 'soon-{i}'",
                "raw_value": b"{}",
            }
            for i in range(3)
        ],
        now_ms - 30_000,
    )
    with store.engine.begin() as tx:
        tx.execute(
            insert(schema.trace_gaps),
            [
                {
                    "emitter_id": "demo-enricher-e1",
                    "location": "demo-enricher",
                    "from_seq": 10,
                    "to_seq": 13,
                    "after_ms": now_ms - 90_000,
                    "before_ms": now_ms - 80_000,
                    "noticed_ms": now_ms - 70_000,
                }
            ],
        )
    seeded.gaps = 3
    fired = Alert(
        key="view-alert-1",
        subject=f"{STREAM} {AUDIT_READ} loss_rate",
        kind="verdict_threshold",
        state=AlertState.FIRING,
        severity=Severity.CRITICAL,
        title=f"{STREAM}: loss_rate 25.00 % at {AUDIT_READ}, above its threshold "
        f"{100 * registry.stream(STREAM).alerts.loss_rate:.2f} %",
        at_ms=now_ms - 8 * minute,
        details={"stream": STREAM},
    )
    store.alerts.add(fired)
    store.alerts.mark_delivered(fired.key, {"log": "ok", "webhook": "HTTP 500 from the receiver"}, now_ms - 8 * minute)
    return seeded


def history_change(
    message_id: str, hop: str, before: str | None, after: str, at_ms: int, by: str, reason: str
) -> dict[str, Any]:
    """A ``verdict_history`` row of ``STREAM`` (the bench writes its history with it too)."""
    return {
        "message_id": message_id,
        "hop": hop,
        "stream": STREAM,
        "at_ms": at_ms,
        "from_verdict": before,
        "to_verdict": after,
        "cause": None,
        "decided_by": by,
        "reason": reason,
    }


def _write_archive(archive_dir: Path, seeded: Seeded, at_ms: int) -> None:
    attributes = json.dumps({"order_id": seeded.order_id})
    base = {"stream": STREAM, "cluster": "local", "sampling_percent": 100.0, "attributes": attributes}
    traces = [
        {**base, "type": "SENT", "location": "demo-producer", "topic": "demo.orders", "group": None, "offset": 41},
        {
            **base,
            "type": "RECEIVED",
            "location": "demo-enricher",
            "topic": "demo.orders",
            "group": "demo-enricher",
            "offset": 41,
        },
        {
            **base,
            "type": "SENT",
            "location": "demo-enricher",
            "topic": "demo.orders-enriched",
            "group": None,
            "offset": 17,
        },
        {
            **base,
            "type": "RECEIVED",
            "location": "demo-sink-store",
            "topic": "demo.orders-enriched",
            "group": "demo-sink-store",
            "offset": 17,
        },
    ]
    rows = [
        {
            **trace,
            "message_id": seeded.skipped,
            "partition": 2,
            "timestamp_ms": at_ms - 5_000 + i * 100,
            "emitter_id": f"{trace['location']}-e1",
            "emitter_seq": i,
            "prev_offsets": None,
        }
        for i, trace in enumerate(traces)
    ]
    folder = archive_dir / hour_folder(at_ms - 5_000) / "batch_id=0"
    folder.mkdir(parents=True, exist_ok=True)
    schema_ = pa.schema(
        [
            ("message_id", pa.string()), ("stream", pa.string()), ("location", pa.string()),
            ("cluster", pa.string()), ("type", pa.string()), ("timestamp_ms", pa.int64()), ("topic", pa.string()),
            ("partition", pa.int32()), ("offset", pa.int64()), ("group", pa.string()), ("emitter_id", pa.string()),
            ("emitter_seq", pa.int64()), ("sampling_percent", pa.float64()), ("attributes", pa.string()),
            ("prev_offsets", pa.list_(pa.int64())),
        ]
    )  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows, schema=schema_), folder / "part-0.parquet")


def _health(store: Store, now_ms: int) -> PartitionKey:
    ok = PartitionKey("local", "demo-sink-store", "demo.orders-enriched", 0)
    stalled = PartitionKey("local", "demo-sink-audit", "demo.orders-enriched", 0)
    keeping_up = PartitionKey("local", "demo-sink-store", "demo.orders-enriched", 2)
    evidence = {"window": [[100, now_ms - 240_000, 5], [100, now_ms - 60_000, 40]], "retention_ms": 604_800_000}
    written_since = {**evidence, "time_lag_under_ms": 60_000}  # 3 records written since the previous snapshot
    healths = [
        PartitionHealth(ok, PartitionStatus.OK, now_ms, 0, 0, "committing and keeping up", evidence),
        PartitionHealth(keeping_up, PartitionStatus.OK, now_ms, 3, None, "committing and keeping up", written_since),
        PartitionHealth(
            stalled, PartitionStatus.STALL, now_ms, 40, 180_000, "committed offset 100 unchanged over 5 snapshots",
            evidence,
        ),
    ]  # fmt: skip
    for i, log_end in enumerate((110, 125, 140)):  # the stalled group's commit stays at 100 as the log grows
        at = now_ms - (3 - i) * 60_000
        store.snapshots.write(
            SnapshotRun(at, "local", 2, 2, 15),
            [
                PartitionSnapshot(at, "local", key.group, key.topic, 0, committed, 90, log_end, "STABLE")
                for key, committed in ((ok, log_end), (stalled, 100))
            ],
        )
    changes = [Transition(stalled, PartitionStatus.OK, PartitionStatus.STALL, now_ms, healths[1])]
    windows = [OffsetWindow(ok, WindowKind.SKIP, 50, 60, now_ms - 120_000, 50, 60)]
    store.health.save_evaluation(healths, changes, windows, [])
    return stalled
