"""End to end on real Kafka and Spark: a demo with every fault, messages delayed past the detector's maximum
wait and lost traces ends, after reconciliation with a scaled horizon, with final verdicts equal to the
ground truth.

The detector runs live beside the demo, so traces of delayed messages arrive after others were decided;
every LOST it says is provisional until reconciliation, with all the traces up to the horizon, confirms
it (or retracts it).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import pytest

from khipu.demo.faults import FaultRates
from khipu.demo.score import observable_messages, score
from khipu.detector.committed import ClusterClients, cluster_lookups
from khipu.detector.job import DETECTOR_QUERY, start_detector
from khipu.detector.model import DetectorConfig
from khipu.localstack.broker import BrokerProcess
from khipu.reconcile.run import kafka_record_namer, reconcile
from khipu.reconcile.window import ReconcileWindow
from khipu.registry import load_registry
from khipu.store import Store
from khipu.verdicts.book import VerdictBook
from tests.integration.detector.conftest import (
    REGISTRY,
    demo_traces,
    detector_job,
    stored_verdicts,
    wait_until_settled,
)

pytestmark = pytest.mark.integration
DELAY_MS = 40_000
SHORT_WAIT = DetectorConfig(grace_ms=4_000, max_wait_ms=25_000, recheck_ms=1_000)
HORIZON_MS = 60_000
FAULTS = FaultRates(
    consumer_skip=0.03,
    processor_drop=0.03,
    rebalance_drop=0.01,
    offset_rewind=0.03,
    producer_retry=0.03,
    delay=0.02,
    trace_loss=0.005,
)


def test_after_reconciliation_the_final_verdicts_equal_the_ground_truth(
    broker: BrokerProcess, spark: Any, tmp_path: Path
) -> None:
    trace_topic = f"traces-final-{secrets.token_hex(3)}"
    broker.admin().ensure_topics({trace_topic: 3})
    job = detector_job(broker, tmp_path, trace_topic, "final", lost_topic=None, detector=SHORT_WAIT)
    queries = start_detector(spark, job)  # live, as in production: late traces arrive after decisions
    try:
        started_ms = int(time.time() * 1000)
        demo = demo_traces(
            broker, tmp_path, "final", count=300, seed=11, trace_topic=trace_topic, faults=FAULTS, delay_ms=DELAY_MS
        )
        demo_done_ms = int(time.time() * 1000)
        assert demo.fault_counts.get("delay", 0) > 0 and demo.fault_counts.get("trace_loss", 0) > 0
        streaming = wait_until_settled(
            job.store_url, len(observable_messages(demo.truth)), verdicts_dir=job.verdicts_dir
        )
        store = Store(job.store_url)
        deadline = time.monotonic() + 60
        while (store.heartbeat.read_to_ms(DETECTOR_QUERY) or 0) < demo_done_ms and time.monotonic() < deadline:
            time.sleep(1)  # the archive query has read past the demo's end: every trace is archived
    finally:
        for query in queries:
            query.stop()
    assert any(r["verdict"] == "LOST" for r in streaming)  # provisional: reconciliation makes them final

    window = ReconcileWindow(started_ms - 60_000, demo_done_ms + 1_000, horizon_ms=HORIZON_MS)
    archived_to = store.heartbeat.read_to_ms(DETECTOR_QUERY)
    assert archived_to is not None and archived_to >= demo_done_ms  # the archive holds every trace
    time.sleep(max(0.0, (window.read_to_ms - time.time() * 1000) / 1000))  # the horizon passes

    connections = {"local": broker.connection()}
    clients = ClusterClients(connections, job.store_url)
    lookups = cluster_lookups(clients, job.store_url)
    lines: list[str] = []
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    report = reconcile(
        spark,
        job.archive_dir,
        window,
        load_registry(REGISTRY),
        VerdictBook(store.verdicts),
        lookups,
        SHORT_WAIT,
        int(time.time() * 1000),
        name_record=kafka_record_namer(connections),
        progress=lines.append,
        verdict_archive_dir=job.verdicts_dir,
    )
    final = stored_verdicts(store, job.verdicts_dir)
    after = score(demo.truth, final)
    assert after.exact, (
        f"{after.matched}/{after.expected} matched; wrong {list(after.wrong.items())[:5]}; "
        f"missing {list(after.missing.items())[:5]}; extra {list(after.extra.items())[:5]}"
    )
    assert report.redecided > 0 and not any(r["verdict"] in ("LOST", "PENDING") for r in final)
    assert not any(r["late_evidence"] for r in final)
    confirmed = [r for r in final if r["verdict"] == "CONFIRMED_LOST"]
    assert confirmed and all(r["decided_by"] == "reconciliation" for r in confirmed)
    for lead in report.leads:  # every untraced message the pointers reveal is named, or said why not
        assert lead.message_id is not None or lead.why_unknown
    store.close()
