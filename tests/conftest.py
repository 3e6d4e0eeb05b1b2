"""Test session set-up shared by every test.

Airflow reads AIRFLOW_HOME at import time, so the environment is fixed here, before any test
module imports Airflow: a fresh Airflow home and Khipu state folder per session, under a
temporary directory, never ~/airflow.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SESSION_DIR = Path(tempfile.mkdtemp(prefix="khipu-tests-"))

os.environ["AIRFLOW_HOME"] = str(SESSION_DIR / "airflow")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(ROOT / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(ROOT / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["KHIPU_STATE_DIR"] = str(SESSION_DIR / "state")
os.environ["KHIPU_REGISTRY"] = str(ROOT / "config" / "registry.yaml")
os.environ["PYSPARK_PYTHON"] = sys.executable
for variable in ("KHIPU_BOOTSTRAP_SERVERS", "KHIPU_TRACE_BOOTSTRAP_SERVERS", "KHIPU_TRACE_TOPIC", "KHIPU_CLUSTER"):
    os.environ.pop(variable, None)

# `make test` runs the suite on two pytest-xdist workers (``-n 2 --dist loadgroup``), each with its own broker,
# Spark session and Airflow home (this module runs in each). A test module's group says which worker: the
# detector's and reconciliation's pipelines and the DAGs on one; the rest (the view in Chromium, the JVM
# applications, resend, the local stack, the store, unit tests) on the other, about 20 and 15 minutes of tests
# here. Most of their time is spent waiting on Kafka's, Spark's and Airflow's clocks, so their waits overlap.
PIPELINE_TESTS = ("integration/dags/", "integration/demo/", "integration/detector/", "integration/reconcile/")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        where = Path(str(item.path)).relative_to(ROOT / "tests").as_posix()
        group = "pipelines" if where.startswith(PIPELINE_TESTS) else "the-rest"
        item.add_marker(pytest.mark.xdist_group(group))
