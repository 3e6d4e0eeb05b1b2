"""`khipu up` / `status` / `down` for real: broker, object store, Airflow standalone and the demo pipeline start,
traces flow, a second `up` changes nothing, and `down` leaves nothing running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from khipu.kafka.trace_topic import read_trace_topic, tally_traces
from khipu.localstack.airflow import STACK_USERS, admin_password, user_password
from khipu.localstack.processes import ProcessTable, Started, free_port, port_open
from khipu.registry import load_registry

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KHIPU = str(Path(sys.executable).parent / "khipu")


COMPONENTS = ("broker", "s3proxy", "airflow", "demo", "exporter")  # what `up` starts and `down` stops


def khipu(*args: str, env: dict[str, str], timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KHIPU, *args], env=env, capture_output=True, text=True, timeout=timeout_s, check=False)


def test_up_starts_the_stack_traces_flow_up_again_is_a_no_op_and_down_stops_everything(tmp_path: Path) -> None:
    broker_port, controller_port, airflow_port, exporter_port = free_port(), free_port(), free_port(), free_port()
    object_store_port = free_port()
    env = {
        **os.environ,
        "KHIPU_STATE_DIR": str(tmp_path / "state"),
        "KHIPU_BROKER_PORT": str(broker_port),
        "KHIPU_BROKER_CONTROLLER_PORT": str(controller_port),
        "KHIPU_AIRFLOW_PORT": str(airflow_port),
        "KHIPU_EXPORTER_PORT": str(exporter_port),
        "KHIPU_OBJECT_STORE_PORT": str(object_store_port),
    }
    table = ProcessTable(tmp_path / "state")
    started: dict[str, object] = {}
    try:
        first = khipu("up", env=env)
        assert first.returncode == 0, first.stdout + first.stderr
        assert f"Airflow UI: http://127.0.0.1:{airflow_port}  (healthy)" in first.stdout
        assert f"broker: Apache Kafka on 127.0.0.1:{broker_port}" in first.stdout
        assert f"s3proxy: S3 API on http://127.0.0.1:{object_store_port}" in first.stdout
        started = {name: table.running(name) for name in COMPONENTS}
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
        assert {line.split(":")[0] for line in again.stdout.splitlines() if "already running" in line} == set(
            COMPONENTS
        )
        assert {name: table.running(name) for name in started} == started  # same processes, none added

        # the exporter serves Prometheus metrics with the token `up` drew (owner-only, never printed); the Khipu view
        # answers only behind Airflow's login
        metrics = f"http://127.0.0.1:{exporter_port}/metrics"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(metrics, timeout=10)
        assert refused.value.code == 401  # every team's figures: not without the token
        token_file = tmp_path / "state" / "exporter.token"
        token = token_file.read_text().strip()
        assert len(token) >= 32 and token not in first.stdout + first.stderr and str(token_file) in first.stdout
        scrape = urllib.request.Request(metrics, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(scrape, timeout=10) as answer:
            families = {f.name for f in text_string_to_metric_families(answer.read().decode())}
        assert {"khipu_exporter_scrape_error", "khipu_quarantined_records"} <= families
        # the object store answers with the credentials `up` drew into its owner-only file, and keeps the objects
        # under the state folder
        credentials = json.loads((tmp_path / "state" / "s3proxy" / "credentials.json").read_text())
        store = pafs.S3FileSystem(
            access_key=credentials["access_key"], secret_key=credentials["secret_key"],
            endpoint_override=f"http://127.0.0.1:{object_store_port}", region="us-east-1",
        )  # fmt: skip
        pq.write_table(pa.table({"id": [1, 2, 3]}), "khipu/probe/p.parquet", filesystem=store)
        assert (tmp_path / "state" / "s3proxy" / "data" / "khipu" / "probe" / "p.parquet").is_file()
        assert credentials["secret_key"] not in first.stdout + first.stderr
        # what names the teams' messages is its owner's only
        state = tmp_path / "state"
        private = [state, state / "khipu.db", state / "airflow" / "airflow.db", state / "demo" / "ledger.jsonl",
                   token_file, state / "airflow" / "khipu-connections.json", state / "s3proxy" / "credentials.json",
                   state / "s3proxy" / "s3proxy.properties"]  # fmt: skip
        modes = {str(path.relative_to(tmp_path)): oct(path.stat().st_mode & 0o777) for path in private}
        assert modes == {**{name: "0o600" for name in modes}, "state": "0o700"}
        readable = [str(p) for p in state.rglob("*") if p.is_file() and p.stat().st_mode & 0o044]
        assert readable == [], "files of the state folder readable by others"
        view = f"http://127.0.0.1:{airflow_port}/khipu/api/v1/streams"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(view, timeout=10)
        assert refused.value.code == 401
        assert admin_password(tmp_path / "state" / "airflow") is not None
        # out of the box: an admin seeing every stream, and a user of each demo stream's team seeing theirs only
        seen, dags_seen = {}, {}
        for user in STACK_USERS:
            password = user_password(tmp_path / "state" / "airflow", user.name)
            assert password is not None, user
            login = urllib.request.Request(
                f"http://127.0.0.1:{airflow_port}/auth/token",
                data=json.dumps({"username": user.name, "password": password}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(login, timeout=10) as answer:
                token = json.loads(answer.read())["access_token"]
            with urllib.request.urlopen(
                urllib.request.Request(view, headers={"Authorization": f"Bearer {token}"}), timeout=10
            ) as answer:
                seen[user.name] = {s["stream"] for s in json.loads(answer.read())}
            dags_url = f"http://127.0.0.1:{airflow_port}/api/v2/dags?limit=100"
            deadline = time.monotonic() + 120  # the dag-processor parses every bundle within a minute or two
            while True:
                with urllib.request.urlopen(
                    urllib.request.Request(dags_url, headers={"Authorization": f"Bearer {token}"}), timeout=10
                ) as answer:
                    dags_seen[user.name] = {d["dag_id"] for d in json.loads(answer.read())["dags"]}
                if len(dags_seen[user.name]) >= (10 if user.name == "admin" else 1) or time.monotonic() > deadline:
                    break
                time.sleep(3)
            logged = "".join(p.read_text(errors="replace") for p in (tmp_path / "state" / "logs").glob("*.log"))
            assert password not in logged and password not in first.stdout + first.stderr  # never printed
            assert credentials["secret_key"] not in logged
        assert seen == {"admin": {"demo.orders", "demo.bursts"}, "demo": {"demo.orders"}, "bursts": {"demo.bursts"}}
        # in Airflow itself: Khipu's own DAGs are the admin's, each team sees its own resend DAG only
        own = {path.stem for path in (ROOT / "dags").glob("khipu_*.py")}
        teams = {"khipu_resend_manual__team-demo", "khipu_resend_manual__team-bursts"}
        assert dags_seen == {
            "admin": own | teams,
            "demo": {"khipu_resend_manual__team-demo"},
            "bursts": {"khipu_resend_manual__team-bursts"},
        }

        status = khipu("status", env=env)
        assert status.returncode == 0 and "demo     running" in status.stdout and "s3proxy  running" in status.stdout
        assert f"object store: http://127.0.0.1:{object_store_port}" in status.stdout
        assert "log in as 'admin' (every stream), 'demo' (team-demo: demo.orders), 'bursts'" in status.stdout
        assert "detector " in status.stdout  # listed; the khipu_detector DAG starts it within two minutes
    finally:
        stopped = khipu("down", env=env)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert all(table.running(name) is None for name in COMPONENTS)
    assert not [
        s.pid
        for s in started.values()
        if isinstance(s, Started)
        and psutil.pid_exists(s.pid)
        and psutil.Process(s.pid).status() != psutil.STATUS_ZOMBIE
    ]
    assert not port_open("127.0.0.1", broker_port) and not port_open("127.0.0.1", airflow_port)
    assert not port_open("127.0.0.1", exporter_port) and not port_open("127.0.0.1", object_store_port)
    assert not port_open("127.0.0.1", controller_port)
    assert khipu("status", env=env).returncode == 3
