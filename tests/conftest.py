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
