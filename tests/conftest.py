"""Test session set-up shared by every test.

Airflow reads AIRFLOW_HOME at import time, so the environment is fixed here, before any test
module imports Airflow: a fresh Airflow home and Khipu state folder per session, under a
temporary directory, never ~/airflow, removed when the session ends (``KHIPU_KEEP_TEST_STATE=1`` keeps it).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SESSION_DIR = Path(tempfile.mkdtemp(prefix="khipu-tests-"))
if os.environ.get("KHIPU_KEEP_TEST_STATE") != "1":  # each pytest process its own, removed when it exits (1: kept)
    atexit.register(shutil.rmtree, SESSION_DIR, ignore_errors=True)

os.environ["AIRFLOW_HOME"] = str(SESSION_DIR / "airflow")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(ROOT / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(ROOT / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["KHIPU_STATE_DIR"] = str(SESSION_DIR / "state")
os.environ["KHIPU_REGISTRY"] = str(ROOT / "config" / "registry.yaml")
os.environ["PYSPARK_PYTHON"] = sys.executable
for variable in ("KHIPU_BOOTSTRAP_SERVERS", "KHIPU_TRACE_BOOTSTRAP_SERVERS", "KHIPU_TRACE_TOPIC", "KHIPU_CLUSTER"):
    os.environ.pop(variable, None)
# Every JVM a test starts (brokers, Spark drivers and executors, the JVM applications) compiles with C1 only. They
# live seconds to minutes, and on two cores the optimizing C2 compiler took more CPU than it gave back: the killed
# detector test alone, machine-wide CPU 298 s -> 189 s, wall 174 s -> 141 s (2026-11-28). Tests only: outside them
# (`make up`, bench/) JVMs run as shipped. The java launcher notes the variable on stderr once per start.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")

# `make test` runs the suite on two pytest-xdist workers (``-n 2 --dist loadscope``), each with its own broker,
# Spark session and Airflow home (this module runs in each), and the scheduler below makes two scopes of the
# suite, one a worker: the detector's and reconciliation's pipelines and the DAGs on one; the rest (the view in
# Chromium, the JVM applications, resend, the local stack, the store, unit tests) on the other, about 20 and 15
# minutes of tests here. Most of their time is spent waiting on Kafka's, Spark's and Airflow's clocks, so their
# waits overlap. (xdist's own ``loadgroup`` marks do nothing under pytest 9.2: it renames the test ids to group
# them, and pytest 9 no longer takes a new id that way.)
PIPELINE_TESTS = ("tests/integration/dags/", "tests/integration/demo/", "tests/integration/detector/",
                  "tests/integration/reconcile/")  # fmt: skip
# pipeline tests with brokers and a PostgreSQL server of their own, run with the rest to even out the two workers'
# time (2026-11-28, fresh clone: the pipelines' scope 26.2 min of tests, the rest's 18.6; the outage tests 5 to 7)
WITH_THE_REST = ("tests/integration/detector/test_outages.py",)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadscope``: a scope is one of the two groups above, not a module."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TwoGroups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            pipeline = nodeid.startswith(PIPELINE_TESTS) and not nodeid.startswith(WITH_THE_REST)
            return "pipelines" if pipeline else "the-rest"

    return TwoGroups(config, log)
