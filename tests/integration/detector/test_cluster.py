"""The detector on a Spark standalone cluster whose executors share nothing with the driver.

A master and two workers on 127.0.0.1, started by this test from the pyspark install; the workers (and so
every executor) run as another Unix user (``nobody``), each with its own work and local folders, so they
cannot read the driver's state folder, as on hosts that share no disk with it. The store is PostgreSQL over
TCP; the trace archive, the verdict archive and the checkpoint are in a real S3 API (s3proxy, started by the
tests); the job is submitted with ``--master spark://...`` in client mode. It must give the verdicts a
``local[*]`` run gives on the same trace topic, exact against the demo's ground truth.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path
from subprocess import STDOUT

import psutil
import pytest

from khipu.demo.score import score
from khipu.localstack.broker import BrokerProcess
from khipu.localstack.object_store import ObjectStoreProcess
from khipu.localstack.spark_cluster import start_spark_cluster
from khipu.storage.location import Location
from khipu.store import Store
from tests.integration.detector.conftest import (
    JudgedDemo,
    detector_command,
    detector_job,
    verdict_keys,
    wait_until_settled,
)
from tests.integration.store.conftest import _postgres_database

pytestmark = pytest.mark.integration

WORKER_USER = "nobody"


def test_the_detector_on_workers_that_share_nothing_with_the_driver_gives_the_verdicts_of_a_local_run(
    broker: BrokerProcess,
    judged_demo: JudgedDemo,
    object_store: ObjectStoreProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    demo, observable = judged_demo.demo, judged_demo.observable
    for name, value in object_store.environment().items():
        monkeypatch.setenv(name, value)  # this process reads the verdict archive from the object store too
    data = Location.of(f"s3a://{object_store.bucket}/cluster-{uuid.uuid4().hex[:8]}")
    cluster_dir = Path(tempfile.mkdtemp(prefix="khipu-cluster-"))  # outside the driver's 0700 test folder
    cluster_dir.chmod(0o755)
    with _postgres_database() as store_url:
        store = Store(store_url)
        store.migrate()
        store.close()
        job = dataclasses.replace(
            detector_job(broker, tmp_path, demo.trace_topic, "cluster", store_url=store_url),
            checkpoint_dir=data / "checkpoint",
            archive_dir=data / "archive",
            verdicts_dir=data / "verdicts",
        )
        cluster = start_spark_cluster(
            cluster_dir,
            workers=2,
            cores_per_worker=1,
            worker_memory_mb=1024,
            run_as=WORKER_USER,
            worker_environment=object_store.environment(),
        )
        log = tmp_path / "driver.log"
        try:
            assert cluster.alive_workers() == 2
            command = detector_command(job, tmp_path, cluster.url)
            connections = Path(command[command.index("--connections-file") + 1])
            env = {**os.environ, "PYSPARK_PYTHON": cluster.python}  # the workers' own Python
            driver = subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=STDOUT, start_new_session=True)
            try:
                on_cluster = wait_until_settled(store_url, observable, timeout_s=300, verdicts_dir=job.verdicts_dir)
                executors = [
                    p for p in psutil.process_iter(["cmdline", "uids"])
                    if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in (p.info["cmdline"] or [])
                ]  # fmt: skip
                executor_users = {pwd.getpwuid(p.info["uids"].real).pw_name for p in executors}
                # what the driver's host keeps to itself, the executors' user cannot read
                denied = subprocess.run(
                    ["setpriv", f"--reuid={WORKER_USER}", f"--regid={pwd.getpwnam(WORKER_USER).pw_gid}",
                     "--clear-groups", "--", "cat", str(connections)],
                    capture_output=True,
                )  # fmt: skip
            except AssertionError:
                print("driver's log, last lines:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-60:]))
                raise
            finally:
                os.killpg(driver.pid, signal.SIGTERM)
                driver.wait(timeout=60)
            executor_logs = sorted(cluster_dir.glob("worker-*/app-*/*/stderr"))
        finally:
            cluster.stop()
            shutil.rmtree(cluster_dir, ignore_errors=True)

    # the work ran on the workers, as the other user, which could not read the driver's connections file
    assert {path.parents[1].parent.name for path in executor_logs} == {"worker-0", "worker-1"}
    assert executor_users == {WORKER_USER}
    assert denied.returncode != 0 and b"Permission denied" in denied.stderr
    # the checkpoint and both archives are in the object store, nothing of them on the driver's disk
    checkpoint = job.checkpoint_dir / "khipu_detector"
    assert {"offsets", "commits", "state"} <= set(checkpoint.child_folders())
    assert (job.checkpoint_dir / "driver.json").is_file()
    assert job.archive_dir.child_folders("hour=") and job.verdicts_dir.child_folders("hour=")
    assert not any(p.name.startswith("cluster-") for p in tmp_path.iterdir() if p.is_dir())
    # exact, as a local run on the same topic
    assert verdict_keys(on_cluster) == verdict_keys(judged_demo.whole)
    assert len(on_cluster) == len(verdict_keys(on_cluster))  # none stored twice
    assert score(demo.truth, on_cluster).exact
