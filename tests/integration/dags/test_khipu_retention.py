"""The retention DAG under dag.test(): typed Params, a dry run that changes nothing and says exactly what the real
run then removes, and a real run on a store and archives several days old that leaves exactly what the limits
say, keeping a confirmed loss that still waits for its resend.

Real parts: Airflow's dag.test(), a SQLite store, the archives written by the detector's own writers
(khipu.trace.archive.write_batch, VerdictArchive.write_batch).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from khipu.store import Store
from khipu.trace import archive
from khipu.trace.archive import HOUR_MS, hour_of
from khipu.verdicts.archive import VerdictArchive, verdict_table
from khipu.verdicts.book import VerdictBook, verdict_of
from khipu.verdicts.metrics import counts_by_minute, metrics_of
from khipu.verdicts.settle import Change

pytestmark = pytest.mark.integration
DAGS = Path(__file__).resolve().parents[3] / "dags"
DAY_H = 24
AGES_H = (1, 5, 30, 47, 49, 70, 100, 150, 240)  # hours back from this hour: trace- and verdict-archive hours
PINNED_AGE_H = 100  # the confirmed loss still waiting for its resend was first seen (and decided) then
LIMITS = {  # a 60 s horizon reaches 3 h back; + 24 backfill hours = 27 <= 48
    "trace_archive_hours": 48, "verdict_archive_hours": 72, "verdict_days": 5, "quarantine_days": 2,
    "heartbeat_days": 1, "minute_metrics_days": 2, "metrics_days": 8, "backfill_hours": 24,
}  # fmt: skip


def trace(message_id: str, at_ms: int, kind: str = "SENT") -> dict[str, Any]:
    return {"message_id": message_id, "stream": "orders", "location": "p", "cluster": "local", "type": kind,
            "timestamp_ms": at_ms, "topic": "orders", "partition": 0, "offset": 1, "group": None, "emitter_id": "e",
            "emitter_seq": 1, "sampling_percent": 100.0, "attributes": json.dumps({"customer": "c-7"}),
            "prev_offsets": None, "kafka_timestamp_ms": at_ms}  # fmt: skip


def delivered(message_id: str, at_ms: int, hop: str = "local/orders -> sink") -> dict[str, Any]:
    return {"message_id": message_id, "hop": hop, "stream": "orders", "hop_kind": "read", "verdict": "DELIVERED",
            "cause": None, "count": 1, "topic": "orders", "partition": 0, "offset": 1, "group": "sink",
            "location": "sink", "observed_ms": at_ms, "latency_ms": 40, "e2e_latency_ms": 40, "decided_ms": at_ms,
            "detail": "", "first_seen_ms": at_ms - 1_000}  # fmt: skip


@pytest.fixture
def aged(airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    registry = tmp_path / "registry.yaml"
    registry.write_text(
        "version: 1\nclusters: {local: {connection_id: khipu_kafka}}\nstreams:\n  orders:\n    owner: team-t\n"
        "    resend: {mode: manual}\n    route:\n      producers: [{location: p, writes: [local/orders]}]\n"
        "      consumers: [{group: sink, reads: [local/orders]}]\n"
    )
    state, store_path = tmp_path / "state", tmp_path / "khipu.db"
    for variable, value in {
        "KHIPU_STATE_DIR": str(state),
        "KHIPU_REGISTRY": str(registry),
        "KHIPU_RECONCILE_HORIZON_MS": "60000",
        "AIRFLOW_CONN_KHIPU_STORE": json.dumps({"conn_type": "sqlite", "host": str(store_path)}),
    }.items():
        monkeypatch.setenv(variable, value)
    hour = int(time.time() * 1000) // HOUR_MS * HOUR_MS
    store = Store(f"sqlite:///{store_path}")
    store.migrate()
    traces, verdicts = state / "archive", VerdictArchive(state / "verdicts", store)
    for batch, age in enumerate(AGES_H):
        at = hour - age * HOUR_MS + 600_000
        rows = [trace(f"m{age}-{i}", at + i) for i in range(3)]
        if age == PINNED_AGE_H:
            rows.append(trace("pinned", at - 500))
        archive.write_batch(traces, batch, pa.Table.from_pylist(rows, schema=archive.SCHEMA))
        archived = [delivered(f"m{age}-{i}", at + 5_000 + i) for i in range(3)]
        if age == PINNED_AGE_H:  # its read hop delivered it; the loss is on a hop after it
            archived.append(delivered("pinned", at + 4_000))
        verdicts.write_batch(batch, verdict_table(archived))
    verdicts.close()

    at = hour - PINNED_AGE_H * HOUR_MS + 600_000
    stored = [  # (message, kind, age in hours)
        ("pinned", "CONFIRMED_LOST", PINNED_AGE_H), ("old-dup", "DUPLICATE", 6 * DAY_H),
        ("old-lost", "LOST", 9 * DAY_H), ("young-dup", "DUPLICATE", 2 * DAY_H),
    ]  # fmt: skip
    rows = [
        {**delivered(m, hour - age * HOUR_MS + 600_000, hop="local/orders -> archive"), "verdict": kind}
        for m, kind, age in stored
    ]
    VerdictBook(store.verdicts).apply([Change(verdict_of(r), "decided") for r in rows], at)
    minutes = [
        delivered(f"metric-{age}", hour - age * HOUR_MS + 60_000 * k) for age in (1, 50, 100, 300) for k in (1, 2)
    ]
    store.verdicts.replace_part("detector:q:1", counts_by_minute(minutes), metrics_of)
    for offset, age in enumerate((1, 3 * DAY_H)):
        store.channel.add_quarantine(
            [{"source_topic": "khipu.traces", "source_partition": 0, "source_offset": offset,
              "quarantine_reason": "bad", "raw_value": b"x"}], hour - age * HOUR_MS
        )  # fmt: skip
    return {"store": store, "state": state, "hour": hour}


def files(state: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(state)), p.stat().st_size) for p in state.rglob("*") if p.is_file())


def run_retention(conf: dict[str, Any]) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS)).get_dag("khipu_retention").test(run_conf=conf)


def test_a_dry_run_changes_nothing_then_the_run_leaves_exactly_what_the_limits_say(aged: dict[str, Any]) -> None:
    from airflow.utils.state import DagRunState

    store, state, hour = aged["store"], aged["state"], aged["hour"]
    before = (files(state), store.verdicts.rows(), store.verdicts.read_metrics(), store.channel.quarantined())

    dry = run_retention({**LIMITS, "dry_run": True})
    assert dry.state == DagRunState.SUCCESS
    said = dry.get_task_instance("apply_retention").xcom_pull(task_ids="apply_retention")
    assert (files(state), store.verdicts.rows(), store.verdicts.read_metrics(), store.channel.quarantined()) == before

    real = run_retention(LIMITS)
    assert real.state == DagRunState.SUCCESS
    done = real.get_task_instance("apply_retention").xcom_pull(task_ids="apply_retention")
    assert said["removed"] == done["removed"] and said["dry_run"] and not done["dry_run"]

    def hours_of(root: Path) -> list[str]:
        return sorted(p.name.removeprefix("hour=") for p in root.glob("hour=*"))

    expected_traces = {hour_of(hour - age * HOUR_MS) for age in AGES_H if age <= LIMITS["trace_archive_hours"]}
    pinned_hour = hour_of(hour - PINNED_AGE_H * HOUR_MS)
    assert hours_of(state / "archive") == sorted(expected_traces | {pinned_hour})
    kept = archive.read_traces_in_hours(state / "archive", ["pinned", f"m{PINNED_AGE_H}-0"], [hour // HOUR_MS - 100])
    assert [t.message_id for t in kept] == ["pinned"]  # its hour was reduced to the pinned message's traces
    assert kept[0].attributes == {"customer": "c-7"}  # what a resend hook is given
    assert done["removed"]["trace_archive_hours"] == len([a for a in AGES_H if a > 48]) - 1

    expected_verdict_hours = {hour_of(hour - age * HOUR_MS) for age in AGES_H if age <= LIMITS["verdict_archive_hours"]}
    assert hours_of(state / "verdicts") == sorted(expected_verdict_hours)
    rows = {(r["message_id"], r["hop"]): r["verdict"] for r in store.verdicts.rows()}
    assert rows == {
        ("pinned", "local/orders -> archive"): "CONFIRMED_LOST",  # awaits its resend: kept at 100 h (limit 5 days)
        ("pinned", "local/orders -> sink"): "DELIVERED",  # its archived read hop, copied here before its hour went
        ("old-lost", "local/orders -> archive"): "LOST",  # unsettled: kept at any age
        ("young-dup", "local/orders -> archive"): "DUPLICATE",
    }  # old-dup, 6 days old, is gone
    minutes = {
        (m["hop"].split(" -> ")[1], m["minute_ms"], m["delivered"], m["duplicate"], m["confirmed_lost"])
        for m in store.verdicts.read_metrics()
    }
    minute_rows = {  # what the test wrote: two DELIVERED minutes (sink) at each age, the stored verdicts (archive)
        ("sink", hour - HOUR_MS + 60_000, 1, 0, 0),
        ("sink", hour - HOUR_MS + 120_000, 1, 0, 0),  # 1 h: minutes
        ("sink", hour - 50 * HOUR_MS, 2, 0, 0),
        ("sink", hour - 100 * HOUR_MS, 2, 0, 0),  # > 2 days: one per hour
        ("archive", hour - 48 * HOUR_MS + 600_000, 0, 1, 0),  # young-dup (2 days old: not rolled yet)
        ("archive", hour - 100 * HOUR_MS, 0, 0, 1),  # the pinned loss, rolled into its hour
        ("archive", hour - 144 * HOUR_MS, 0, 1, 0),  # old-dup's count: the metrics keep 8 days, its row went at 5
    }  # 300 h and old-lost's 9 days: older than the 8 metric days, gone
    assert minutes == minute_rows, sorted(minutes)
    assert [r["source_offset"] for r in store.channel.quarantined()] == [0]

    again = run_retention(LIMITS)
    second = again.get_task_instance("apply_retention").xcom_pull(task_ids="apply_retention")
    assert not any(second["removed"].values())  # nothing more to remove


def test_limits_that_would_starve_reconciliation_are_refused_and_nothing_removed(
    aged: dict[str, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    from airflow.utils.state import DagRunState

    before = files(aged["state"])
    run = run_retention({**LIMITS, "trace_archive_hours": 20})
    assert run.state == DagRunState.FAILED
    out, err = capfd.readouterr()
    assert "retention setting 'trace_archive_hours': got 20; expected >= 27" in out + err
    assert files(aged["state"]) == before


def test_the_run_compacts_each_closed_hour_once_and_a_second_run_finds_nothing(aged: dict[str, Any]) -> None:
    """Two closed hours of 30 micro-batches each, and the current hour, which the detector is still reading: the run
    leaves each closed hour one file holding the same traces and verdicts, the current hour as it was; a dry run
    before it changed nothing, and a run after it finds nothing to do."""
    from airflow.utils.state import DagRunState

    from khipu.detector.model import DETECTOR_QUERY
    from khipu.storage.compaction import COMPACTED_FOLDER

    store, state, hour = aged["store"], aged["state"], aged["hour"]
    closed = (hour - 3 * HOUR_MS, hour - 2 * HOUR_MS)
    ids = [f"c{n}-{batch}" for n in range(3) for batch in range(30)]
    with VerdictArchive(state / "verdicts", store) as verdicts:
        for batch in range(30):
            for n, at in enumerate((*closed, hour)):
                key = 1_000 + batch * 3 + n
                archive.write_batch(
                    state / "archive", key, pa.Table.from_pylist([trace(f"c{n}-{batch}", at + batch)], archive.SCHEMA)
                )
                verdicts.write_batch(key, verdict_table([delivered(f"c{n}-{batch}", at + batch + 10)]))
                verdicts.index.record(key, [(f"c{n}-{batch}", at + batch - 1_000, hour_of(at + batch + 10))])
        verdicts.write_batch(2_000, verdict_table([]))  # the batches after: none of those is the replayable one
        archive.write_batch(state / "archive", 2_000, pa.Table.from_pylist([], archive.SCHEMA))
        found_before = verdicts.search(ids).rows
    traces_before = archive.read_traces(state / "archive", ids, hour - 3 * HOUR_MS, hour + HOUR_MS)
    store.heartbeat.record_read_to(DETECTOR_QUERY, hour + 15 * 60_000, hour + 15 * 60_000)  # the hour is unread

    def batch_folders(root: Path, at: int) -> list[str]:
        return sorted(p.name for p in (root / f"hour={hour_of(at)}").iterdir())

    before = files(state)
    dry = run_retention({**LIMITS, "dry_run": True})
    assert dry.state == DagRunState.SUCCESS and files(state) == before
    real = run_retention(LIMITS)
    assert real.state == DagRunState.SUCCESS
    summary = real.get_task_instance("compact_archives").xcom_pull(task_ids="compact_archives")
    for name, root, limit in (
        ("trace archive", state / "archive", LIMITS["trace_archive_hours"]),
        ("verdict archive", state / "verdicts", LIMITS["verdict_archive_hours"]),
    ):
        # the hours the removal kept (one micro-batch each: the fixture's; the pinned one reduced is not one) and ours
        kept = {hour_of(hour - age * HOUR_MS) for age in AGES_H if age <= limit}
        assert summary[name]["hours"] == sorted(kept | {hour_of(at) for at in closed})
        assert (summary[name]["files_before"], summary[name]["files_after"]) == (len(kept) + 60, len(kept) + 2)
        for at in closed:
            figures = summary[name]["by_hour"][hour_of(at)]
            assert (figures["files_before"], figures["files_after"]) == (30, 1)
            assert batch_folders(root, at) == [COMPACTED_FOLDER]
            assert len(list((root / f"hour={hour_of(at)}" / COMPACTED_FOLDER).iterdir())) == 1
        assert len(batch_folders(root, hour)) == 30  # the hour being read: left as it is
    assert archive.read_traces(state / "archive", ids, hour - 3 * HOUR_MS, hour + HOUR_MS) == traces_before
    with VerdictArchive(state / "verdicts", store) as verdicts:
        assert verdicts.search(ids).rows == found_before and len(found_before) == 90

    compacted = files(state)
    again = run_retention(LIMITS)
    second = again.get_task_instance("compact_archives").xcom_pull(task_ids="compact_archives")
    assert files(state) == compacted
    assert [second[name]["hours"] for name in second] == [[], []]
