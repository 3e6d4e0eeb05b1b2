"""The detector DAG supervising a real detector: spark-submit detached, a SIGSTOPped (hung) driver replaced
from its checkpoint within minutes, one detector-down alert fired and resolved through a real webhook.

Real parts throughout: the Kafka broker, spark-submit of spark/detector.py with Spark's Kafka connector,
Airflow's dag.test(), the store, an HTTP receiver on 127.0.0.1 for the webhook notifier.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from khipu.demo.ledger import build_truth, read_ledger
from khipu.demo.score import observable_messages, score
from khipu.detector.driver import read_driver_record
from khipu.detector.model import DETECTOR_QUERY
from khipu.localstack.broker import BrokerProcess
from khipu.localstack.processes import ProcessTable
from khipu.store import Store
from tests.integration.detector.conftest import (
    demo_traces,
    driver_jvm,
    verdict_keys,
    wait_until_settled,
)

pytestmark = pytest.mark.integration
DAGS = Path(__file__).resolve().parents[3] / "dags"


def run_dag() -> dict[str, str | None]:
    from airflow.dag_processing.dagbag import DagBag

    run = DagBag(dag_folder=str(DAGS)).get_dag("khipu_detector").test()
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def test_a_hung_driver_is_replaced_from_its_checkpoint_alerting_once_and_verdicts_stay_exact(
    broker: BrokerProcess,
    airflow_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    webhook: tuple[str, list[dict[str, Any]]],
) -> None:
    url, received = webhook
    state = tmp_path / "state"
    store_path = tmp_path / "khipu.db"
    first = demo_traces(broker, tmp_path, "sup1", count=80, seed=11)
    for variable, value in {
        "KHIPU_STATE_DIR": str(state),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "AIRFLOW_CONN_KHIPU_KAFKA": json.dumps(
            {
                "conn_type": "kafka",
                "extra": {
                    "bootstrap.servers": broker.bootstrap_servers,
                    "khipu.cluster": "local",
                    "khipu.trace_topic": first.trace_topic,
                },
            }
        ),
        "AIRFLOW_CONN_KHIPU_STORE": json.dumps({"conn_type": "sqlite", "host": str(store_path)}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
            {
                "conn_type": "spark",
                "host": "local[2]",
                "extra": {"deploy-mode": "client", "spark-binary": "spark-submit"},
            }
        ),
        "AIRFLOW_CONN_KHIPU_ALERT_WEBHOOK": json.dumps({"conn_type": "http", "extra": {"url": url}}),
        "KHIPU_DETECTOR_STALE_AFTER_S": "20",
        "KHIPU_DETECTOR_STARTUP_GRACE_S": "120",
        "KHIPU_DETECTOR_GRACE_MS": "3000",
        "KHIPU_DETECTOR_RECHECK_MS": "1000",
        "KHIPU_DETECTOR_MAX_WAIT_MS": "120000",
        "KHIPU_DETECTOR_TRIGGER_S": "1",
    }.items():
        monkeypatch.setenv(variable, value)
    store = Store(f"sqlite:///{store_path}")
    store.migrate()
    table = ProcessTable(state)
    checkpoint = state / "detector" / "checkpoint"
    try:
        states = run_dag()  # never ran: submitted, and the task returns once the driver is up
        assert (states["restart_detector"], states["detector_is_running"]) == ("success", "skipped")
        submitted = table.running("detector")
        driver = read_driver_record(checkpoint)
        assert submitted is not None and driver is not None and driver.alive()
        jvm, submitted = driver_jvm(driver.pid)  # spark-submit's JVM: the log settings and the collector
        assert "spark.shuffle.compress=false" in submitted  # local[2]
        assert "-XX:+UseParallelGC" in jvm and any(o.startswith("-Dlog4j2.configurationFile=file:") for o in jvm)
        _wait_for(lambda: (store.heartbeat.latest(DETECTOR_QUERY) or {}).get("batch_id", -1) >= 2, 180, "first batches")

        os.kill(driver.pid, signal.SIGSTOP)  # hung: alive, silent
        stopped_at = time.monotonic()
        demo_traces(broker, tmp_path, "sup2", count=80, seed=12, trace_topic=first.trace_topic)

        restarted = None
        while time.monotonic() - stopped_at < 300:
            states = run_dag()
            now = read_driver_record(checkpoint)
            if states["restart_detector"] == "success" and now is not None and now.pid != driver.pid:
                restarted = now
                break
            time.sleep(5)
        assert restarted is not None, "no new driver within 5 minutes of the SIGSTOP"
        replaced_after_s = time.monotonic() - stopped_at
        assert not driver.alive()  # the hung one is gone
        assert table.running("detector") is not None and table.running("detector") != submitted

        # one truth over both runs: the second run's rewinding sink re-reads the first run's last records
        truth = build_truth([*read_ledger(tmp_path / "sup1.jsonl"), *read_ledger(tmp_path / "sup2.jsonl")])
        observable = observable_messages(truth)
        verdicts = wait_until_settled(
            f"sqlite:///{store_path}", len(observable), timeout_s=240, verdicts_dir=state / "verdicts"
        )
        for _ in range(5):  # healthy again: a check resolves the alert
            if any(a["state"] == "resolved" for a in received):
                break
            run_dag()
        down = [a for a in received if a["kind"] == "detector_down"]
        assert [a["state"] for a in down] == ["firing", "resolved"], down
        assert "hung" in down[0]["title"]
    finally:
        table.stop("detector", timeout_s=30)
        store.close()

    # the truth is what the demo's applications did (their ledgers): every verdict is of one of their messages,
    # stored once, and each says what the message met
    assert {v["message_id"] for v in verdicts} <= set(truth.messages)
    assert len(verdicts) == len(verdict_keys(verdicts))
    result = score(truth, verdicts)
    assert result.exact, (result.wrong, result.missing, result.extra)
    print(f"hung driver replaced {replaced_after_s:.0f} s after SIGSTOP")


def _wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")
