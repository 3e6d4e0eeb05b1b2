"""A Spark standalone cluster on this machine: one master and some workers, all on 127.0.0.1.

How the detector grows past one machine is a Spark cluster; this starts a small one from the pyspark
install (``spark-class``, no download), for the cluster test and the bench, so that the same job runs
on ``spark://`` as on ``local[*]``. Every process binds to 127.0.0.1 (``SPARK_LOCAL_IP``: web UIs too)
and runs in its own process group, stopped by signalling that group.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from khipu.localstack.processes import free_port, port_open, stop_process_group

HOST = "127.0.0.1"


class SparkClusterError(RuntimeError):
    pass


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass
class SparkCluster:
    """A running standalone master and its workers (``stop()`` ends them all)."""

    directory: Path
    master_port: int
    master_ui_port: int
    pids: list[int] = field(default_factory=list)
    python: str = sys.executable  # what a driver hands its executors as PYSPARK_PYTHON

    @property
    def url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.master_ui_port}/json/", timeout=2) as answer:
                return int(json.load(answer).get("aliveworkers", 0))
        except OSError:
            return 0

    def stop(self) -> None:
        for pid in reversed(self.pids):
            stop_process_group(pid)
        self.pids.clear()


def _spawn(
    cluster: SparkCluster,
    name: str,
    argv: list[str],
    memory_mb: int,
    *,
    run_as: str | None = None,
    environment: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> int:
    log = cluster.directory / f"{name}.log"
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": HOST,  # every listener of the daemon, its web UI included, on loopback only
        "SPARK_DAEMON_MEMORY": f"{memory_mb}m",
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        **(environment or {}),
    }
    prefix: list[str] = []
    if run_as is not None:  # another Unix user: it cannot read what the driver's user keeps to itself
        user = pwd.getpwnam(run_as)
        prefix = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"]
        env |= {"HOME": str(home or cluster.directory), "USER": run_as, "LOGNAME": run_as}
    with log.open("ab") as out:
        process = subprocess.Popen(
            [*prefix, str(spark_home() / "bin" / "spark-class"), *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    cluster.pids.append(process.pid)
    return process.pid


def worker_python(directory: Path) -> Path:
    """A Python for workers running as another user: this machine's Python 3.11 with Khipu's packages (the
    checkout's virtualenv's site-packages and ``include``) on its path, as a worker host has them installed. The
    driver's own interpreter may sit where that user cannot reach (a home folder), so it is not handed over."""
    import site

    packages = [p for p in site.getsitepackages() if Path(p).is_dir()]
    include = Path(__file__).resolve().parents[2]  # the folder holding the khipu package
    interpreter = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not interpreter.exists():
        raise SparkClusterError(
            f"{interpreter} is missing: workers running as another user need this machine's Python "
            f"{sys.version_info.major}.{sys.version_info.minor} (Debian: apt-get install python3)"
        )
    path = directory / "python"
    path.write_text(
        "#!/bin/sh\n# a worker's Python: written by khipu.localstack.spark_cluster\n"
        f"export PYTHONPATH={':'.join([*packages, str(include)])}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        f'exec {interpreter} "$@"\n'
    )
    path.chmod(0o755)
    return path


def start_spark_cluster(
    directory: Path,
    workers: int = 2,
    cores_per_worker: int = 1,
    worker_memory_mb: int = 3072,
    timeout_s: float = 90,
    *,
    run_as: str | None = None,
    worker_environment: Mapping[str, str] | None = None,
) -> SparkCluster:
    """Start a master and ``workers`` workers; return once every worker has registered with the master.

    ``run_as``: the workers (and so their executors) run as that Unix user, each with a work folder and local
    folders of its own, as on hosts that share nothing with the driver: they cannot read the driver's state
    (needs root; ``directory`` must be one that user can reach), with a Python of their own
    (:attr:`SparkCluster.python`: hand it to the driver as PYSPARK_PYTHON). ``worker_environment``: added to the
    workers' environment, which their executors inherit (an object store's credentials: never a Spark setting)."""
    directory.mkdir(parents=True, exist_ok=True)
    cluster = SparkCluster(directory, free_port(), free_port())
    if run_as is not None:
        cluster.python = str(worker_python(directory))
    try:
        _spawn(
            cluster,
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                HOST,
                "--port",
                str(cluster.master_port),
                "--webui-port",
                str(cluster.master_ui_port),
            ],
            512,
        )
        deadline = time.monotonic() + timeout_s
        while not port_open(HOST, cluster.master_port):
            if time.monotonic() > deadline:
                raise SparkClusterError(
                    f"the Spark master did not listen on {HOST}:{cluster.master_port}; see {directory}"
                )
            time.sleep(0.3)
        for number in range(workers):
            work = directory / f"worker-{number}"
            local = work / "local"  # its executors' scratch (shuffle, spills), its own as a host's disk would be
            local.mkdir(parents=True, exist_ok=True)
            if run_as is not None:
                user = pwd.getpwnam(run_as)
                for folder in (work, local):
                    os.chown(folder, user.pw_uid, user.pw_gid)
            _spawn(
                cluster,
                f"worker-{number}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    HOST,
                    "--webui-port",
                    str(free_port()),
                    "--cores",
                    str(cores_per_worker),
                    "--memory",
                    f"{worker_memory_mb}m",
                    "--work-dir",
                    str(work),
                    cluster.url,
                ],
                512,
                run_as=run_as,
                environment={**(worker_environment or {}), "SPARK_LOCAL_DIRS": str(local)},
                home=work,
            )
        while cluster.alive_workers() < workers:
            if time.monotonic() > deadline:
                raise SparkClusterError(
                    f"{cluster.alive_workers()} of {workers} Spark workers registered within {timeout_s:.0f} s; "
                    f"see the logs in {directory}"
                )
            time.sleep(0.5)
        return cluster
    except BaseException:
        cluster.stop()
        raise
