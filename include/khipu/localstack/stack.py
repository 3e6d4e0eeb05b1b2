"""`make up` / `make down` / `make status`: the whole local stack as processes this project owns.

Up starts, in order and only what is not running yet: the Apache Kafka broker on 127.0.0.1 (its
data under the state folder, kept across restarts), the S3-API object store (S3Proxy on 127.0.0.1, its
objects and credentials under the state folder), the topics, Airflow standalone (DAGs and
plugins from this checkout, state under the state folder) with Khipu's connections, and the demo
pipeline. Down stops exactly those processes, by the
process groups recorded at start.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.engine import make_url

from khipu.demo.topology import DEMO_STREAM, DemoTopology
from khipu.detector.model import DETECTOR_QUERY
from khipu.files import ensure_token, tighten
from khipu.kafka import KafkaAdmin, KafkaUnavailable
from khipu.localstack.airflow import (
    PASSWORDS_FILE,
    STACK_USERS,
    admin_password,
    airflow_env,
    airflow_healthy,
    prepare_airflow,
)
from khipu.localstack.broker import BrokerError, BrokerSpec, start_broker
from khipu.localstack.keeper import read_exits
from khipu.localstack.object_store import (
    ObjectStoreError,
    ObjectStoreSpec,
    client_environment,
    ensure_credentials,
    start_object_store,
)
from khipu.localstack.processes import ProcessTable, child_env, port_open
from khipu.registry.loader import load_registry
from khipu.report.exporter import ExporterConfig
from khipu.settings import KhipuSettings, project_root
from khipu.store import Store

BROKER, AIRFLOW, DEMO, DETECTOR, EXPORTER = "broker", "airflow", "demo", "detector", "exporter"
OBJECT_STORE = "s3proxy"
# stop order: Airflow first, so that its khipu_detector DAG cannot start the detector again meanwhile; the object
# store after everything that may write to it
COMPONENTS = (AIRFLOW, DETECTOR, DEMO, EXPORTER, OBJECT_STORE, BROKER)
AIRFLOW_READY_TIMEOUT_S = 300.0
AIRFLOW_SETTLE_S = 60.0  # after `up` started everything: how long Airflow, healthy before, may take to say so again
DEMO_RATE_PER_S = 2.0
DEMO_FAULTS = (
    "consumer_skip=0.01",
    "processor_drop=0.01",
    "offset_rewind=0.01",
    "producer_retry=0.01",
    "delay=0.02",
    "trace_loss=0.005",
)


class StackError(RuntimeError):
    """The local stack could not be brought up."""


def _paths(settings: KhipuSettings) -> dict[str, Path]:
    state = settings.state_dir
    return {
        "logs": state / "logs",
        "airflow_home": state / "airflow",
        "ledger": state / "demo" / "ledger.jsonl",
        "kafka": state / "kafka",
        "s3proxy": state / "s3proxy",  # its objects (data/), owner-only credentials.json and settings
        "exporter_token": state / "exporter.token",  # drawn by the first `up` unless KHIPU_EXPORTER_TOKEN is set
    }


def broker_spec(settings: KhipuSettings) -> BrokerSpec:
    return BrokerSpec(_paths(settings)["kafka"], settings.broker_port, settings.controller_port)


def object_store_spec(settings: KhipuSettings) -> ObjectStoreSpec:
    """The local stack's object store: S3Proxy on 127.0.0.1:<KHIPU_OBJECT_STORE_PORT>, bucket ``khipu``, under the
    state folder."""
    return ObjectStoreSpec(_paths(settings)["s3proxy"], port=settings.object_store_port)


def data_environment(settings: KhipuSettings, spec: ObjectStoreSpec) -> dict[str, str]:
    """What the stack's processes need to reach Khipu's data: nothing for local folders (the default); for an
    object-store ``KHIPU_DATA_URL`` without an endpoint of its own (``KHIPU_S3_ENDPOINT``), the stack's S3Proxy and
    its credentials (kept owner-only in its folder), so ``KHIPU_DATA_URL=s3a://khipu/<prefix>`` is the one setting
    that moves the local stack's data into it."""
    if settings.data.is_local or settings.s3_endpoint:
        return {}
    return client_environment(spec, ensure_credentials(spec.credentials_path))


