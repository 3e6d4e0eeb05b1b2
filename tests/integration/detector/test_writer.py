"""The detector's writer on its own (no Spark): what it does with verdict rows as the processor emits them.

A real SQLite store and a real verdict archive on disk; the rows are built as the processor's output.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from khipu.detector.bucket import AHEAD, VERDICT_FIELDS
from khipu.detector.outputs import DetectorWriter, ReadProgress, expand_verdicts
from khipu.detector.packed import JUDGED, PACKED_FIELDS, RECORD_FIELDS, RECORDS, ipc_bytes
from khipu.detector.routes import RoutePlans
from khipu.kafka import KafkaConnection
from khipu.registry import parse_registry
from khipu.store import Store
from tests.integration.detector.conftest import stored_verdicts

REGISTRY = parse_registry("""
version: 1
clusters: {local: {}}
streams:
  orders:
    owner: team-t
    route:
      producers: [{location: p, writes: [local/in]}]
      consumers: [{group: s1, location: s1, reads: [local/in]}]
""")
PLANS = RoutePlans.of(REGISTRY)
WRITE, READ = 0, 1  # the hops' numbers
HOUR_MS = 3_600_000


def rows(*verdicts: dict[str, Any]) -> pa.Table:
    base = {"cause": None, "count": 1, "partition": 0, "offset": 7, "latency_ms": None, "e2e_latency_ms": None,
            "detail": None}  # fmt: skip
    table = pa.Table.from_pylist([{**base, **v} for v in verdicts], schema=VERDICT_FIELDS)
    return expand_verdicts(table, PLANS.described())


def late_trace_outcome(tmp_path: Path, index_pruned: bool) -> tuple[set[tuple[str, str, int]], int, int]:
    """A message delivered and archived three hours ago; its consumer's trace arrives again now (its emitter re-sent
    a buffer): a new state, the SENT trace long gone, so decide says the write hop's trace was lost. Returns the
    verdicts kept (hop, verdict, count), the SQL rows and the archived rows."""
    store_url = f"sqlite:///{tmp_path / 'khipu.db'}"
    Store(store_url).migrate()
    writer = DetectorWriter(store_url, str(tmp_path / "archive"), str(tmp_path / "verdicts"), None,
                            KafkaConnection("127.0.0.1:9"), keep_pointers_ms=HOUR_MS, known_streams=("orders",),
                            hops=PLANS.described())  # fmt: skip
    sent = int(time.time() * 1000) - 3 * HOUR_MS
    first = {"message_id": "m1", "verdict": "DELIVERED", "first_seen_ms": sent, "judged_by": "clean",
             "decided_ms": sent + 5_000}  # fmt: skip
    writer._verdicts(rows({**first, "hop": WRITE, "observed_ms": sent}, {**first, "hop": READ, "observed_ms": sent}), 1)
    if index_pruned:  # the index keeps decisions for an hour here
        writer.verdict_archive.index.prune(int(time.time() * 1000))
        assert writer.verdict_archive.index.count() == 0
    now = int(time.time() * 1000)
    late = {"message_id": "m1", "first_seen_ms": now, "judged_by": "decide", "decided_ms": now}
    lost_trace = {**late, "hop": WRITE, "verdict": "TRACE_LOST", "count": 0, "observed_ms": None}
    writer._verdicts(rows(lost_trace, {**late, "hop": READ, "verdict": "DELIVERED", "observed_ms": sent}), 2)
    store = Store(store_url)
    kept = {(v["hop"], v["verdict"], v["count"]) for v in stored_verdicts(store, tmp_path / "verdicts")}
    return kept, len(store.verdicts.rows()), len(writer.verdict_archive.read())


def test_a_trace_arriving_after_the_index_forgot_its_message_is_judged_as_if_it_had_not(tmp_path: Path) -> None:
    remembered = late_trace_outcome(tmp_path / "remembered", index_pruned=False)
    forgotten = late_trace_outcome(tmp_path / "forgotten", index_pruned=True)
    assert forgotten == remembered
    kept, _, archived = forgotten
    assert ("p -> local/in", "DELIVERED", 1) in kept  # never made worse: not TRACE_LOST
    assert ("local/in -> s1", "DUPLICATE", 2) in kept and archived == 2  # the hop read again, nothing archived twice


def test_a_hop_reported_again_by_its_state_with_more_copies_replaces_its_archived_delivered(tmp_path: Path) -> None:
    """The bucket reports a hop again when more copies reached it while its message was in flight
    (decide.to_report): the read hop was DELIVERED (archived, counted in its minute) and is now a DUPLICATE of two,
    from the same state (same first_seen_ms). The store keeps the DUPLICATE, the archive's DELIVERED is replaced,
    and the minute counts the hop once, as a duplicate."""
    store_url = f"sqlite:///{tmp_path / 'khipu.db'}"
    Store(store_url).migrate()
    writer = DetectorWriter(store_url, str(tmp_path / "archive"), str(tmp_path / "verdicts"), None,
                            KafkaConnection("127.0.0.1:9"), keep_pointers_ms=HOUR_MS, known_streams=("orders",),
                            hops=PLANS.described())  # fmt: skip
    sent = int(time.time() * 1000) - 60_000
    state = {"message_id": "m1", "first_seen_ms": sent, "decided_ms": sent + 35_000, "observed_ms": sent}
    writer._verdicts(rows({**state, "hop": READ, "verdict": "DELIVERED", "judged_by": "clean"}), 1)
    again = {**state, "decided_ms": sent + 70_000, "judged_by": "decide", "observed_ms": sent + 40_000}
    writer._verdicts(
        rows(
            {**again, "hop": READ, "verdict": "DUPLICATE", "cause": "producer_retry", "count": 2, "offset": 8},
            {**again, "hop": WRITE, "verdict": "DUPLICATE", "cause": "producer_retry", "count": 2, "offset": 8},
        ),
        2,
    )
    store = Store(store_url)
    kept = {(v["hop"], v["verdict"], v["cause"], v["count"]) for v in stored_verdicts(store, tmp_path / "verdicts")}
    duplicate = ("DUPLICATE", "producer_retry", 2)
    assert kept == {("local/in -> s1", *duplicate), ("p -> local/in", *duplicate)}
    minutes = store.verdicts.read_metrics("orders")
    by_hop: dict[str, dict[str, int]] = {}
    for minute in minutes:
        counts = by_hop.setdefault(minute["hop"], {"delivered": 0, "duplicate": 0})
        counts["delivered"] += minute["delivered"]
        counts["duplicate"] += minute["duplicate"]
    assert by_hop["local/in -> s1"] == {"delivered": 0, "duplicate": 1}  # once, as what it is now
    assert by_hop["p -> local/in"] == {"delivered": 0, "duplicate": 1}


def test_a_lost_decided_ahead_whose_record_the_batch_points_at_is_held_back(tmp_path: Path) -> None:
    """One batch: s1's RECEIVED trace of m2 (offset 8) points back at offset 7, where the processor, deciding on
    the running batch's clock, found m1 LOST. That LOST is held back: not in the store, nor published; the
    pointer is stored for the next batch. A LOST decided on the finished batches' clock (m3, offset 9, pointed at
    too) and one decided ahead that nothing points at (m4, offset 5) are stored."""
    store_url = f"sqlite:///{tmp_path / 'khipu.db'}"
    store = Store(store_url)
    store.migrate()
    writer = DetectorWriter(store_url, str(tmp_path / "archive"), str(tmp_path / "verdicts"), None,
                            KafkaConnection("127.0.0.1:9"), keep_pointers_ms=HOUR_MS, known_streams=("orders",),
                            hops=PLANS.described())  # fmt: skip
    now = int(time.time() * 1000)
    trace = {"kind": "trace", "message_id": "m2", "stream": "orders", "location": "s1", "cluster": "local",
             "type": "RECEIVED", "timestamp_ms": now, "topic": "in", "partition": 0, "offset": 8, "group": "s1",
             "emitter_id": "s1-e", "emitter_seq": 1, "sampling_percent": 100.0, "prev_offsets": "7,9", "hop": READ,
             "kafka_timestamp_ms": now, "source_topic": "khipu.traces", "source_partition": 0, "source_offset": 0,
             "source_line": 0}  # fmt: skip
    lost = {"hop": READ, "verdict": "LOST", "cause": "skipped_by_consumer",
            "count": 0, "partition": 0, "observed_ms": now, "decided_ms": now, "first_seen_ms": now}  # fmt: skip
    verdicts = [
        {**lost, "message_id": "m1", "offset": 7, "judged_by": AHEAD},
        {**lost, "message_id": "m3", "offset": 9, "judged_by": "decide"},
        {**lost, "message_id": "m4", "offset": 5, "judged_by": AHEAD},
    ]
    collected = pa.Table.from_pylist(  # as the query gives them: packed by bucket (khipu.detector.packed)
        [
            {"bucket": 0, "kind": RECORDS, "blob": ipc_bytes(pa.Table.from_pylist([trace], schema=RECORD_FIELDS))},
            {
                "bucket": 0,
                "kind": JUDGED,
                "blob": ipc_bytes(pa.Table.from_pylist(verdicts, schema=VERDICT_FIELDS)),
                "in_flight": 0,
                "state_bytes": 0,
            },
        ],
        schema=PACKED_FIELDS,
    )
    writer._write(collected, 1, {}, lambda step: None)
    kept = {(v["message_id"], v["hop"], v["verdict"]) for v in stored_verdicts(store, tmp_path / "verdicts")}
    assert kept == {("m3", "local/in -> s1", "LOST"), ("m4", "local/in -> s1", "LOST")}
    assert store.channel.pointed_at("s1", "local", "in", 0, 7)  # what decides m1 in the next batch


def test_the_running_batch_clock_is_recorded_only_for_a_batch_planned_after_the_last_one_ended_uncut(
    tmp_path: Path,
) -> None:
    """What the writer records before a batch's job: when the previous batch of this process ended, for the batch
    right after it whose span the limit cannot have cut (the query's offset log as Spark writes it); nothing after a
    batch this process did not end, nor for a batch the limit may have cut."""
    store_url = f"sqlite:///{tmp_path / 'khipu.db'}"
    store = Store(store_url)
    store.migrate()
    store.heartbeat.start_over("q", 1_000)
    offsets = tmp_path / "checkpoint" / "offsets"
    offsets.mkdir(parents=True)
    for batch, ends in {4: {"0": 100, "1": 100}, 5: {"0": 400, "1": 400}, 6: {"0": 900, "1": 901}}.items():
        (offsets / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"t":{json.dumps(ends)}}}')
    progress = ReadProgress(
        tmp_path / "checkpoint", "q", "t", KafkaConnection("127.0.0.1:9"), max_offsets_per_trigger=1_000
    )

    assert progress.run_ahead(5, store) is None  # no batch ended in this process yet (a restart)
    progress.ended(4)
    ended_at = progress._ended[1] if progress._ended else None
    assert progress.run_ahead(5, store) == ended_at  # 600 offsets after batch 4, under 1,000 less 2
    assert store.heartbeat.running_read_to_ms("q") == ended_at
    progress.ended(5)
    assert progress.run_ahead(6, store) is None  # 1,001 offsets: the limit may have cut it
    assert progress.run_ahead(7, store) is None  # batch 6 did not end here
    assert store.heartbeat.running_read_to_ms("q") == ended_at  # nothing else recorded
