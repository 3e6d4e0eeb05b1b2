"""A second team's stream in the view's store, beside tests/viewdata.py's ``demo.orders`` (team-demo).

``demo.bursts`` belongs to team-bursts in config/registry.yaml. Written here through the store's repositories
and the trace archive as the detector lays it out: verdicts of every kind the pages list (a confirmed loss, a
loss with a recovery attribute in its traces, deliveries), their history and minute metrics, a latency clock
skew made impossible, a resend attempt, a stalled partition of one of its groups with an offset window and a
status change, an alert on the stream and one on its group, and a trace-channel gap of one of its emitters.

Everything written carries names of its own (``bursts-...``, ``demo-burst-...``): :data:`MARKERS` are strings only
this team's data holds, so a page or an answer that shows any of them to another team has leaked.
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
from khipu.health.evaluate import PartitionHealth
from khipu.health.rules import PartitionStatus
from khipu.health.windows import OffsetWindow, WindowKind
from khipu.offsets.model import PartitionKey, PartitionSnapshot, SnapshotRun
from khipu.registry.model import Registry
from khipu.store import Store, schema
from khipu.trace.archive import hour_folder
from khipu.verdicts.metrics import counts_by_minute, metrics_of

BURSTS = "demo.bursts"
BURSTS_TEAM = "team-bursts"
ORDERS_TEAM = "team-demo"  # tests/viewdata.py's demo.orders
PRODUCE = "demo-burst-producer -> local/demo.bursts"
ENRICH_READ = "local/demo.bursts -> demo-burst-enricher"
ENRICH_WRITE = "demo-burst-enricher -> local/demo.bursts-enriched"
STORE_READ = "local/demo.bursts-enriched -> demo-burst-sink-store"
AUDIT_READ = "local/demo.bursts-enriched -> demo-burst-sink-audit"
HOPS = (PRODUCE, ENRICH_READ, ENRICH_WRITE, STORE_READ, AUDIT_READ)
WRITES = (PRODUCE, ENRICH_WRITE)
GROUP = {ENRICH_READ: "demo-burst-enricher", STORE_READ: "demo-burst-sink-store", AUDIT_READ: "demo-burst-sink-audit"}
PART = "seed-bursts"
ORDER_ID = "bursts-9001"  # the lost message's recovery attribute
STALLED = PartitionKey("local", "demo-burst-sink-audit", "demo.bursts-enriched", 0)


@dataclass
class SecondTeam:
    dropped: str = "bursts-drop-1"  # CONFIRMED_LOST at ENRICH_WRITE, with history and a resend attempt
    skipped: str = "bursts-skip-1"  # LOST at AUDIT_READ, traces in the archive with order_id=ORDER_ID
    delivered: list[str] = field(default_factory=list)
    stalled: PartitionKey = STALLED

    @property
    def message_ids(self) -> list[str]:
        return [self.dropped, self.skipped, *self.delivered]


# strings only the second team's data holds (message ids are added by markers())
MARKERS = ("demo.bursts", "demo-burst-", ORDER_ID, "bursts-")


def markers(team: SecondTeam) -> tuple[str, ...]:
    return (*MARKERS, *team.message_ids)


def verdict(message_id: str, hop: str, kind: str, decided_ms: int, **extra: Any) -> dict[str, Any]:
    write = hop in WRITES
    topic = hop.split(" -> ")[1] if write else hop.split(" -> ")[0]
    return {
        "message_id": message_id,
        "hop": hop,
        "stream": BURSTS,
        "hop_kind": "write" if write else "read",
        "verdict": kind,
        "cause": None,
        "count": 1,
        "topic": topic.split("/", 1)[1],
        "partition": 0,
        "offset": int(decided_ms // 1000) % 100_000,
        "group": GROUP.get(hop),
        "location": hop.split(" -> ")[0] if write else None,
        "observed_ms": decided_ms - 500,
        "latency_ms": 90 if kind == "DELIVERED" else None,
        "e2e_latency_ms": None,
        "decided_ms": decided_ms,
        "detail": f"{kind.lower()} at {hop}",
        "first_seen_ms": decided_ms - 2_000,
        "decided_by": "detector",
        "evidence_kind": None,
        "late_evidence": False,
        **extra,
    }


def seed_second_team(store: Store, archive_dir: Path, registry: Registry, now_ms: int) -> SecondTeam:
    """Write team-bursts' data (after tests/viewdata.seed, which wrote team-demo's)."""
    assert set(HOPS) == {hop.id for hop in registry.stream(BURSTS).route.hops}, "the seed follows demo.bursts"
    assert registry.stream(BURSTS).owner == BURSTS_TEAM
    minute = 60_000
    team = SecondTeam(delivered=[f"bursts-ok-{i}" for i in range(6)])
    at = now_ms - 12 * minute
    rows: list[dict[str, Any]] = []
    for i, message_id in enumerate(team.delivered):
        rows += [verdict(message_id, hop, "DELIVERED", now_ms - (i + 2) * minute + j) for j, hop in enumerate(HOPS)]
    rows[-1]["latency_ms"] = -12_345  # clock skew at the audit read: an impossible latency
    rows += [verdict(team.dropped, hop, "DELIVERED", at - minute) for hop in (PRODUCE, ENRICH_READ)]
    rows.append(
        verdict(
            team.dropped,
            ENRICH_WRITE,
            "CONFIRMED_LOST",
            at - minute + 5,
            cause="dropped_in_processor",
            decided_by="reconciliation",
            detail="dropped in demo-burst-enricher",
        )
    )
    rows += [verdict(team.skipped, hop, "DELIVERED", at) for hop in (PRODUCE, ENRICH_READ, ENRICH_WRITE, STORE_READ)]
    rows.append(verdict(team.skipped, AUDIT_READ, "LOST", at + 1, cause="skipped_by_consumer"))
    store.verdicts.upsert(rows)
    history = [
        {"message_id": team.dropped, "hop": ENRICH_WRITE, "stream": BURSTS, "at_ms": at - minute, "from_verdict": None,
         "to_verdict": "LOST", "cause": None, "decided_by": "detector", "reason": "lost: dropped"},
        {"message_id": team.dropped, "hop": ENRICH_WRITE, "stream": BURSTS, "at_ms": at - minute + 5,
         "from_verdict": "LOST", "to_verdict": "CONFIRMED_LOST", "cause": None, "decided_by": "reconciliation",
         "reason": "confirmed"},
    ]  # fmt: skip
    with store.engine.begin() as tx:
        tx.execute(insert(schema.verdict_history), history)
    store.verdicts.replace_part(PART, counts_by_minute(rows), metrics_of)
    store.resends.record_intent(
        {
            "resend_id": "bursts-resend-1",
            "message_id": team.dropped,
            "hop": ENRICH_WRITE,
            "stream": BURSTS,
            "attempt": 1,
            "state": "intended",
            "source_kind": "topic",
            "source_position": "local/demo.bursts[0]@7",
            "destination": "local/demo.bursts-enriched",
            "target_group": None,
            "destination_partition": 0,
            "scan_from_offset": 3,
            "reason": "the processor's input record is still in demo.bursts",
        },
        at,
    )
    _write_archive(archive_dir, team, at)
    _health(store, team.stalled, now_ms)
    with store.engine.begin() as tx:
        tx.execute(
            insert(schema.trace_gaps),
            [
                {
                    "emitter_id": "demo-burst-enricher-e1",
                    "location": "demo-burst-enricher",
                    "from_seq": 4,
                    "to_seq": 9,
                    "after_ms": now_ms - 90_000,
                    "before_ms": now_ms - 80_000,
                    "noticed_ms": now_ms - 70_000,
                }
            ],
        )
    store.alerts.add(
        Alert(
            key="bursts-alert-1",
            subject=f"{BURSTS} {AUDIT_READ} loss_rate",
            kind="verdict_threshold",
            state=AlertState.FIRING,
            severity=Severity.CRITICAL,
            title=f"{BURSTS}: loss_rate 16.67 % at {AUDIT_READ}, above its threshold 0.10 %",
            at_ms=now_ms - 7 * minute,
            details={"stream": BURSTS, "hop": AUDIT_READ, "metric": "loss_rate"},
        )
    )
    return team


def _write_archive(archive_dir: Path, team: SecondTeam, at_ms: int) -> None:
    base = {
        "stream": BURSTS,
        "cluster": "local",
        "sampling_percent": 100.0,
        "attributes": json.dumps({"order_id": ORDER_ID}),
        "message_id": team.skipped,
        "partition": 0,
        "prev_offsets": None,
    }
    traces = [
        ("SENT", "demo-burst-producer", "demo.bursts", None, 7),
        ("RECEIVED", "demo-burst-enricher", "demo.bursts", "demo-burst-enricher", 7),
        ("SENT", "demo-burst-enricher", "demo.bursts-enriched", None, 3),
        ("RECEIVED", "demo-burst-sink-store", "demo.bursts-enriched", "demo-burst-sink-store", 3),
    ]
    rows = [
        {
            **base,
            "type": kind,
            "location": location,
            "topic": topic,
            "group": group,
            "offset": offset,
            "timestamp_ms": at_ms - 5_000 + i * 100,
            "emitter_id": f"{location}-e1",
            "emitter_seq": i,
        }
        for i, (kind, location, topic, group, offset) in enumerate(traces)
    ]
    folder = archive_dir / hour_folder(at_ms - 5_000) / "batch_id=1"
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


def _health(store: Store, stalled: PartitionKey, now_ms: int) -> None:
    evidence = {"window": [[30, now_ms - 240_000, 5], [30, now_ms - 60_000, 12]], "retention_ms": 604_800_000}
    health = PartitionHealth(
        stalled, PartitionStatus.STALL, now_ms, 12, 200_000, "demo-burst-sink-audit's commit unchanged", evidence
    )
    for i, log_end in enumerate((35, 38, 42)):
        at = now_ms - (3 - i) * 60_000 - 30_000  # between tests/viewdata.py's snapshot runs
        store.snapshots.write(
            SnapshotRun(at, "local", 1, 1, 15),
            [PartitionSnapshot(at, "local", stalled.group, stalled.topic, 0, 30, 20, log_end, "STABLE")],
        )
    change = Transition(stalled, PartitionStatus.OK, PartitionStatus.STALL, now_ms, health)
    window = OffsetWindow(stalled, WindowKind.SKIP, 20, 24, now_ms - 100_000, 20, 24)
    group_alert = Alert(
        key="bursts-group-alert-1",
        subject=f"group {stalled.group} on local",
        kind="group_status",
        state=AlertState.FIRING,
        severity=Severity.WARNING,
        title=f"STALL: group {stalled.group} on local: 1 partition(s)",
        at_ms=now_ms - 6 * 60_000,
        details={"cluster": stalled.cluster, "group": stalled.group, "to_status": "STALL"},
    )
    store.health.save_evaluation([health], [change], [window], [group_alert])
