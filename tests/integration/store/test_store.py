"""The store against SQLite and PostgreSQL: migrations, snapshots, point-in-time offsets, health, alerts."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from khipu.alerting.decide import alerts_for, group_changes, transitions
from khipu.health.evaluate import PartitionHealth
from khipu.health.rules import PartitionStatus
from khipu.health.windows import OffsetWindow, WindowKind
from khipu.offsets.model import PartitionKey, PartitionSnapshot, SnapshotRun
from khipu.store import Store, StoreError
from khipu.store.schema import metadata

pytestmark = pytest.mark.integration

M = 60_000
KEY = PartitionKey("local", "sink", "orders", 0)


def snap(
    minute: int, committed: int | None, log_end: int, group: str = "sink", partition: int = 0
) -> PartitionSnapshot:
    return PartitionSnapshot(minute * M, "local", group, "orders", partition, committed, 0, log_end, "STABLE")


def write(store: Store, minute: int, *rows: PartitionSnapshot) -> bool:
    return store.snapshots.write(SnapshotRun(minute * M, "local", 1, len(rows), 5), list(rows))


def test_migrating_twice_is_safe_and_the_database_matches_the_schema(store: Store) -> None:
    store.migrate()
    with store.engine.sql.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), metadata)
    assert differences == []


def test_a_snapshot_is_written_once_and_missed_minutes_stay_missing(store: Store) -> None:
    assert write(store, 0, snap(0, 10, 20), snap(0, 5, 9, partition=1))
    assert not write(store, 0, snap(0, 99, 99))  # a retried task: the minute is already there
    assert write(store, 3, snap(3, 30, 40))  # minutes 1 and 2 were missed (scheduler down)
    runs = store.snapshots.runs("local")
    assert [r.snapshot_ms for r in runs] == [0, 3 * M]  # the gap shows; nothing was invented
    history = store.snapshots.histories("local", 0)
    assert [s.committed for s in history[KEY]] == [10, 30]
    assert history[PartitionKey("local", "sink", "orders", 1)][0].log_end == 9


def test_committed_offset_as_of_a_time_comes_from_the_latest_snapshot_before_it(store: Store) -> None:
    write(store, 0, snap(0, 10, 20))
    write(store, 1, snap(1, None, 25))  # the group had no commit then
    write(store, 2, snap(2, 25, 30))
    assert store.snapshots.committed_offset_at("local", "sink", "orders", 0, -1) is None
    at = store.snapshots.committed_offset_at("local", "sink", "orders", 0, M + 30_000)
    assert at is not None and (at.offset, at.snapshot_ms) == (10, 0)
    latest = store.snapshots.committed_offset_at("local", "sink", "orders", 0, 10 * M)
    assert latest is not None and (latest.offset, latest.snapshot_ms) == (25, 2 * M)
    assert store.snapshots.committed_offset_at("local", "other", "orders", 0, 10 * M) is None


def test_backlog_start_is_when_the_log_end_first_passed_the_committed_offset(store: Store) -> None:
    for minute, log_end in enumerate([10, 10, 12, 15, 20]):
        write(store, minute, snap(minute, 10, log_end))
    assert (
        store.snapshots.backlog_started_ms("local", "orders", 0, committed=10) == 2 * M
    )  # log end 12 > 10 first at minute 2
    assert (
        store.snapshots.backlog_started_ms("local", "orders", 0, committed=4) == 0
    )  # older than the history: a lower bound
    assert store.snapshots.backlog_started_ms("local", "orders", 0, committed=20) is None  # nothing pending


def test_pruning_drops_old_snapshots_only(store: Store) -> None:
    for minute in range(5):
        write(store, minute, snap(minute, minute, minute + 1))
    assert store.snapshots.prune(before_ms=3 * M) == 3
    assert [s.snapshot_ms for s in store.snapshots.histories("local", 0)[KEY]] == [3 * M, 4 * M]
    assert [r.snapshot_ms for r in store.snapshots.runs("local")] == [3 * M, 4 * M]


def health(status: PartitionStatus, minute: int, key: PartitionKey = KEY) -> PartitionHealth:
    return PartitionHealth(key, status, minute * M, 7, 1000, f"because {status.name}", {"window": [[1, 2, 3]]})


def test_statuses_keep_their_since_until_they_change_and_transitions_and_alerts_are_recorded(store: Store) -> None:
    window = OffsetWindow(KEY, WindowKind.REWIND, 5, 10, M, 10, 5)
    for minute, status in enumerate(
        [PartitionStatus.OK, PartitionStatus.STALL, PartitionStatus.STALL, PartitionStatus.OK]
    ):
        previous = {k: PartitionStatus[v.status_name] for k, v in store.health.current_statuses("local").items()}
        current = [health(status, minute)]
        changes = transitions(previous, current)
        windows = [window] if minute == 1 else []
        store.health.save_evaluation(current, changes, windows, alerts_for(group_changes(previous, current), windows))
        if minute == 2:
            stored = store.health.current_statuses("local")[KEY]
            assert (stored.status_name, stored.since_ms) == ("STALL", M)  # unchanged since minute 1

    # minute 0 is OK from the start: not a transition worth a row
    assert [(f, t, at) for _, f, t, at in store.health.transitions("local")] == [
        ("OK", "STALL", M),
        ("STALL", "OK", 3 * M),
    ]
    assert [
        (WindowKind(w.kind), w.from_offset, w.to_offset) for w in store.health.offset_windows("local", "orders", 0, 7)
    ] == [(WindowKind.REWIND, 5, 10)]
    assert store.health.offset_windows("local", "orders", 0, covering_offset=10) == []  # the window ends before 10
    pending = store.alerts.pending()
    assert [(a.kind, a.state) for a in pending] == [
        ("group_status", "firing"),
        ("offset_window", "firing"),
        ("group_status", "resolved"),
    ]


def test_an_alert_is_recorded_once_and_delivery_is_remembered(store: Store) -> None:
    alert = alerts_for(group_changes({}, [health(PartitionStatus.STOP, 1)]), [])[0]
    assert store.alerts.add(alert)
    assert not store.alerts.add(alert)  # the same occurrence again (a retried task)
    store.alerts.mark_delivered(alert.key, {"log": "ok", "webhook": "error: HTTP 500"}, 2 * M)
    assert store.alerts.pending() == []
    [stored] = store.alerts.read()
    assert (stored.title, stored.delivered_ms, stored.deliveries["webhook"]) == (alert.title, 2 * M, "error: HTTP 500")
    assert stored.details["partitions"][0]["evidence"] == {"window": [[1, 2, 3]]}


def test_two_dispatchers_never_both_claim_an_alert_and_an_abandoned_claim_is_taken_over(store: Store) -> None:
    alert = alerts_for(group_changes({}, [health(PartitionStatus.STOP, 1)]), [])[0]
    store.alerts.add(alert)
    assert store.alerts.claim(alert.key, 10 * M)
    assert not store.alerts.claim(alert.key, 10 * M + 1)  # the second dispatcher finds it taken
    assert store.alerts.pending(11 * M) == []  # claimed a minute ago: in flight
    assert [a.key for a in store.alerts.pending(21 * M)] == [alert.key]  # the claimer died ten minutes ago
    assert store.alerts.claim(alert.key, 21 * M)
    store.alerts.release(alert.key)  # no notifier could deliver it: pending again at once
    assert [a.key for a in store.alerts.pending(21 * M)] == [alert.key]


def test_an_unreachable_store_names_it_without_the_password() -> None:
    store = Store("postgresql+psycopg2://khipu:s3cret@127.0.0.1:1/khipu", connect_args={"connect_timeout": 2})
    with pytest.raises(StoreError) as caught:
        store.migrate()
    assert "127.0.0.1:1/khipu" in str(caught.value) and "s3cret" not in str(caught.value)


def test_a_store_never_migrated_says_so_and_what_to_run(tmp_path: Path, empty_postgres_url: str) -> None:
    for url in (f"sqlite:///{tmp_path / 'empty.db'}", empty_postgres_url):
        store = Store(url)
        with pytest.raises(StoreError) as caught:
            store.verdicts.read()
        store.close()
        message = str(caught.value)
        assert "verdicts" in message and "khipu store migrate" in message, message


def _beat(at_ms: int, caught_up: bool, read_to_ms: int | None) -> dict[str, object]:
    return {"query_name": "khipu_detector", "run_id": "r", "batch_id": 1, "at_ms": at_ms, "input_rows": 10,
            "caught_up": caught_up, "read_to_ms": read_to_ms}  # fmt: skip


def test_a_checkpoint_started_over_has_read_nothing_whatever_earlier_checkpoints_read(store: Store) -> None:
    hb = store.heartbeat
    hb.record(_beat(1_000_000, caught_up=True, read_to_ms=990_000))
    hb.record_read_to("khipu_detector", 995_000, 1_000_500)
    assert hb.read_to_ms("khipu_detector") == 1_000_000  # the start of the newest batch that read everything

    hb.start_over("khipu_detector", 1_001_000)  # a new checkpoint, reading the topic from its start
    assert hb.read_to_ms("khipu_detector") == 0  # the old run's heartbeats say nothing of what it read
    hb.record_read_to("khipu_detector", 400_000, 1_002_000)  # its first batch: older traces
    hb.record(_beat(1_002_000, caught_up=False, read_to_ms=400_000))
    assert hb.read_to_ms("khipu_detector") == 400_000
    hb.record(_beat(1_010_000, caught_up=True, read_to_ms=None))
    assert hb.read_to_ms("khipu_detector") == 1_010_000


def test_the_running_batch_clock_moves_forward_only_and_a_new_checkpoint_forgets_it(store: Store) -> None:
    hb = store.heartbeat
    hb.record_running_read_to("khipu_detector", 500_000)
    assert hb.running_read_to_ms("khipu_detector") is None  # no progress kept for the query yet
    hb.start_over("khipu_detector", 1_000_000)
    hb.record_running_read_to("khipu_detector", 1_002_000)
    hb.record_running_read_to("khipu_detector", 1_001_000)  # an older figure never moves it back
    assert hb.running_read_to_ms("khipu_detector") == 1_002_000
    assert hb.read_to_ms("khipu_detector") == 0  # what the finished batches read is kept apart
    hb.start_over("khipu_detector", 1_003_000)  # a new checkpoint: what the old one's batch was to read says nothing
    assert hb.running_read_to_ms("khipu_detector") is None
