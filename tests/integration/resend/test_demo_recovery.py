"""The loop closed, end to end on real Kafka and Spark: a demo with consumer skips and processor drops, the live
detector, reconciliation with a scaled horizon, then an automatic resend and the demo's consumers running
again: every such loss ends RESENT, delivered to exactly the groups that missed it (the ground truth's
receipts of resent records), with one resent record of it in the topics; and every verdict still equals
the ground truth.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import pytest

from khipu.demo.faults import FaultRates
from khipu.demo.ledger import build_truth, read_ledger
from khipu.demo.pipeline import DemoConfig, run_demo
from khipu.demo.recovery import recovery_report
from khipu.demo.score import observable_messages, score
from khipu.demo.topology import DEMO_STREAM, DemoTopology
from khipu.detector.committed import ClusterClients, cluster_lookups
from khipu.detector.job import DETECTOR_QUERY, start_detector
from khipu.detector.model import DetectorConfig
from khipu.localstack.broker import BrokerProcess
from khipu.reconcile.run import kafka_record_namer, reconcile
from khipu.reconcile.window import ReconcileWindow
from khipu.registry import load_registry
from khipu.resend.copies import count_resent
from khipu.resend.run import Resender, ResendSelection
from khipu.store import Store
from khipu.verdicts.book import VerdictBook
from tests.integration.detector.conftest import (
    REGISTRY,
    demo_traces,
    detector_job,
    stored_verdicts,
    wait_until_settled,
)
from tests.integration.helpers import TEST_SESSION_TIMEOUT_MS

pytestmark = pytest.mark.integration
FAULTS = FaultRates(consumer_skip=0.04, processor_drop=0.04)
SHORT_WAIT = DetectorConfig(grace_ms=4_000, max_wait_ms=20_000, recheck_ms=1_000)
HORIZON_MS = 30_000


def now_ms() -> int:
    return int(time.time() * 1000)


def test_a_demo_with_skips_and_drops_ends_with_every_loss_resent_to_exactly_the_groups_that_missed_it(
    broker: BrokerProcess, spark: Any, tmp_path: Path
) -> None:
    registry = load_registry(REGISTRY)
    stream = registry.stream(DEMO_STREAM)
    trace_topic = f"traces-recover-{secrets.token_hex(3)}"
    broker.admin().ensure_topics({trace_topic: 3})
    job = detector_job(broker, tmp_path, trace_topic, "recover", lost_topic=None, detector=SHORT_WAIT)
    store = Store(job.store_url)
    queries = start_detector(spark, job)
    try:
        started = now_ms()
        demo = demo_traces(broker, tmp_path, "recover", count=200, seed=7, trace_topic=trace_topic, faults=FAULTS)
        demo_done = now_ms()
        assert demo.fault_counts.get("consumer_skip", 0) > 0 and demo.fault_counts.get("processor_drop", 0) > 0
        wait_until_settled(job.store_url, len(observable_messages(demo.truth)), verdicts_dir=job.verdicts_dir)
        deadline = time.monotonic() + 60
        while (store.heartbeat.read_to_ms(DETECTOR_QUERY) or 0) < demo_done and time.monotonic() < deadline:
            time.sleep(1)  # every trace is archived

        window = ReconcileWindow(started - 60_000, demo_done + 1_000, horizon_ms=HORIZON_MS)
        time.sleep(max(0.0, (window.read_to_ms - now_ms()) / 1000))  # the horizon passes
        connections = {"local": broker.connection()}
        clients = ClusterClients(connections, job.store_url)
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        reconcile(
            spark, job.archive_dir, window, registry, VerdictBook(store.verdicts),
            cluster_lookups(clients, job.store_url),
            SHORT_WAIT, now_ms(), name_record=kafka_record_namer(connections), progress=lambda line: None,
            verdict_archive_dir=job.verdicts_dir,
        )  # fmt: skip
        confirmed = {(r["message_id"], r["hop"]) for r in store.verdicts.rows() if r["verdict"] == "CONFIRMED_LOST"}
        assert confirmed

        run = Resender(store, registry, connections, now_ms, verdict_archive_dir=job.verdicts_dir).run(
            ResendSelection()
        )  # demo.orders: mode auto
        assert run.counts() == {"produced": len(confirmed)}, run.as_dict()

        # the demo's groups run on (nothing new produced) and take the resent records
        topology = DemoTopology.from_stream(stream)
        again = DemoConfig(
            bootstrap_servers=broker.bootstrap_servers, ledger_path=tmp_path / "recover-again.jsonl",
            trace_topic=trace_topic, count=0, faults=FAULTS, seed=7, run_id="recover-again",
            session_timeout_ms=TEST_SESSION_TIMEOUT_MS, progress_interval_s=60,
        )  # fmt: skip
        run_demo(again, topology, progress=lambda line: None)

        deadline = time.monotonic() + 90
        resent: set[tuple[str, str]] = set()
        while time.monotonic() < deadline and resent != confirmed:
            time.sleep(2)
            resent = {(r["message_id"], r["hop"]) for r in store.verdicts.rows() if r["verdict"] == "RESENT"}
    finally:
        for query in queries:
            query.stop()

    truth = build_truth([*read_ledger(tmp_path / "recover.jsonl", run_id="recover"), *read_ledger(again.ledger_path)])
    final = stored_verdicts(store, job.verdicts_dir)
    topics = [topology.source_topic.topic, topology.output_topic.topic]
    copies = {m: n for m, n in count_resent(broker.connection(), topics).items() if m in truth.messages}
    report = recovery_report(truth, final, stream, copies)
    print("\n" + "\n".join(report.lines()))
    assert report.exact, report.lines()
    assert report.losses == len(confirmed)
    after = score(truth, final)
    assert after.exact, (list(after.wrong.items())[:5], list(after.missing.items())[:5], list(after.extra.items())[:5])
    history = {(h["from_verdict"], h["to_verdict"]) for m, _ in confirmed for h in store.verdicts.history(m)}
    assert ("CONFIRMED_LOST", "RESENT") in history
    store.close()