def up(settings: KhipuSettings, say: Callable[[str], None] = print) -> None:
    """Start what is not running. Everything the stack writes is its owner's only: the state folder is 0700 and
    every process starts with umask 077 (the store, Airflow's database, the ledgers and archives name every team's
    messages)."""
    os.umask(0o077)
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    settings.state_dir.chmod(0o700)
    paths = _paths(settings)
    exporter_config, exporter_token = _exporter(paths["exporter_token"])  # a bad setting stops `up` before any start
    for written in (_sqlite_file(settings.store_url), paths["ledger"]):  # as an earlier release left them: 0644
        if written is not None:
            tighten(written)
    table = ProcessTable(settings.state_dir)
    registry = load_registry(settings.registry_path)
    topology = DemoTopology.from_stream(registry.stream(DEMO_STREAM))

    if (broker := table.running(BROKER)) is not None:
        say(f"broker: already running (pid {broker.pid}, {broker.detail})")
    else:
        for port, variable in (
            (settings.broker_port, "KHIPU_BROKER_PORT"),
            (settings.controller_port, "KHIPU_BROKER_CONTROLLER_PORT"),
        ):
            _require_free(port, variable)
        spec = broker_spec(settings)
        first_start = not (spec.data_dir / "meta.properties").exists()
        say(f"broker: {'formatting storage and ' if first_start else ''}starting Apache Kafka (KRaft) ...")
        started_at = time.monotonic()
        try:
            process = start_broker(spec, paths["logs"] / "broker.log")
        except BrokerError as exc:
            raise StackError(str(exc)) from None
        table.record(BROKER, process.pid, f"Apache Kafka on {process.bootstrap_servers}, data {spec.data_dir}")
        say(
            f"broker: Apache Kafka on {process.bootstrap_servers} (pid {process.pid}), "
            f"answering after {time.monotonic() - started_at:.1f}s"
        )
    if (running_store := table.running(OBJECT_STORE)) is not None:
        say(f"{OBJECT_STORE}: already running (pid {running_store.pid}, {running_store.detail})")
    else:
        store_spec = object_store_spec(settings)
        if port_open(store_spec.host, store_spec.port):
            raise StackError(
                f"port {store_spec.port} is taken by a process this stack did not start; the object store listens there"
            )
        say(f"{OBJECT_STORE}: starting the S3 API (S3Proxy) ...")
        started_at = time.monotonic()
        try:
            object_store = start_object_store(store_spec, paths["logs"] / f"{OBJECT_STORE}.log")
        except ObjectStoreError as exc:
            raise StackError(str(exc)) from None
        table.record(OBJECT_STORE, object_store.pid, _object_store_detail(store_spec))
        say(
            f"{OBJECT_STORE}: S3 API on {store_spec.endpoint} (pid {object_store.pid}), bucket {store_spec.bucket}, "
            f"answering after {time.monotonic() - started_at:.1f}s"
        )
    try:
        admin = KafkaAdmin(settings.kafka())
        say(f"topics: {admin.ensure_trace_topic(settings.trace_topic, 4)}")
        created = admin.ensure_topics(
            {settings.lost_topic: 1, topology.source_topic.topic: 3, topology.output_topic.topic: 3}
        )
    except KafkaUnavailable as exc:
        raise StackError(str(exc)) from None
    if created:
        say(f"topics: created {', '.join(created)}")

    store = Store(settings.store_url)
    store.migrate()
    store.close()
    say(f"store: {store.safe_url} at the newest schema")

    data_env = data_environment(settings, object_store_spec(settings))
    if data_env:
        say(f"data: {settings.data.url}, in the stack's object store ({data_env['KHIPU_S3_ENDPOINT']})")
    env = child_env({**airflow_env(settings, paths["airflow_home"]), **data_env})
    if (airflow := table.running(AIRFLOW)) is not None:
        say(f"airflow: already running (pid {airflow.pid})")
    else:
        _require_free(settings.airflow_port, "KHIPU_AIRFLOW_PORT")
        say("airflow: migrating the metadata database and registering connections (first time: ~1 min)")
        prepare_airflow(settings, paths["airflow_home"], env, paths["logs"] / "airflow-setup.log")
        started = table.spawn(
            AIRFLOW,
            [str(Path(sys.executable).parent / "airflow"), "standalone"],
            env,
            paths["logs"] / "airflow.log",
            f"standalone on 127.0.0.1:{settings.airflow_port}",
            cwd=project_root(),
        )
        say(f"airflow: started standalone (pid {started.pid}); waiting until healthy")
        _wait_for_airflow(settings, table, paths["logs"] / "airflow.log", say)

    if (demo := table.running(DEMO)) is not None:
        say(f"demo: already running (pid {demo.pid})")
    else:
        argv = [
            str(Path(sys.executable).parent / "khipu"),
            "demo",
            "run",
            "--forever",
            "--rate",
            str(DEMO_RATE_PER_S),
            "--ledger",
            str(paths["ledger"]),
            *[arg for fault in DEMO_FAULTS for arg in ("--fault", fault)],
        ]
        started = table.spawn(
            DEMO,
            argv,
            child_env(settings.as_env()),
            paths["logs"] / "demo.log",
            f"{DEMO_STREAM} at {DEMO_RATE_PER_S:g} msg/s with faults",
            cwd=project_root(),
            keep=True,
        )
        say(f"demo: started the demo pipeline (pid {started.pid}), {DEMO_RATE_PER_S:g} msg/s, ledger {paths['ledger']}")

    if (exporter := table.running(EXPORTER)) is not None:
        say(f"exporter: already running (pid {exporter.pid})")
    else:
        _require_free(exporter_config.port, "KHIPU_EXPORTER_PORT")
        started = table.spawn(
            EXPORTER,
            [str(Path(sys.executable).parent / "khipu"), "exporter"],
            child_env({**settings.as_env(), **data_env, "KHIPU_EXPORTER_TOKEN": exporter_token}),  # never argv
            paths["logs"] / "exporter.log",
            f"Prometheus metrics on {_metrics_url(exporter_config, paths['exporter_token'])}",
            cwd=project_root(),
            keep=True,
        )
        say(f"exporter: started (pid {started.pid}), {_metrics_url(exporter_config, paths['exporter_token'])}")
    say("")
    status(settings, say, settle_s=AIRFLOW_SETTLE_S)


