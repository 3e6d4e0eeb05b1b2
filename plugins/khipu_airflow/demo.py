"""The demo burst as an Airflow task: connection -> demo config -> run -> JSON-able report."""

from __future__ import annotations

import logging
from typing import Any

from khipu.demo.params import burst_run_id, demo_config_from_params
from khipu.demo.pipeline import run_demo
from khipu.demo.topology import BURST_STREAM, DemoTopology
from khipu.registry.loader import load_registry
from khipu.settings import KhipuSettings
from khipu_airflow.hooks import KhipuKafkaHook

log = logging.getLogger(__name__)


def run_burst(
    params: dict[str, Any], airflow_run_id: str, kafka_conn_id: str = KhipuKafkaHook.default_conn_name
) -> dict[str, Any]:
    """One burst for the Airflow run ``airflow_run_id`` (its message ids and ledger are that run's own)."""
    settings = KhipuSettings.from_env()
    hook = KhipuKafkaHook(kafka_conn_id)
    topology = DemoTopology.from_stream(load_registry(settings.registry_path).stream(BURST_STREAM))
    config = demo_config_from_params(
        params,
        bootstrap_servers=hook.bootstrap_servers,
        trace_topic=hook.trace_topic,
        ledger_dir=settings.state_dir / "demo",
        run_id=burst_run_id(airflow_run_id),
    )
    report = run_demo(config, topology, progress=log.info)
    for hop, entry in sorted(report.hop_summary.items()):
        log.info("hop %s: %s", hop, entry)
    return {
        "run_id": report.run_id,
        "ledger": str(report.ledger_path),
        "produced": report.produced,
        "hops": report.hop_summary,
        "faults": report.fault_counts,
        "traces_dropped": {location: stats.dropped for location, stats in report.emitters.items()},
    }
