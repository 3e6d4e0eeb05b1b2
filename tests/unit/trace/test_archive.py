"""The trace archive's hours are when traces reached the trace topic, never an application's timestamps."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from khipu.trace.archive import HOUR_MS, SCHEMA, hour_of, read_traces, write_batch

NOW_MS = 1_795_000_000_000


def row(message_id: str, own_ms: int, arrived_ms: int | None) -> dict[str, object]:
    return {
        "message_id": message_id, "stream": "orders", "location": "api", "cluster": "local", "type": "SENT",
        "timestamp_ms": own_ms, "topic": "orders", "partition": 0, "offset": 1, "group": None, "emitter_id": "api-e",
        "emitter_seq": 0, "sampling_percent": 100.0, "attributes": None, "prev_offsets": None, "key_hash": None,
        "tombstone": False, "transactional": False, "read_uncommitted": False, "kafka_timestamp_ms": arrived_ms,
    }  # fmt: skip


def test_a_trace_stamped_with_an_old_event_time_is_archived_in_the_hour_it_arrived(tmp_path: Path) -> None:
    """A producer that stamps its records with an event time 5 hours old: its SENT trace's own time says so, but
    the trace reached the trace topic now, and that hour holds it (where a reader of this message's hours looks)."""
    event_time = NOW_MS - 5 * HOUR_MS
    older = row("before-the-column", NOW_MS - 3 * HOUR_MS, None)  # archived before the column: its own time
    hours = write_batch(tmp_path, 7, pa.Table.from_pylist([row("m1", event_time, NOW_MS), older], schema=SCHEMA))
    assert hours == sorted([hour_of(NOW_MS), hour_of(NOW_MS - 3 * HOUR_MS)])
    [found] = read_traces(tmp_path, ["m1"], NOW_MS - 60_000, NOW_MS)
    assert found.timestamp_ms == event_time  # the trace keeps its own time
    assert read_traces(tmp_path, ["m1"], event_time, event_time + 60_000) == []  # not in the event's hour
