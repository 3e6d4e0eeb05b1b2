"""Real Spark (local mode, Spark's own Kafka connector) for detector tests, and a demo run whose traces it reads."""

from __future__ import annotations

import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psutil
import pytest

from khipu.demo.faults import FaultRates
from khipu.demo.ledger import GroundTruth, build_truth, read_ledger
from khipu.demo.pipeline import DemoConfig, run_demo
from khipu.demo.score import observable_messages
from khipu.demo.topology import DEMO_STREAM, DemoTopology
from khipu.detector.job import DETECTOR_QUERY, DetectorJob
from khipu.detector.launch import write_connections_file
from khipu.detector.model import DetectorConfig
from khipu.localstack.broker import BrokerProcess
from khipu.registry import load_registry
from khipu.store import Store
from khipu.verdicts.archive import VerdictArchive
from khipu.verdicts.read import all_verdicts
from tests.integration.helpers import TEST_SESSION_TIMEOUT_MS, until

ROOT = Path(__file__).resolve().parents[3]
REGISTRY = ROOT / "config" / "registry.yaml"
ALL_FAULTS = FaultRates(
    consumer_skip=0.03,
    processor_drop=0.03,
    rebalance_drop=0.01,
    offset_rewind=0.03,
    producer_retry=0.03,
    delay=0.03,
    trace_loss=0.02,
)
FAST = DetectorConfig(grace_ms=4_000, max_wait_ms=120_000, recheck_ms=1_000)


@dataclass(frozen=True)
class DemoTraces:
    trace_topic: str
    truth: GroundTruth
    fault_counts: dict[str, int]


def demo_traces(
    broker: BrokerProcess,
    tmp_path: Path,
    run_id: str,
    count: int,
    seed: int,
    sampling_percent: float | None = None,
    trace_topic: str | None = None,
    faults: FaultRates = ALL_FAULTS,
    delay_ms: int = 1500,
) -> DemoTraces:
    """Run the demo with every fault onto a trace topic (a fresh one unless given); return its ground truth."""
    trace_topic = trace_topic or f"traces-{run_id}-{secrets.token_hex(3)}"
    broker.admin().ensure_topics({trace_topic: 3})
    topology = DemoTopology.from_stream(load_registry(REGISTRY).stream(DEMO_STREAM))
    config = DemoConfig(
        bootstrap_servers=broker.bootstrap_servers,
        ledger_path=tmp_path / f"{run_id}.jsonl",
        trace_topic=trace_topic,
        count=count,
        rate_per_s=250,
        faults=faults,
        seed=seed,
        run_id=run_id,
        delay_ms=delay_ms,
        session_timeout_ms=TEST_SESSION_TIMEOUT_MS,
        progress_interval_s=60,
        sampling_percent=sampling_percent,
    )
    report = run_demo(config, topology, progress=lambda line: None)
    return DemoTraces(trace_topic, build_truth(read_ledger(config.ledger_path, run_id=run_id)), report.fault_counts)


def detector_job(
    broker: BrokerProcess,
    tmp_path: Path,
    trace_topic: str,
    name: str,
    *,
    registry: Path = REGISTRY,
    store_url: str | None = None,
    **options: Any,
) -> DetectorJob:
    """The tests' detector (1 s trigger, FAST settings unless ``detector`` is given), its paths named ``name``; a
    SQLite store of its own, migrated, unless ``store_url`` names one the test set up."""
    if store_url is None:
        store_url = f"sqlite:///{tmp_path / f'{name}.db'}"
        store = Store(store_url)
        store.migrate()
        store.close()
    return DetectorJob(
        registry_path=registry,
        trace_connection=broker.connection(),
        store_url=store_url,
        checkpoint_dir=tmp_path / f"{name}-checkpoint",
        archive_dir=tmp_path / f"{name}-archive",
        verdicts_dir=tmp_path / f"{name}-verdicts",
        trace_topic=trace_topic,
        trigger_seconds=1.0,
        detector=options.pop("detector", FAST),
        **options,
    )


def detector_command(job: DetectorJob, tmp_path: Path, master: str, *options: str) -> list[str]:
    """spark/detector.py as a supervisor starts it: the job's paths, its connections in an owner-only file, the
    test's fast settings (trigger 1 s, grace 3 s, recheck 1 s, max wait 2 min), ``options`` last."""
    connections = write_connections_file(
        tmp_path / "connections.json", job.trace_connection, {"local": job.trace_connection}, job.store_url
    )
    return [
        sys.executable, str(ROOT / "spark" / "detector.py"), "--registry", str(REGISTRY),
        "--connections-file", str(connections), "--trace-topic", job.trace_topic, "--lost-topic", "",
        "--checkpoint", str(job.checkpoint_dir), "--archive", str(job.archive_dir),
        "--verdict-archive", str(job.verdicts_dir), "--trigger-seconds", "1", "--grace-ms", "3000",
        "--recheck-ms", "1000", "--max-wait-ms", "120000", "--master", master, "--shuffle-partitions", "2", *options,
    ]  # fmt: skip


def driver_jvm(driver_pid: int) -> tuple[list[str], list[str]]:
    """(the JVM's own options, spark-submit's arguments) of the JVM a detector's Python driver runs with: its child
    when started directly (``python spark/detector.py``), its parent under spark-submit."""
    driver = psutil.Process(driver_pid)
    for process in [*driver.children(recursive=True), *driver.parents()]:
        command = process.cmdline()
        if command and Path(command[0]).name == "java" and SPARK_SUBMIT in command:
            main = command.index(SPARK_SUBMIT)
            return command[:main], command[main + 1 :]
    raise AssertionError(f"no spark-submit JVM around the detector's driver {driver_pid}")


