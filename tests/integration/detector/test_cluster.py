"""The detector on a Spark standalone cluster: a master and two workers on 127.0.0.1, started by this test
from the pyspark install, the job submitted with ``--master spark://...``. It must give the verdicts a
``local[*]`` run gives on the same trace topic — the way a user grows past one machine.

Real parts throughout: the broker, Spark's standalone master and workers (their executors run the
processor), Spark's Kafka connector, the store and the verdict archive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from subprocess import STDOUT

import pytest

from khipu.demo.score import score
from khipu.localstack.broker import BrokerProcess
from khipu.localstack.spark_cluster import start_spark_cluster
from tests.integration.detector.conftest import (
    JudgedDemo,
    detector_command,
    detector_job,
    verdict_keys,
    wait_until_settled,
)

pytestmark = pytest.mark.integration


def test_the_detector_on_a_two_worker_cluster_gives_the_verdicts_of_a_local_run(
    broker: BrokerProcess, judged_demo: JudgedDemo, tmp_path: Path
) -> None:
    demo, observable = judged_demo.demo, judged_demo.observable
    job = detector_job(broker, tmp_path, demo.trace_topic, "cluster")
    cluster = start_spark_cluster(tmp_path / "spark-cluster", workers=2, cores_per_worker=1, worker_memory_mb=1024)
    log = tmp_path / "driver.log"
    try:
        assert cluster.alive_workers() == 2
        command = detector_command(job, tmp_path, cluster.url)
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        driver = subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=STDOUT, start_new_session=True)
        try:
            on_cluster = wait_until_settled(job.store_url, observable, timeout_s=300, verdicts_dir=job.verdicts_dir)
        except AssertionError:
            print("driver's log, last lines:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-60:]))
            raise
        finally:
            os.killpg(driver.pid, signal.SIGTERM)
            driver.wait(timeout=60)
        executors = sorted((tmp_path / "spark-cluster").glob("worker-*/app-*/*/stderr"))
    finally:
        cluster.stop()

    # the work ran on the workers: each started an executor for the detector's application
    assert {path.parents[1].parent.name for path in executors} == {"worker-0", "worker-1"}
    assert verdict_keys(on_cluster) == verdict_keys(judged_demo.whole)
    assert len(on_cluster) == len(verdict_keys(on_cluster))  # none stored twice
    assert score(demo.truth, on_cluster).exact
