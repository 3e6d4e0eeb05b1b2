"""Turning a manual trigger's parameters into a validated demo configuration."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from khipu.demo.faults import DemoConfigError, FaultRates
from khipu.demo.pipeline import DemoConfig


def burst_run_id(airflow_run_id: str) -> str:
    """The demo run id of the burst an Airflow run makes: ``burst`` and 64 bits of a hash of the whole run id.

    Each Airflow run gets its own (a thousand bursts share one with a chance of about 3e-14), and a retried task
    the same one. The run id goes into message ids and the ledger's name, so it holds letters and digits only."""
    return "burst" + hashlib.blake2b(airflow_run_id.encode(), digest_size=8).hexdigest()


def demo_config_from_params(
    params: Mapping[str, Any], *, bootstrap_servers: str, trace_topic: str, ledger_dir: Path, run_id: str
) -> DemoConfig:
    """``params``: count, rate_per_s, sampling_percent (or None), faults ({name: rate}), seed."""
    faults = params.get("faults") or {}
    if not isinstance(faults, Mapping):
        raise DemoConfigError("faults", faults, "an object of fault name -> probability")
    try:
        rates = FaultRates(**{str(k): v for k, v in faults.items()})
    except TypeError:
        known = ", ".join(FaultRates().as_dict())
        raise DemoConfigError("faults", sorted(faults), f"fault names among: {known}") from None
    count = params.get("count", 500)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise DemoConfigError("count", count, "an integer >= 1")  # a burst produces something
    return DemoConfig(
        bootstrap_servers=bootstrap_servers,
        trace_topic=trace_topic,
        ledger_path=ledger_dir / f"burst-{run_id}.jsonl",
        count=count,
        rate_per_s=float(params.get("rate_per_s", 100.0)),
        sampling_percent=params.get("sampling_percent"),
        faults=rates,
        seed=int(params.get("seed", 0)),
        run_id=run_id,
    )
