"""Khipu off one host, as a platform team runs it: launched by the shipped DAGs, on executors that share nothing
with the driver, scored against what the applications really did.

- **the cluster**: a Spark standalone master and two workers on 127.0.0.1, the workers (so every executor) running
  as another Unix user (``nobody``) with their own work and local folders and a Python of their own: they cannot read
  the driver's state folder, as on hosts that share no disk with it;
- **the store**: PostgreSQL over TCP; **the data**: ``KHIPU_DATA_URL`` in a real S3 API (s3proxy) — the trace
  archive, the verdict archive, the detector's checkpoint and its driver record, reconciliation's working data;
- **the DAGs**: ``khipu_detector`` submits the detector with ``spark_default`` = ``spark://…`` (client mode, as Spark
  standalone runs Python); the demo pipeline runs with every fault, messages delayed past the detector's maximum wait
  and lost traces; ``khipu_backfill`` (a dry run) and then ``khipu_reconcile`` (the hourly reconciliation, triggered
  as by hand: the hour ending one horizon ago) reconcile the demo's window on the same cluster (the connection's master
  wins over ``KHIPU_SPARK_MASTER``); ``khipu_resend``, scheduled on the confirmed losses the hourly run announced,
  resends them from what the detector stored in the object store, and the demo's consumers take the resent records.

The backfill's and the hourly run's confirmed losses are the truth's losses, and the final verdicts equal the demo's
ground truth (its ledger of what each application did), exactly; every loss ends RESENT, delivered once to exactly
the groups that missed it.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pendulum
import psutil
import pytest

from khipu.clock import iso_text
from khipu.demo.faults import FaultRates
from khipu.demo.ledger import build_truth, read_ledger
from khipu.demo.pipeline import DemoConfig, run_demo
from khipu.demo.recovery import recovery_report
from khipu.demo.score import expected_verdicts, observable_messages, score
from khipu.demo.topology import DEMO_STREAM, DemoTopology
from khipu.detector.driver import read_driver_record
from khipu.detector.model import DETECTOR_QUERY
from khipu.localstack.broker import BrokerProcess
from khipu.localstack.object_store import ObjectStoreProcess
from khipu.localstack.spark_cluster import start_spark_cluster
from khipu.process_group import ProcessTable
from khipu.registry import load_registry
from khipu.resend.copies import count_resent
from khipu.storage.location import Location
from khipu.store import Store
from tests.integration.detector.conftest import REGISTRY, demo_traces, stored_verdicts, wait_until_settled
from tests.integration.helpers import TEST_SESSION_TIMEOUT_MS
from tests.integration.store.conftest import _postgres_database

pytestmark = pytest.mark.integration
DAGS = Path(__file__).resolve().parents[3] / "dags"
WORKER_USER = "nobody"
HORIZON_MS = 60_000
DELAY_MS = 40_000  # past the detector's maximum wait below: LOST first, then reconciled
FAULTS = FaultRates(
    consumer_skip=0.03, processor_drop=0.03, rebalance_drop=0.01, offset_rewind=0.03, producer_retry=0.03,
    delay=0.02, trace_loss=0.005,
)  # fmt: skip


def run_dag(dag_id: str, conf: dict[str, Any] | None = None) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS)).get_dag(dag_id).test(run_conf=conf)


def run_dag_at(dag_id: str, logical_date: Any) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS)).get_dag(dag_id).test(logical_date=logical_date)


def task_states(run: Any) -> dict[str, str | None]:
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def returned(run: Any, task_id: str) -> Any:
    """What a task of the run returned (its XCom)."""
    return run.get_task_instance(task_id).xcom_pull(task_ids=task_id)


def named(changes: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(c["message_id"], c["hop"]) for c in changes}


def applications(master_ui_port: int) -> dict[str, list[str]]:
    """The cluster master's applications by state, as its own JSON page lists them."""
    with urllib.request.urlopen(f"http://127.0.0.1:{master_ui_port}/json/", timeout=5) as answer:
        page = json.load(answer)
    return {state: sorted(app["name"] for app in page.get(state, [])) for state in ("activeapps", "completedapps")}