def _object_store_detail(spec: ObjectStoreSpec) -> str:
    return f"S3 API on {spec.endpoint}, bucket {spec.bucket}, data {spec.data_dir}"


def _exporter(token_file: Path) -> tuple[ExporterConfig, str]:
    """The exporter's settings and its token: ``KHIPU_EXPORTER_TOKEN``, else the one `make up` drew into
    ``token_file`` (its figures are every team's: never served without one)."""
    token = os.environ.get("KHIPU_EXPORTER_TOKEN") or ensure_token(token_file)
    return ExporterConfig.from_env({**os.environ, "KHIPU_EXPORTER_TOKEN": token}), token


def _sqlite_file(url: str) -> Path | None:
    """The store's file, when it is SQLite's."""
    parsed = make_url(url)
    return Path(parsed.database) if parsed.get_backend_name() == "sqlite" and parsed.database else None


def _require_free(port: int, variable: str) -> None:
    if port_open("127.0.0.1", port):
        raise StackError(f"port {port} is taken by a process this stack did not start; stop it or set {variable}")


def _metrics_url(config: ExporterConfig, token_file: Path) -> str:
    host = f"[{config.host}]" if ":" in config.host else config.host
    token = "$KHIPU_EXPORTER_TOKEN" if os.environ.get("KHIPU_EXPORTER_TOKEN") else f"in {token_file}"
    return f"http://{host}:{config.port}/metrics (bearer token {token}; every team's figures: admins only)"


def restarts_note(state_dir: Path, name: str) -> str:
    """For a component the keeper restarted: how often, and why it last ended (its own words); else ''."""
    exits = read_exits(state_dir, name)
    if not exits or not exits.get("restarts"):
        return ""
    last = exits.get("last") or {}
    at = time.strftime("%H:%M:%S", time.gmtime(float(last.get("at_s") or 0)))
    return f"\n{'':8} restarted {exits['restarts']}x; last ended {at} UTC, {last.get('reason', 'for no known reason')}"


