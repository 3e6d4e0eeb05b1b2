"""Telling a removed record from a skipped one, from the offset-snapshot history in a real store.

RecordRemovals asks the store first; the broker connection here goes nowhere, so every answer
below comes from the snapshots (and a failing store fails loudly rather than guessing).
"""

from __future__ import annotations

import time

import pytest

from khipu.detector.committed import ClusterClients, RecordRemovals
from khipu.kafka import KafkaConnection
from khipu.localstack.processes import free_port
from khipu.offsets.model import PartitionSnapshot, SnapshotRun
from khipu.store import Store

pytestmark = pytest.mark.integration


def snapshot(store: Store, at_ms: int, group: str, committed: int, log_start: int, retention_ms: int = 60_000) -> None:
    row = PartitionSnapshot(at_ms, "local", group, "orders", 0, committed, log_start, 100, "STABLE", retention_ms)
    store.snapshots.write(SnapshotRun(at_ms, "local", 1, 1, 1), [row])


def test_the_history_says_when_a_record_went_and_whether_the_group_had_skipped_it_before(store: Store) -> None:
    now = time.time_ns() // 1_000_000
    snapshot(store, now - 30_000, "skipper", committed=50, log_start=0)  # skipped past 40 while the log held it
    snapshot(store, now - 30_000, "sleeper", committed=10, log_start=0)
    snapshot(store, now - 5_000, "skipper", committed=60, log_start=45)  # then retention moved the log start
    snapshot(store, now - 5_000, "sleeper", committed=10, log_start=45)
    removals = RecordRemovals(ClusterClients({"local": KafkaConnection(f"127.0.0.1:{free_port()}")}, store.url))

    assert removals("local", "skipper", "orders", 0, 40) is None  # a skip, whatever happened to the log later
    gone = removals("local", "sleeper", "orders", 0, 40)
    assert gone is not None and (gone.log_start, gone.removed_by_ms, gone.retention_ms) == (45, now - 5_000, 60_000)
    assert removals("local", "sleeper", "orders", 0, 45) is None  # still in the log


def test_the_retention_a_record_left_under_is_the_one_of_the_snapshot_that_first_saw_it_gone(store: Store) -> None:
    """An operator raised retention after the record expired: it still expired, under the retention it had then."""
    now = time.time_ns() // 1_000_000
    snapshot(store, now - 60_000, "sleeper", committed=10, log_start=0, retention_ms=3_000)
    snapshot(store, now - 30_000, "sleeper", committed=10, log_start=45, retention_ms=3_000)  # first seen gone
    snapshot(store, now - 5_000, "sleeper", committed=10, log_start=45, retention_ms=3_600_000)  # raised since
    removals = RecordRemovals(ClusterClients({"local": KafkaConnection(f"127.0.0.1:{free_port()}")}, store.url))
    gone = removals("local", "sleeper", "orders", 0, 40)
    assert gone is not None and (gone.removed_by_ms, gone.retention_ms) == (now - 30_000, 3_000)


def test_a_store_that_cannot_answer_fails_the_lookup_instead_of_calling_a_skip_a_removal(store: Store) -> None:
    now = time.time_ns() // 1_000_000
    snapshot(store, now - 1_000, "sleeper", committed=10, log_start=45)
    removals = RecordRemovals(ClusterClients({}, store.url))
    assert removals("local", "sleeper", "orders", 0, 40) is not None  # the log start (45) is now cached
    with store.engine.begin() as tx:  # the history vanishes under it (a dropped table stands for an outage)
        tx.exec_driver_sql("ALTER TABLE offset_snapshots RENAME TO offset_snapshots_gone")
    try:
        with pytest.raises(Exception, match="offset_snapshots"):
            removals("local", "sleeper", "orders", 0, 40)
    finally:
        with store.engine.begin() as tx:
            tx.exec_driver_sql("ALTER TABLE offset_snapshots_gone RENAME TO offset_snapshots")