def test_the_detector_reconciliation_backfill_and_resend_from_their_dags_on_workers_that_share_nothing_are_exact(
    broker: BrokerProcess,
    object_store: ObjectStoreProcess,
    airflow_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    data = Location.of(f"s3a://{object_store.bucket}/off-one-host-{uuid.uuid4().hex[:8]}")
    trace_topic = f"traces-mh-{secrets.token_hex(3)}"
    broker.admin().ensure_topics({trace_topic: 3})
    cluster_dir = Path(tempfile.mkdtemp(prefix="khipu-cluster-"))  # outside the driver's 0700 folders
    cluster_dir.chmod(0o755)
    table = ProcessTable(state)
    stream = load_registry(REGISTRY).stream(DEMO_STREAM)
    topology = DemoTopology.from_stream(stream)
    with _postgres_database() as store_url:
        store = Store(store_url)
        store.migrate()
        cluster = start_spark_cluster(
            cluster_dir, workers=2, cores_per_worker=1, worker_memory_mb=1024, run_as=WORKER_USER,
            worker_environment=object_store.environment(),
        )  # fmt: skip
        try:
            for name, value in {
                **object_store.environment(),
                "KHIPU_STATE_DIR": str(state),
                "KHIPU_REGISTRY": str(REGISTRY),
                "KHIPU_DATA_URL": data.url,
                "KHIPU_SPARK_MASTER": "local[1]",  # what a job started by hand would take: the DAGs must not
                "PYSPARK_PYTHON": cluster.python,  # the workers' own Python, handed to their executors
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # spark-submit
                "KHIPU_DETECTOR_TRIGGER_S": "1",
                "KHIPU_DETECTOR_GRACE_MS": "4000",
                "KHIPU_DETECTOR_MAX_WAIT_MS": "25000",
                "KHIPU_DETECTOR_RECHECK_MS": "1000",
                "KHIPU_RECONCILE_HORIZON_MS": str(HORIZON_MS),
                "AIRFLOW_CONN_KHIPU_KAFKA": json.dumps({"conn_type": "kafka", "extra": {
                    "bootstrap.servers": broker.bootstrap_servers, "khipu.cluster": "local",
                    "khipu.trace_topic": trace_topic}}),
                "AIRFLOW_CONN_KHIPU_STORE": json.dumps({"conn_type": "postgres", "extra": {"url": store_url}}),
                # the detector runs for good: capped at one of the two cores, reconciliation gets the other
                "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({
                    "conn_type": "spark", "host": "spark://127.0.0.1", "port": cluster.master_port,
                    "extra": {"deploy-mode": "client", "spark-binary": "spark-submit",
                              "khipu.detector": {"total_executor_cores": 1}}}),
            }.items():  # fmt: skip
                monkeypatch.setenv(name, value)

            detector_run = run_dag("khipu_detector")
            assert task_states(detector_run)["restart_detector"] == "success", task_states(detector_run)
            driver = read_driver_record(data / "detector" / "checkpoint")  # in the object store
            assert driver is not None and driver.alive()

            started_ms = int(time.time() * 1000)
            demo = demo_traces(
                broker, tmp_path, "mh", count=300, seed=11, trace_topic=trace_topic, faults=FAULTS, delay_ms=DELAY_MS
            )
            demo_done_ms = int(time.time() * 1000)
            assert demo.fault_counts.get("delay", 0) > 0 and demo.fault_counts.get("trace_loss", 0) > 0
            streaming = wait_until_settled(
                store_url, len(observable_messages(demo.truth)), timeout_s=300, verdicts_dir=data / "verdicts"
            )
            deadline = time.monotonic() + 120
            while (store.heartbeat.read_to_ms(DETECTOR_QUERY) or 0) < demo_done_ms and time.monotonic() < deadline:
                time.sleep(1)  # the detector has read past the demo's end: every trace is archived
            executors = [
                p for p in psutil.process_iter(["cmdline", "uids"])
                if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in (p.info["cmdline"] or [])
            ]  # fmt: skip
            executor_users = {pwd.getpwuid(p.info["uids"].real).pw_name for p in executors}
            assert any(r["verdict"] == "LOST" for r in streaming)  # provisional: reconciliation makes them final

            window = {"start": iso_text(started_ms - 60_000), "end": iso_text(demo_done_ms + 1_000)}
            needed_ms = demo_done_ms + 1_000 + HORIZON_MS  # the window's traces, up to its horizon
            time.sleep(max(0.0, (needed_ms - time.time() * 1000) / 1000))  # the horizon passes
            deadline = time.monotonic() + 60
            while (store.heartbeat.read_to_ms(DETECTOR_QUERY) or 0) < needed_ms and time.monotonic() < deadline:
                time.sleep(0.5)  # and the detector archives it (a backfill does not wait for that: it refuses)
            before = stored_verdicts(store, data / "verdicts")
            backfill = run_dag("khipu_backfill", {**window, "dry_run": True})
            assert task_states(backfill)["reconcile_window"] == "success", task_states(backfill)
            predicted = returned(backfill, "reconcile_window")
            assert stored_verdicts(store, data / "verdicts") == before  # a dry run writes nothing

            # the hourly reconciliation as triggered by hand now: the hour ending one horizon ago
            hourly = run_dag_at("khipu_reconcile", pendulum.now("UTC"))
            assert task_states(hourly)["announce_confirmed_losses"] == "success", task_states(hourly)
            checked, reconciled = returned(hourly, "check_window"), returned(hourly, "reconcile_window")
            announced = returned(hourly, "announce_confirmed_losses")
            final = stored_verdicts(store, data / "verdicts")
            confirmed = {(r["message_id"], r["hop"]) for r in final if r["verdict"] == "CONFIRMED_LOST"}

            resend = run_dag("khipu_resend")  # as the confirmed losses' Asset event schedules it
            assert task_states(resend)["resend_confirmed_losses"] == "success", task_states(resend)
            resent_run = returned(resend, "resend_confirmed_losses")
            # the demo's groups run on (nothing new produced) and take the resent records
            again = DemoConfig(
                bootstrap_servers=broker.bootstrap_servers, ledger_path=tmp_path / "mh-again.jsonl",
                trace_topic=trace_topic, count=0, faults=FAULTS, seed=11, run_id="mh-again",
                session_timeout_ms=TEST_SESSION_TIMEOUT_MS, progress_interval_s=60,
            )  # fmt: skip
            run_demo(again, topology, progress=lambda line: None)
            deadline = time.monotonic() + 120
            resent: set[tuple[str, str]] = set()
            while time.monotonic() < deadline and resent != confirmed:
                time.sleep(2)
                resent = {(r["message_id"], r["hop"]) for r in store.verdicts.rows() if r["verdict"] == "RESENT"}
            recovered = stored_verdicts(store, data / "verdicts")
            apps = applications(cluster.master_ui_port)
        finally:
            table.stop("detector", timeout_s=60)
            cluster.stop()
            store.close()
            shutil.rmtree(cluster_dir, ignore_errors=True)

    # the executors ran as the other user; the detector and the reconciliation both ran on the cluster
    assert executor_users == {WORKER_USER}
    assert "khipu-detector" in apps["activeapps"] + apps["completedapps"]
    assert "khipu-reconcile" in apps["completedapps"]
    # everything the detector and reconciliation keep is in the object store, nothing on the Airflow host's disk
    assert {"archive", "verdicts", "detector"} <= set(data.child_folders())
    assert not (state / "archive").exists() and not (state / "verdicts").exists()
    assert not (state / "detector" / "checkpoint").exists()
    truth = demo.truth
    expected = expected_verdicts(truth)
    losses = {key for key, (verdict, _) in expected.items() if verdict == "LOST"}
    assert losses and confirmed == losses  # the hourly run confirmed exactly the truth's losses ...
    assert predicted["dry_run"] and named(predicted["confirmed_losses"]) == losses  # ... as the backfill foresaw
    assert named(reconciled["confirmed_losses"]) == losses
    retracted = named(reconciled["retracted"])  # each a LOST the ledger says was no loss, and foreseen
    assert retracted == named(predicted["retracted"]) and retracted <= set(expected) - losses
    assert announced == {"count": len(losses)}
    assert checked["end_ms"] >= demo_done_ms + 1_000  # the hour ending one horizon before the trigger holds the demo
    after = score(truth, final)
    assert after.exact, (
        f"{after.matched}/{after.expected} matched; wrong {list(after.wrong.items())[:5]}; "
        f"missing {list(after.missing.items())[:5]}; extra {list(after.extra.items())[:5]}"
    )
    assert not any(r["verdict"] in ("LOST", "PENDING") for r in final)
    assert all(r["decided_by"] == "reconciliation" for r in final if r["verdict"] == "CONFIRMED_LOST")

    # every loss resent once from what the detector stored, delivered to exactly the groups that missed it
    assert resent_run["counts"] == {"produced": len(losses)}, resent_run
    assert resent == confirmed
    both = build_truth([*read_ledger(tmp_path / "mh.jsonl", run_id="mh"), *read_ledger(again.ledger_path)])
    topics = [topology.source_topic.topic, topology.output_topic.topic]
    copies = {m: n for m, n in count_resent(broker.connection(), topics).items() if m in both.messages}
    report = recovery_report(both, recovered, stream, copies)
    assert report.exact and report.losses == len(losses), report.lines()
    recovered_score = score(both, recovered)
    assert recovered_score.exact, (list(recovered_score.wrong.items())[:5], list(recovered_score.missing.items())[:5])
