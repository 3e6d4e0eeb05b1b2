"""The backfill DAG under dag.test(): typed Params, a dry run that writes nothing, a real run that confirms
and retracts on what retention kept, the hourly reconcile DAG over the same hour changing nothing, and bad windows
(and one retention removed) refused with their reason.

Real parts: the session's Kafka broker (the stream's records, with their khipu headers, and the
group's committed offset), spark-submit of spark/reconcile.py in local mode, a SQLite store.
The archive is laid out as the detector writes it (Parquet by hour), from traces written here; in the last test it
is in the object store (s3proxy), written by the detector's own writer and compacted by the retention DAG.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from khipu.clock import iso_text
from khipu.detector.model import DETECTOR_QUERY
from khipu.localstack.broker import BrokerProcess
from khipu.localstack.object_store import ObjectStoreProcess
from khipu.reconcile.window import HOUR_MS
from khipu.storage.compaction import COMPACTED_FOLDER
from khipu.storage.location import Location
from khipu.store import Store
from khipu.trace import archive
from khipu.tracing.headers import TraceContext
from khipu.verdicts.book import VerdictBook
from khipu.verdicts.model import Cause, Verdict, VerdictKind
from khipu.verdicts.settle import Change

pytestmark = pytest.mark.integration
DAGS = Path(__file__).resolve().parents[3] / "dags"
HORIZON_MS = 60_000
COLUMNS = (
    "message_id string, stream string, location string, cluster string, type string, timestamp_ms long, "
    "topic string, partition int, offset long, `group` string, emitter_id string, emitter_seq long, "
    "sampling_percent double, attributes string, prev_offsets array<long>"
)


def verdict(message_id: str, topic: str, offset: int, group: str, at_ms: int) -> Verdict:
    return Verdict(
        message_id=message_id, stream="orders", hop=f"local/{topic} -> {group}", hop_kind="read",
        kind=VerdictKind.LOST, cause=Cause.SKIPPED_BY_CONSUMER, count=0, topic=topic, partition=0, offset=offset,
        group=group, location=None, observed_ms=None, latency_ms=None, e2e_latency_ms=None, decided_ms=at_ms + 40_000,
        detail="streaming", first_seen_ms=at_ms,
    )  # fmt: skip


@pytest.fixture
def backfill_env(
    broker: BrokerProcess,
    airflow_db: Path,
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, Any]:
    topic, group = f"orders-{secrets.token_hex(3)}", f"sink-{secrets.token_hex(3)}"
    registry = tmp_path / "registry.yaml"
    registry.write_text(
        "version: 1\nclusters: {local: {connection_id: khipu_kafka}}\nstreams:\n  orders:\n    owner: team-t\n"
        f"    route:\n      producers: [{{location: p, writes: [local/{topic}]}}]\n"
        f"      consumers: [{{group: {group}, reads: [local/{topic}]}}]\n"
    )
    state, store_path = tmp_path / "state", tmp_path / "khipu.db"
    for variable, value in {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # spark-submit, as make up has it
        "KHIPU_STATE_DIR": str(state),
        "KHIPU_REGISTRY": str(registry),
        "KHIPU_RECONCILE_HORIZON_MS": str(HORIZON_MS),
        "AIRFLOW_CONN_KHIPU_KAFKA": json.dumps(
            {"conn_type": "kafka", "extra": {"bootstrap.servers": broker.bootstrap_servers, "khipu.cluster": "local"}}
        ),
        "AIRFLOW_CONN_KHIPU_STORE": json.dumps({"conn_type": "sqlite", "host": str(store_path)}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
            {
                "conn_type": "spark",
                "host": "local[2]",
                "extra": {"deploy-mode": "client", "spark-binary": "spark-submit"},
            }
        ),
    }.items():
        monkeypatch.setenv(variable, value)

    # the stream's records on the broker: m-gone@0, m-late@1, m-untraced@2 (none of its traces arrived), m-ok@3
    broker.admin().ensure_topics({topic: 1})
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for message_id in ("m-gone", "m-late", "m-untraced", "m-ok"):
        headers = TraceContext(message_id, "orders", 100.0).as_headers()
        producer.produce(topic, key=message_id.encode(), value=b"{}", headers=headers)
    assert producer.flush(10) == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    consumer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)  # the group went past all four
    consumer.close()

    now = int(time.time() * 1000)
    t0 = (now - 3 * HOUR_MS) // HOUR_MS * HOUR_MS + 600_000  # ten minutes into an hour, three hours ago

    def trace(message_id: str, kind: str, offset: int, at_ms: int, prev: list[int] | None = None) -> tuple[Any, ...]:
        location, by = ("p", None) if kind == "SENT" else (group, group)
        return (message_id, "orders", location, "local", kind, at_ms, topic, 0, offset, by, f"{location}-e", offset,
                100.0, None, prev)  # fmt: skip

    rows = [
        trace("m-gone", "SENT", 0, t0),
        trace("m-late", "SENT", 1, t0 + 1_000),
        trace("m-late", "RECEIVED", 1, t0 + 50_000),  # came after the detector had called it LOST
        trace("m-ok", "SENT", 3, t0 + 3_000),
        trace("m-ok", "RECEIVED", 3, t0 + 3_500, prev=[2]),  # the sink received offset 2 before it: a lead
    ]
    hour = time.strftime("%Y-%m-%d-%H", time.gmtime(t0 / 1000))
    spark.createDataFrame(rows, COLUMNS).write.parquet(str(state / "archive" / f"hour={hour}" / "batch_id=0"))

    store = Store(f"sqlite:///{store_path}")
    store.migrate()
    store.heartbeat.record(
        {"query_name": DETECTOR_QUERY, "run_id": "r", "batch_id": 9, "at_ms": now, "input_rows": 0,
         "input_rows_per_s": 0.0, "processed_rows_per_s": 0.0, "batch_duration_ms": 0, "state_rows": None,
         "state_bytes": None, "caught_up": True}
    )  # fmt: skip
    streaming = [verdict("m-gone", topic, 0, group, t0), verdict("m-late", topic, 1, group, t0 + 1_000)]
    VerdictBook(store.verdicts).apply([Change(v, "decided") for v in streaming], t0 + 41_000)
    return {
        "store": store,
        "start": iso_text(t0 - 60_000),
        "end": iso_text(t0 + 60_000),
        "group": group,
        "hour": hour,
        "t0": t0,
        "archived_to": now,
    }


def run_backfill(conf: dict[str, Any]) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(DAGS)).get_dag("khipu_backfill")
    return dag.test(run_conf=conf)


def states(run: Any) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def verdicts(store: Store) -> dict[str, tuple[str, str | None]]:
    return {
        r["message_id"]: (r["verdict"], r["evidence_kind"]) for r in store.verdicts.rows() if r["hop_kind"] == "read"
    }


def test_backfill_dry_run_then_retention_then_real_run_then_the_same_window_again(
    backfill_env: dict[str, Any], spark: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    """A dry run writes nothing. Retention with the shortest limits the 1-minute horizon allows (3 h of
    reconciliation reach + 1 backfill hour) removes an archive hour 30 h old and keeps the window's, which then
    backfills to the verdicts the traces say; the hourly DAG reconciling that hour again (the window it computes
    holds the backfill's) changes nothing, and the removed hour is refused."""
    import pendulum
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    store: Store = backfill_env["store"]
    group = backfill_env["group"]
    window = {"start": backfill_env["start"], "end": backfill_env["end"]}
    state = Path(os.environ["KHIPU_STATE_DIR"])
    old_at = backfill_env["t0"] - 30 * HOUR_MS
    old_hour = time.strftime("%Y-%m-%d-%H", time.gmtime(old_at / 1000))
    old = [("m-old", "orders", "p", "local", "SENT", old_at, "t", 0, 9, None, "p-e", 9, 100.0, None, None)]
    spark.createDataFrame(old, COLUMNS).write.parquet(str(state / "archive" / f"hour={old_hour}" / "batch_id=1"))
    before = store.verdicts.rows()

    dry = run_backfill({**window, "dry_run": True})
    assert dry.state == DagRunState.SUCCESS, states(dry)
    assert states(dry)["announce_confirmed_losses"] == "skipped"  # a dry run announces nothing
    assert store.verdicts.rows() == before

    limits = {"trace_archive_hours": 4, "backfill_hours": 1, "verdict_archive_hours": 4, "verdict_days": 1}
    retention = DagBag(dag_folder=str(DAGS)).get_dag("khipu_retention").test(run_conf=limits)
    assert retention.state == DagRunState.SUCCESS
    hours = sorted(p.name.removeprefix("hour=") for p in (state / "archive").glob("hour=*"))
    assert hours == [backfill_env["hour"]]  # the window's hour stays, the 30-hour-old one went

    real = run_backfill({**window, "dry_run": False})
    assert real.state == DagRunState.SUCCESS, states(real)
    assert verdicts(store) == {
        "m-gone": ("CONFIRMED_LOST", "LOST"),
        "m-late": ("RETRACTED", "DELIVERED"),
        "m-ok": ("DELIVERED", None),
        "m-untraced": ("TRACE_LOST", None),  # no trace at all: named by its record's header, judged from the pointer
    }
    assert states(real)["announce_confirmed_losses"] == "success"
    # Airflow shows an Asset's events to every user, whatever their team: the event counts, it names nothing
    assert confirmed_loss_events() == [{"count": 1}]
    assert real.get_task_instance("announce_confirmed_losses").xcom_pull(task_ids="announce_confirmed_losses") == {
        "count": 1
    }
    summary = real.get_task_instance("reconcile_window").xcom_pull(task_ids="reconcile_window")
    assert [c["message_id"] for c in summary["confirmed_losses"]] == ["m-gone"]
    assert [(lead["offset"], lead["message_id"]) for lead in summary["leads"]] == [(2, "m-untraced")]
    history = [(h["from_verdict"], h["to_verdict"]) for h in store.verdicts.history("m-late") if group in h["hop"]]
    assert history == [(None, "LOST"), ("LOST", "RETRACTED")]

    after = store.verdicts.rows()
    hour = pendulum.from_format(backfill_env["hour"], "YYYY-MM-DD-HH", tz="UTC")
    hourly = DagBag(dag_folder=str(DAGS)).get_dag("khipu_reconcile").test(logical_date=hour.add(hours=1))
    assert hourly.state == DagRunState.SUCCESS, states(hourly)
    checked = hourly.get_task_instance("check_window").xcom_pull(task_ids="check_window")
    # by hand: the hour ending at the logical date, one horizon earlier, trimmed to the archive's first hour
    assert checked["end_ms"] == int(hour.timestamp() * 1000) + HOUR_MS - HORIZON_MS
    assert checked["start_ms"] == int(hour.timestamp() * 1000)
    assert store.verdicts.rows() == after  # the same messages reconciled again: nothing changed
    assert states(hourly)["announce_confirmed_losses"] == "skipped"
    assert len([h for h in store.verdicts.history("m-late") if h["hop"].endswith(group)]) == 2

    capfd.readouterr()
    gone = run_backfill({"start": iso_text(old_at - 60_000), "end": iso_text(old_at + 60_000)})
    assert gone.state == DagRunState.FAILED
    out, err = capfd.readouterr()
    assert f"missing hours {old_hour}" in out + err


@pytest.mark.parametrize(
    ("conf", "reason"),
    [
        ({"start": "2026-11-23T10:00:00Z", "end": "2026-11-23T09:00:00Z"}, "after the start"),
        ({"start": "2026-11-01T10:00:00Z", "end": "2026-11-01T11:00:00Z"}, "missing hours 2026-11-01-10"),
        ({"streams": ["payments"]}, "unknown stream(s) payments"),
        ({"start": "yesterday"}, "an ISO time"),
    ],
)
def test_a_bad_window_is_refused_with_its_reason_and_nothing_written(
    backfill_env: dict[str, Any], conf: dict[str, Any], reason: str, capfd: pytest.CaptureFixture[str]
) -> None:
    from airflow.utils.state import DagRunState

    store: Store = backfill_env["store"]
    before = store.verdicts.rows()
    run = run_backfill({"start": backfill_env["start"], "end": backfill_env["end"], **conf})
    assert run.state == DagRunState.FAILED
    assert states(run)["check_window"] == "failed" and states(run)["reconcile_window"] == "upstream_failed"
    out, err = capfd.readouterr()
    assert reason in out + err  # the task log says why
    assert store.verdicts.rows() == before


def test_an_archive_still_behind_the_window_is_retried_when_scheduled_and_refused_when_backfilled(
    backfill_env: dict[str, Any],
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from khipu.reconcile.window import ReconcileWindow
    from khipu_airflow.reconcile import ArchiveBehind, check_window

    now = backfill_env["archived_to"] + 120_000  # two minutes after the detector last archived
    recent = ReconcileWindow(backfill_env["t0"], now - HORIZON_MS - 1_000, HORIZON_MS)  # horizon just passed
    with pytest.raises(ArchiveBehind, match="has archived the trace topic up to"):  # ... but not archived yet
        check_window(recent, "khipu_store", now, scheduled=True, wait_s=0)
    with pytest.raises(AirflowFailException, match="has archived the trace topic up to"):
        check_window(recent, "khipu_store", now, scheduled=False)


def confirmed_loss_events() -> list[dict[str, Any]]:
    """The extras of the confirmed-losses Asset's events, oldest first, as Airflow's database keeps them."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from khipu_airflow.reconcile import CONFIRMED_LOSSES

    with create_session() as session:
        asset = select(AssetModel.id).where(AssetModel.uri == CONFIRMED_LOSSES.uri).scalar_subquery()
        return [dict(e.extra) for e in session.scalars(select(AssetEvent).where(AssetEvent.asset_id == asset))]


def test_a_compacted_hour_in_the_object_store_backfills_to_what_its_traces_say(
    backfill_env: dict[str, Any], object_store: ObjectStoreProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same hour with ``KHIPU_DATA_URL`` in the object store (s3proxy): archived by the detector's own writer, a
    micro-batch a trace, then compacted by the retention DAG into one file; the backfill DAG (spark-submit, the
    store's environment handed on) reads that file and confirms and retracts as the traces say. Nothing of the
    archive is on the Airflow host's disk."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    store: Store = backfill_env["store"]
    data = Location.of(f"s3a://{object_store.bucket}/backfill-{secrets.token_hex(4)}")
    for name, value in {**object_store.environment(), "KHIPU_DATA_URL": data.url}.items():
        monkeypatch.setenv(name, value)
    local = Path(os.environ["KHIPU_STATE_DIR"]) / "archive"
    written = pa.concat_tables(pq.read_table(path) for path in sorted(local.rglob("*.parquet")))
    shutil.rmtree(local)  # the backfill reads the object store, or nothing
    for name in archive.SCHEMA.names:
        if name not in written.column_names:  # what the fixture's Spark rows lack: null, as in an older archive
            written = written.append_column(name, pa.nulls(written.num_rows, archive.SCHEMA.field(name).type))
    for batch_id in range(written.num_rows):
        archive.write_batch(data / "archive", batch_id, written.slice(batch_id, 1))
    archive.write_batch(data / "archive", written.num_rows, written.slice(0, 0))  # the next batch: the hour is done
    hour_folder = data / "archive" / f"hour={backfill_env['hour']}"
    assert len(hour_folder.child_folders()) == written.num_rows == 5

    limits = {"trace_archive_hours": 4, "backfill_hours": 1, "verdict_archive_hours": 4, "verdict_days": 1}
    retention = DagBag(dag_folder=str(DAGS)).get_dag("khipu_retention").test(run_conf=limits)
    assert retention.state == DagRunState.SUCCESS, states(retention)
    compaction = retention.get_task_instance("compact_archives").xcom_pull(task_ids="compact_archives")
    figures = compaction["trace archive"]["by_hour"][backfill_env["hour"]]
    assert (figures["files_before"], figures["files_after"]) == (5, 1)
    assert hour_folder.child_folders() == [COMPACTED_FOLDER]

    run = run_backfill({"start": backfill_env["start"], "end": backfill_env["end"], "dry_run": False})
    assert run.state == DagRunState.SUCCESS, states(run)
    assert verdicts(store) == {
        "m-gone": ("CONFIRMED_LOST", "LOST"),
        "m-late": ("RETRACTED", "DELIVERED"),
        "m-ok": ("DELIVERED", None),
        "m-untraced": ("TRACE_LOST", None),
    }
    summary = run.get_task_instance("reconcile_window").xcom_pull(task_ids="reconcile_window")
    assert summary["traces_read"] == 5 and [c["message_id"] for c in summary["confirmed_losses"]] == ["m-gone"]
    assert not local.exists()  # nothing written back to the Airflow host's disk
