"""`khipu up` / `status` / `down` for real: broker, Airflow standalone and the demo pipeline start,
traces flow, a second `up` changes nothing, and `down` leaves nothing running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from khipu.localstack.processes import ProcessTable, Started, free_port, port_open
from khipu.registry import load_registry
from khipu.trace.topic import read_trace_topic, tally_traces

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KHIPU = str(Path(sys.executable).parent / "khipu")


def khipu(*args: str, env: dict[str, str], timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KHIPU, *args], env=env, capture_output=True, text=True, timeout=timeout_s, check=False)


def test_up_starts_the_stack_traces_flow_up_again_is_a_no_op_and_down_stops_everything(tmp_path: Path) -> None:
    broker_port, controller_port, airflow_port = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "KHIPU_STATE_DIR": str(tmp_path / "state"),
        "KHIPU_BROKER_PORT": str(broker_port),
        "KHIPU_BROKER_CONTROLLER_PORT": str(controller_port),
        "KHIPU_AIRFLOW_PORT": str(airflow_port),
    }
    table = ProcessTable(tmp_path / "state")
    started: dict[str, object] = {}
    try:
        first = khipu("up", env=env)
        assert first.returncode == 0, first.stdout + first.stderr
        assert f"Airflow UI: http://127.0.0.1:{airflow_port}  (healthy)" in first.stdout
        assert f"broker: Apache Kafka on 127.0.0.1:{broker_port}" in first.stdout
        started = {name: table.running(name) for name in ("broker", "airflow", "demo")}
        assert all(started.values()), started

        route = load_registry(ROOT / "config" / "registry.yaml").stream("demo.orders").route
        expected = {(hop.id, "SENT" if hop.kind.value == "write" else "RECEIVED") for hop in route.hops}
        deadline = time.monotonic() + 90
        seen: set[tuple[str, str]] = set()
        while time.monotonic() < deadline and not expected <= seen:
            time.sleep(3)
            seen = set(tally_traces(read_trace_topic(f"127.0.0.1:{broker_port}", "khipu.traces")).by_hop)
        assert expected <= seen, f"traces missing for {expected - seen}"

        again = khipu("up", env=env)
        assert again.returncode == 0, again.stdout + again.stderr
        assert {line.split(":")[0] for line in again.stdout.splitlines() if "already running" in line} == {
            "broker",
            "airflow",
            "demo",
        }
        assert {name: table.running(name) for name in started} == started  # same processes, none added

        status = khipu("status", env=env)
        assert status.returncode == 0 and "demo     running" in status.stdout
        assert "detector " in status.stdout  # listed; the khipu_detector DAG starts it within two minutes
    finally:
        stopped = khipu("down", env=env)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert all(table.running(name) is None for name in ("broker", "airflow", "demo"))
    assert not [
        s.pid
        for s in started.values()
        if isinstance(s, Started)
        and psutil.pid_exists(s.pid)
        and psutil.Process(s.pid).status() != psutil.STATUS_ZOMBIE
    ]
    assert not port_open("127.0.0.1", broker_port) and not port_open("127.0.0.1", airflow_port)
    assert not port_open("127.0.0.1", controller_port)
    assert khipu("status", env=env).returncode == 3
