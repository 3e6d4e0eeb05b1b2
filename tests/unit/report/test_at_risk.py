"""Messages at risk: which unconsumed records retention removes before their group reaches them, with the time
left; the group's pace from its snapshots; which backlogs can hold such records, and where their traces are."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
import pytest

from khipu.offsets.model import PartitionKey, PartitionSnapshot
from khipu.report.at_risk import (
    Backlog,
    SentRecord,
    at_risk,
    backlogs_of,
    exposed,
    oldest_age_ms,
    pace_per_ms,
    reached_at_ms,
    scan_sent,
    trace_window,
)
from khipu.storage.location import Location
from khipu.trace.archive import SCHEMA, write_batch

NOW = 1_795_000_000_000
KEY = PartitionKey("local", "sink", "orders", 0)
RETENTION = 60_000
HOUR = 3_600_000

# committed 100, log 90..110: offsets 100..109 unconsumed, none gone; not moving unless a case says so
BACKLOG = Backlog(
    KEY, committed=100, log_start=90, log_end=110, retention_ms=RETENTION, observed_ms=NOW, pace_per_ms=0.0
)


def record(offset: int, written_ms: int, message_id: str | None = None) -> SentRecord:
    return SentRecord(message_id or f"m-{offset}", "s", "local", "orders", 0, offset, written_ms)


@dataclass(frozen=True)
class Case:
    name: str
    backlog: Backlog
    record: SentRecord
    within_ms: int
    expected: tuple[int, int | None, bool] | None  # (time left, reached at, gone); None: not at risk


CASES = [
    Case("1. a stopped group: an unconsumed record leaving within the look-ahead is at risk, with its time left",
         BACKLOG, record(105, NOW - 50_000), HOUR, (10_000, None, False)),
    Case("2. already past its retention but still in the log (segment not deleted yet): due now, time left negative",
         BACKLOG, record(100, NOW - 61_000), HOUR, (-1_000, None, False)),
    Case("3. leaving after the look-ahead: not listed (yet)",
         BACKLOG, record(105, NOW - 50_000), 5_000, None),
    Case("4. consumed (below the committed offset): never at risk",
         BACKLOG, record(99, NOW - 59_000), HOUR, None),
    Case("5. past the log end the snapshot saw: not a record of this backlog",
         BACKLOG, record(110, NOW - 59_000), HOUR, None),
    Case("6. a moving group reaching it before it leaves: not at risk (6 records at 1/s: 6 s, it has 10 s)",
         replace(BACKLOG, pace_per_ms=0.001), record(105, NOW - 50_000), HOUR, None),
    Case("7. a moving group too slow for it: at risk, with when the group would get there (6 records at 0.5/s: 12 s)",
         replace(BACKLOG, pace_per_ms=0.0005), record(105, NOW - 50_000), HOUR, (10_000, NOW + 12_000, False)),
    Case("8. below the log start: gone unread, whatever the look-ahead",
         replace(BACKLOG, log_start=103), record(101, NOW - 70_000), 1, (-10_000, None, True)),
    Case("9. the time left goes by the record's own timestamp, not the snapshot's",
         replace(BACKLOG, observed_ms=NOW - 30_000), record(108, NOW - 20_000), HOUR, (40_000, None, False)),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_record_is_at_risk_when_it_leaves_the_log_before_its_group_reaches_it(case: Case) -> None:
    found = at_risk([case.backlog], [case.record], NOW, case.within_ms)
    if case.expected is None:
        assert found == []
        return
    (row,) = found
    assert (row.time_left_ms, row.reached_ms, row.gone) == case.expected
    assert (row.message_id, row.group, row.offset) == (case.record.message_id, KEY.group, case.record.offset)
    assert row.leaves_ms == case.record.timestamp_ms + case.backlog.retention_ms


def test_rows_are_soonest_to_leave_first_once_each_and_per_group() -> None:
    other = replace(BACKLOG, key=KEY._replace(group="audit"), committed=104)
    records = [record(106, NOW - 40_000), record(101, NOW - 55_000), record(104, NOW - 50_000)]
    found = at_risk([BACKLOG, other], [*records, records[0]], NOW, HOUR)  # the first archived twice
    assert [(r.group, r.offset) for r in found] == [
        ("sink", 101),
        ("audit", 104),
        ("sink", 104),
        ("audit", 106),
        ("sink", 106),
    ]
    assert [r.time_left_ms for r in found] == [5_000, 10_000, 10_000, 20_000, 20_000]
    elsewhere = SentRecord("x", "s", "local", "orders", 1, 105, NOW - 50_000)  # partition 1: another backlog's
    assert at_risk([BACKLOG], [elsewhere], NOW, HOUR) == []


def snapshot(
    at_ms: int, committed: int | None, state: str = "STABLE", assigned: bool | None = True
) -> PartitionSnapshot:
    return PartitionSnapshot(
        at_ms, "local", "sink", "orders", 0, committed, 0, 500, state, RETENTION, assigned=assigned
    )


@pytest.mark.parametrize(
    ("name", "history", "pace"),
    [
        ("committing 60 records a minute: 0.001 a ms", [snapshot(NOW - 60_000, 100), snapshot(NOW, 160)], 0.001),
        ("the last 10 min", [snapshot(NOW - 1_200_000, 0), snapshot(NOW - 60_000, 100), snapshot(NOW, 160)], 0.001),
        ("no member holds it now: not moving", [snapshot(NOW - 60_000, 100), snapshot(NOW, 160, "EMPTY", False)], 0.0),
        ("one snapshot: not known to move", [snapshot(NOW, 160)], 0.0),
        ("gone back (a rewind): not moving forward", [snapshot(NOW - 60_000, 160), snapshot(NOW, 100)], 0.0),
    ],
)  # fmt: skip
def test_a_groups_pace_is_its_recent_commits_per_ms(name: str, history: list[PartitionSnapshot], pace: float) -> None:
    assert pace_per_ms(history, NOW) == pytest.approx(pace), name


def test_when_a_moving_group_reaches_an_offset() -> None:
    moving = replace(BACKLOG, pace_per_ms=0.002)
    assert reached_at_ms(moving, 100) == NOW + 500  # one record at 2 a second
    assert reached_at_ms(moving, 99) == NOW  # passed already
    assert reached_at_ms(BACKLOG, 100) is None


@pytest.mark.parametrize(
    ("name", "backlog", "within", "expected"),
    [
        ("nothing unconsumed, nothing gone", replace(BACKLOG, committed=110), HOUR, False),
        ("oldest unconsumed 50 s old of 60: leaves in 10 s", replace(BACKLOG, time_lag_ms=50_000), 60_000, True),
        ("...but not within 5 s", replace(BACKLOG, time_lag_ms=50_000), 5_000, False),
        ("its age unknown: perhaps", BACKLOG, 1, True),
        ("records below the log start: gone", replace(BACKLOG, log_start=105, time_lag_ms=0), 1, True),
    ],
)  # fmt: skip
def test_a_backlog_is_looked_at_when_a_record_can_leave_within_the_look_ahead(
    name: str, backlog: Backlog, within: int, expected: bool
) -> None:
    assert exposed(backlog, NOW, within) is expected, name


def test_the_traces_are_looked_for_from_the_oldest_unconsumed_write_to_the_last_that_can_leave_in_time() -> None:
    assert trace_window(replace(BACKLOG, time_lag_ms=50_000), NOW, 60_000, slack_ms=1_000) == (
        NOW - 51_000,
        NOW + 60_000 - RETENTION + 1_000,
    )
    assert trace_window(BACKLOG, NOW, 0, slack_ms=0) == (NOW - 2 * RETENTION, NOW - RETENTION)


def test_backlogs_come_from_the_newest_snapshot_with_the_partitions_health() -> None:
    unlimited = PartitionKey("local", "sink", "forever", 0)
    histories = {
        KEY: [snapshot(NOW - 60_000, 100), snapshot(NOW, 160)],
        unlimited: [PartitionSnapshot(NOW, "local", "sink", "forever", 0, 1, 0, 9, "STABLE", -1)],
    }
    (backlog,) = backlogs_of(histories, {KEY: (42_000, "EXPIRY_RISK")})  # unlimited retention: never at risk
    assert (backlog.committed, backlog.log_end, backlog.retention_ms, backlog.observed_ms) == (160, 500, RETENTION, NOW)
    assert (backlog.time_lag_ms, backlog.status, backlog.pace_per_ms) == (42_000, "EXPIRY_RISK", pytest.approx(0.001))


def test_a_backlog_whose_time_lag_was_not_measured_is_reckoned_with_the_bound_it_is_under() -> None:
    """Records written since the previous snapshot have no measured age (consumer health's time lag is None) but
    are no older than the time since that snapshot: their exposure and their traces' hours are reckoned with it."""
    row = {"time_lag_ms": None, "evidence": json.dumps({"time_lag_under_ms": 60_000})}
    assert oldest_age_ms(row) == 60_000
    assert oldest_age_ms({"time_lag_ms": 42_000, "evidence": "{}"}) == 42_000
    assert oldest_age_ms({"time_lag_ms": None, "evidence": "{}"}) is None  # unknown: perhaps exposed


@pytest.mark.parametrize("given_as", ["path", "location"])
def test_the_sent_traces_of_a_backlogs_unconsumed_offsets_are_read_from_the_archive(
    tmp_path: Path, given_as: str
) -> None:
    """scan_sent reads the archive's hours as the detector's writer left them, given a folder's path or a storage
    Location (as the settings give it): the SENT traces at the backlog's offsets 100..109, nothing else."""
    hour = NOW // HOUR * HOUR
    rows = [trace(f"m-{offset}", "SENT", offset, hour + offset) for offset in (99, 100, 105, 109, 110)] + [
        trace("m-read", "RECEIVED", 104, hour + 1),
        trace("m-other-topic", "SENT", 104, hour + 2, topic="other"),
    ]
    write_batch(tmp_path / "archive", 1, pa.Table.from_pylist(rows, schema=SCHEMA))
    write_batch(tmp_path / "archive", 2, pa.Table.from_pylist([trace("m-101", "SENT", 101, hour - HOUR)], SCHEMA))
    archive = Location.of(tmp_path / "archive") if given_as == "location" else tmp_path / "archive"
    found = scan_sent(archive, [hour // HOUR - 1, hour // HOUR], [BACKLOG])
    assert sorted((r.message_id, r.offset, r.timestamp_ms) for r in found) == [
        ("m-100", 100, hour + 100), ("m-101", 101, hour - HOUR), ("m-105", 105, hour + 105),
        ("m-109", 109, hour + 109),
    ]  # fmt: skip
    assert scan_sent(archive, [hour // HOUR + 1], [BACKLOG]) == []  # an hour not written holds nothing


def trace(message_id: str, kind: str, offset: int, at_ms: int, topic: str = "orders") -> dict[str, object]:
    """An archived trace of KEY's cluster and partition (the columns of khipu.trace.archive.SCHEMA)."""
    row: dict[str, object] = dict.fromkeys(SCHEMA.names)
    row.update(
        message_id=message_id, stream="s", location="p", cluster=KEY.cluster, type=kind, timestamp_ms=at_ms,
        topic=topic, partition=KEY.partition, offset=offset, emitter_id="e", emitter_seq=offset,
        kafka_timestamp_ms=at_ms,
    )  # fmt: skip
    return row
