"""Real parts for integration tests: an Apache Kafka broker (KRaft, single node), an S3-API object store (S3Proxy)
and a migrated Airflow database.

The session's broker listens twice: PLAINTEXT for most tests, and SASL_PLAINTEXT (mechanism PLAIN)
with one user whose password is drawn per session, for the tests of secured clusters.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from khipu.detector.launch import connector_jars
from khipu.localstack.broker import BrokerProcess, BrokerSpec, start_broker
from khipu.localstack.object_store import ObjectStoreProcess, ObjectStoreSpec, start_object_store
from khipu.localstack.processes import stop_process_group

SASL_USER = "khipu-tests"
BROKER_START_S: dict[str, float] = {}


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """Short retentions act within a second or two here (the retention-expiry tests use seconds), and the log
    cleaner looks for work every half second, not every 15 (the compaction tests: a superseded record is gone
    about 0.5 s after the segment holding it rolls; no more idle CPU than the default, measured)."""
    directory = tmp_path_factory.mktemp("kafka")
    spec = BrokerSpec.scratch(
        directory, sasl_users={SASL_USER: secrets.token_urlsafe(16)}, settings={"log.cleaner.backoff.ms": "500"}
    )
    started = time.monotonic()
    process = start_broker(spec, directory / "broker.log")
    BROKER_START_S["session"] = time.monotonic() - started
    try:
        yield process
    finally:
        stop_process_group(process.pid)


@pytest.fixture(scope="module")
def second_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A second cluster, for a route across two (started per test module that asks for it)."""
    directory = tmp_path_factory.mktemp("kafka-second")
    process = start_broker(BrokerSpec.scratch(directory), directory / "broker.log")
    try:
        yield process
    finally:
        stop_process_group(process.pid)


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStoreProcess]:
    """The session's S3 API: S3Proxy over a folder on a free port of 127.0.0.1, its bucket (``khipu``) created, its
    credentials drawn at random. A process reaches it with ``object_store.environment()`` in its environment."""
    directory = tmp_path_factory.mktemp("s3proxy")
    process = start_object_store(ObjectStoreSpec.scratch(directory / "store"), directory / "s3proxy.log")
    try:
        yield process
    finally:
        process.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for name, seconds in BROKER_START_S.items():
        terminalreporter.write_line(f"Kafka broker ({name}): formatted, started and answering in {seconds:.1f} s")


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """Migrate this session's Airflow metadata database (AIRFLOW_HOME from tests/conftest.py)."""
    home = Path(os.environ["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    airflow = Path(sys.executable).parent / "airflow"
    result = subprocess.run([str(airflow), "db", "migrate"], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"airflow db migrate failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    return home


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A real HTTP receiver on 127.0.0.1 for the webhook notifier: (its URL, the JSON bodies it got)."""
    received: list[dict[str, Any]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/alerts", received
    finally:
        server.shutdown()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,4]")  # as the product's local mode: a failed task is tried again
        .appName("khipu-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")  # the driver's listeners on loopback only
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.worker.faulthandler.enabled", "true")  # a Python worker that crashes says where
        .config("spark.jars", ",".join(str(jar) for jar in connector_jars()))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