SPARK_SUBMIT = "org.apache.spark.deploy.SparkSubmit"


def stored_verdicts(store: Store, verdicts_dir: Path) -> list[dict[str, Any]]:
    """Every verdict a detector keeps: the store's rows and the verdict archive's, the store's winning per hop."""
    with VerdictArchive(verdicts_dir, store) as archive:
        return all_verdicts(store.verdicts, archive)


def wait_until_settled(
    store_url: str, expected_messages: int, timeout_s: float = 240, *, verdicts_dir: Path
) -> list[dict[str, Any]]:
    """Verdicts (store and verdict archive) once their count stopped moving and the processor holds no state
    (every message decided)."""
    store = Store(store_url)
    deadline = time.monotonic() + timeout_s
    last, stable = -1, 0
    try:
        while time.monotonic() < deadline:
            time.sleep(1)
            verdicts = stored_verdicts(store, verdicts_dir)
            beat = store.heartbeat.latest(DETECTOR_QUERY)
            settled = beat is not None and beat["state_rows"] == 0 and len(verdicts) == last > 0
            stable = stable + 1 if settled else 0
            if stable >= 3 and len({v["message_id"] for v in verdicts}) >= expected_messages:
                return verdicts
            last = len(verdicts)
        raise AssertionError(f"detector did not settle within {timeout_s:.0f}s: {last} verdicts")
    finally:
        store.close()


def run_detector_until(spark: Any, job: DetectorJob, verdicts: int, timeout_s: float = 150) -> list[dict[str, Any]]:
    """Run the detector in this process until the store holds ``verdicts`` verdicts (or the time is up)."""
    from khipu.detector.job import start_detector

    store = Store(job.store_url)
    queries = start_detector(spark, job)
    try:
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(found) < verdicts:
            time.sleep(2)
            found = stored_verdicts(store, job.verdicts_dir)
        return found
    finally:
        for query in queries:
            query.stop()
        store.close()


def verdict_keys(rows: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    """What must be equal between two runs: (message, hop, verdict, cause, count) per stored verdict."""
    return {(r["message_id"], r["hop"], r["verdict"], r["cause"], r["count"]) for r in rows}


def uninterrupted_run(
    broker: BrokerProcess, spark: Any, tmp_path: Path, trace_topic: str, messages: int
) -> list[dict[str, Any]]:
    """The verdicts of a detector that reads the whole trace topic in this process, never stopped."""
    from khipu.detector.job import start_detector

    job = detector_job(broker, tmp_path, trace_topic, "whole", lost_topic=None)
    queries = start_detector(spark, job)
    try:
        return wait_until_settled(job.store_url, messages, verdicts_dir=job.verdicts_dir)
    finally:
        for query in queries:
            query.stop()


@dataclass(frozen=True)
class JudgedDemo:
    """A demo's traces and the verdicts a detector that read them whole, never stopped, gave."""

    demo: DemoTraces
    observable: int  # messages with a trace
    whole: list[dict[str, Any]]


@pytest.fixture(scope="session")
def judged_demo(broker: BrokerProcess, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> JudgedDemo:
    """One demo (120 messages, every fault) and its uninterrupted run, for the tests that run the detector another
    way on the same trace topic (killed mid-stream and restarted; on a standalone cluster) and must end with these
    verdicts. Reading a topic takes nothing from it, so they share it, and the uninterrupted run is made once."""
    tmp_path = tmp_path_factory.mktemp("judged-demo")
    demo = demo_traces(broker, tmp_path, "judged", count=120, seed=7)
    observable = len(observable_messages(demo.truth))
    return JudgedDemo(demo, observable, uninterrupted_run(broker, spark, tmp_path, demo.trace_topic, observable))


class Played(Protocol):
    """A pipeline's result: its name, and the verdict each (message id, hop) of it must get."""

    @property
    def name(self) -> str: ...

    @property
    def expected(self) -> dict[tuple[str, str], tuple[str, str | None]]: ...


P = TypeVar("P", bound=Played)


def play_at_once(pipelines: Iterable[Callable[[], P]], timeout_s: float) -> dict[str, P]:
    """Run the pipelines side by side, each in a thread; their results by name. Any pipeline's error fails the test
    with all of them."""
    results: dict[str, P] = {}
    failures: list[BaseException] = []

    def play(pipeline: Callable[[], P]) -> None:
        try:
            played = pipeline()
            results[played.name] = played
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=play, args=(pipeline,)) for pipeline in pipelines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    assert not failures, failures
    return results


def decided(
    store: Store, verdicts_dir: Path, played: Iterable[Played], timeout_s: float = 240
) -> dict[tuple[str, str], dict[str, Any]]:
    """Every stored verdict by (message id, hop), once each (message, hop) the pipelines expect has one and the
    detector holds no message any more."""
    expected = {key for p in played for key in p.expected}
    verdicts: dict[tuple[str, str], dict[str, Any]] = {}

    def settled() -> bool:
        verdicts.clear()
        verdicts.update({(v["message_id"], v["hop"]): v for v in stored_verdicts(store, verdicts_dir)})
        beat = store.heartbeat.latest(DETECTOR_QUERY)
        return expected <= set(verdicts) and beat is not None and beat["state_rows"] == 0

    until(settled, timeout_s, "every hop of every message decided")
    return dict(verdicts)