def _detector_line(settings: KhipuSettings, table: ProcessTable) -> str:
    """The detector: whether its driver runs here, and its newest heartbeat (Airflow starts it, not `up`)."""
    started = table.running(DETECTOR)
    try:
        store = Store(settings.store_url)
        try:
            beat = store.heartbeat.latest(DETECTOR_QUERY)
        finally:
            store.close()
    except Exception:  # a store not migrated yet, or unreachable: the line says so below
        beat = None
    heard = "no heartbeat yet"
    if beat is not None:
        now_ms = time.time_ns() // 1_000_000
        heard = f"last heartbeat {(now_ms - int(beat['at_ms'])) / 1000:.0f}s ago"
        if beat.get("waiting"):  # the detector waits out an outage (khipu.detector.outage)
            since = int(beat.get("waiting_since_ms") or beat["at_ms"])
            heard += f", {(now_ms - since) / 1000:.0f}s {beat['waiting']} ({beat.get('retries') or 0} tries)"
    if started is None:
        return f"{DETECTOR:8} {'stopped':8} {heard}; the DAG khipu_detector (every 2 min) starts it"
    return f"{DETECTOR:8} {'running':8} pid {started.pid}  {started.detail}; {heard}"


def _wait_for_airflow(settings: KhipuSettings, table: ProcessTable, log_path: Path, say: Callable[[str], None]) -> None:
    deadline = time.monotonic() + AIRFLOW_READY_TIMEOUT_S
    next_note = time.monotonic() + 15
    while not airflow_healthy(settings.airflow_port):
        if table.running(AIRFLOW) is None:
            raise StackError(f"airflow standalone exited during start; see {log_path}")
        if time.monotonic() > deadline:
            raise StackError(f"airflow was not healthy within {AIRFLOW_READY_TIMEOUT_S:.0f}s; see {log_path}")
        if time.monotonic() > next_note:
            say("airflow: still starting ...")
            next_note = time.monotonic() + 15
        time.sleep(2)


def down(settings: KhipuSettings, say: Callable[[str], None] = print) -> None:
    table = ProcessTable(settings.state_dir)
    for name in COMPONENTS:
        say(f"{name}: {'stopped' if table.stop(name) else 'not running'}")
    # the detector's connections (credentials) are written anew by the DAG at each start
    (settings.state_dir / "detector" / "connections.json").unlink(missing_ok=True)


def status(settings: KhipuSettings, say: Callable[[str], None] = print, settle_s: float = 0.0) -> bool:
    """Print what runs; return True when every component runs. ``settle_s``: how long a running Airflow that does
    not say it is healthy is asked again before it is reported so (``up`` has just started the demo and the exporter
    beside it: on a busy machine its health answer can be late for a moment)."""
    table = ProcessTable(settings.state_dir)
    paths = _paths(settings)
    all_up = True
    for name in (BROKER, OBJECT_STORE, AIRFLOW, DEMO, EXPORTER):
        started = table.running(name)
        all_up &= started is not None
        say(
            f"{name:8} {'running' if started else 'stopped':8} "
            f"{f'pid {started.pid}  {started.detail}' if started else ''}{restarts_note(settings.state_dir, name)}"
        )
    say(_detector_line(settings, table))
    if table.running(AIRFLOW) is not None:
        settled = time.monotonic() + settle_s
        while not (healthy := airflow_healthy(settings.airflow_port)) and time.monotonic() < settled:
            time.sleep(2)
        say(f"\nAirflow UI: http://127.0.0.1:{settings.airflow_port}  ({'healthy' if healthy else 'not healthy yet'})")
        say(
            f'  the Khipu view: http://127.0.0.1:{settings.airflow_port}/khipu/  (also "Khipu" in the UI\'s navigation)'
        )
        password_file = paths["airflow_home"] / PASSWORDS_FILE
        known = admin_password(paths["airflow_home"]) is not None
        users = ", ".join(f"'{user.name}' ({user.sees})" for user in STACK_USERS)
        say(f"  log in as {users}; each one's generated password is in {password_file}")
        if not known:
            say("  (the passwords are drawn when Airflow is prepared: run `make up`)")
    say(f"Kafka bootstrap: {settings.bootstrap_servers}   trace topic: {settings.trace_topic}")
    spec = object_store_spec(settings)
    say(
        f"object store: {spec.endpoint} (S3 API, path-style), bucket {spec.bucket}; "
        f"its access key and secret key are in {spec.credentials_path}"
    )
    say(f"logs: {paths['logs']}   demo ledger: {paths['ledger']}")
    say(
        "see it work: .venv/bin/khipu verdicts | khipu trace MESSAGE_ID | khipu health | khipu alerts"
        " | khipu demo pause demo-sink-audit"
    )
    return all_up
