"""The detector DAG's tasks: health from the store, stopping a hung driver, the spark-submit arguments."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from khipu.detector.job import VERDICT_QUERY
from khipu.detector.supervise import DetectorState, judge_detector, stop_driver
from khipu.settings import KhipuSettings, project_root
from khipu_airflow.hooks import KhipuKafkaHook, KhipuStoreHook

log = logging.getLogger(__name__)
STALE_AFTER_MS = 120_000


def detector_state(store_conn_id: str) -> DetectorState:
    store = KhipuStoreHook(store_conn_id).store()
    try:
        beat = store.latest_heartbeat(VERDICT_QUERY)
    finally:
        store.close()
    health = judge_detector(beat["at_ms"] if beat else None, time.time_ns() // 1_000_000, STALE_AFTER_MS)
    log.info("detector %s: %s", health.state.value, health.reason)
    return health.state


def stop_hung_detector() -> str:
    outcome = stop_driver(checkpoint_dir())
    log.info("stopping what is left of the detector: %s", outcome)
    return outcome


def checkpoint_dir() -> Path:
    return KhipuSettings.from_env().state_dir / "detector" / "checkpoint"


def application() -> str:
    return str(project_root() / "spark" / "detector.py")


def application_args(kafka_conn_id: str, store_conn_id: str) -> list[str]:
    """spark/detector.py's arguments from the Airflow connections and Khipu's settings.

    Only non-secret settings go on the command line; a secured cluster's credentials reach the
    driver through its environment (KHIPU_*), never through arguments that process lists show.
    """
    settings = KhipuSettings.from_env()
    kafka, store_url = KhipuKafkaHook(kafka_conn_id), KhipuStoreHook(store_conn_id).url()
    return [
        "--registry",
        str(settings.registry_path),
        "--bootstrap-servers",
        kafka.bootstrap_servers,
        "--trace-topic",
        kafka.trace_topic,
        "--store-url",
        store_url,
        "--checkpoint",
        str(checkpoint_dir()),
        "--archive",
        str(settings.state_dir / "archive"),
    ]


class DetectorSubmitOperator(SparkSubmitOperator):  # type: ignore[misc]
    """spark-submit of the detector; its arguments come from the connections when the task runs
    (not when the DAG file is parsed, where connections may not be reachable)."""

    def __init__(self, *, kafka_conn_id: str, store_conn_id: str, **kwargs: Any) -> None:
        super().__init__(application=application(), name="khipu-detector", **kwargs)
        self.kafka_conn_id, self.store_conn_id = kafka_conn_id, store_conn_id

    def execute(self, context: Any) -> None:
        self.application_args = application_args(self.kafka_conn_id, self.store_conn_id)
        super().execute(context)
