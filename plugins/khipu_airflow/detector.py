"""The detector DAG's tasks: judge the detector, raise or resolve the detector-down alert, restart it.

Submitting returns once the driver is up, through ``SparkSubmitHook``'s public API only
(:mod:`khipu_airflow.spark_submit`). In local or client deploy mode (the local stack's
``spark_default``: ``local[*]``) the hook's ``submit()`` runs detached in a process group of its own
with spark-submit and the driver, recorded with its pid and start time in the state folder's process
table (``<state>/run/detector.json``, :mod:`khipu.process_group`, as ``khipu up`` records its own
processes); a recorded process is only ever signalled while its start time still matches. In cluster
deploy mode ``spark-submit`` returns once the cluster has the application (``waitAppCompletion=false``),
and the heartbeat alone tells how it is doing.

Its size (buckets, shuffle partitions, driver and executor memory and cores) comes from the run's Params,
else the Spark connection's extra ``khipu.detector`` (:mod:`khipu.detector.sizing`); a count the checkpoint
keeps is checked against it before anything is stopped or submitted.

No secret goes on the ``spark-submit`` command line: the clusters' connections and the store URL
are written to a connections file only this user can read, and its path is the argument.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk.exceptions import AirflowFailException

from khipu.alerting.decide import DETECTOR_ALERT_KIND, detector_alert
from khipu.alerting.model import AlertState, alert_from
from khipu.alerting.trail import check_trail
from khipu.detector.checkpoint import checkpoint_sizing, query_checkpoint
from khipu.detector.driver import read_driver_record, stop_driver
from khipu.detector.launch import connector_jars, throughput_settings, write_connections_file
from khipu.detector.model import DETECTOR_QUERY
from khipu.detector.sizing import DetectorSizing, SparkResources, detector_sizing
from khipu.detector.supervise import DetectorObservation, DetectorState, SupervisionConfig, judge_detector
from khipu.errors import InvalidSetting
from khipu.health.evaluate import health_config_from_env
from khipu.kafka import KafkaAdmin
from khipu.process_group import ProcessTable, Started
from khipu.registry.loader import load_registry
from khipu.settings import KhipuSettings, project_root
from khipu.storage.location import Location
from khipu.storage.spark import hadoop_settings
from khipu_airflow.hooks import KhipuKafkaHook, KhipuStoreHook, cluster_connections
from khipu_airflow.spark_submit import SparkTarget, sizing_values, spark_target, submit_detached

log = logging.getLogger(__name__)
DETECTOR = "detector"
UP_TIMEOUT_S = 180.0
_WAIT_APP_COMPLETION = (
    "spark.yarn.submit.waitAppCompletion",
    "spark.standalone.submit.waitAppCompletion",
    "spark.kubernetes.submission.waitAppCompletion",
)


class DetectorLaunchError(RuntimeError):
    """The detector could not be submitted, or its driver did not come up."""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def detector_dir() -> Path:
    return KhipuSettings.from_env().state_dir / "detector"


def checkpoint_dir() -> Location:
    """The detector's checkpoint (``<KHIPU_DATA_URL>/detector/checkpoint``: a local folder or an object store,
    where the driver also records itself, so this reads it from any host)."""
    return KhipuSettings.from_env().checkpoint_dir


def application() -> str:
    return str(project_root() / "spark" / "detector.py")


def driver_log_config() -> Path:
    """Log4j2 settings of the driver: Spark's warnings, without one state-server line per new message."""
    return project_root() / "spark" / "log4j2.properties"


def _process_table() -> ProcessTable:
    return ProcessTable(KhipuSettings.from_env().state_dir)


def _submission_file() -> Path:
    return detector_dir() / "submitted.json"


# -- judging -------------------------------------------------------------------------------------------


def observe(store_conn_id: str) -> DetectorObservation:
    """The newest heartbeat; whether the driver runs (None: on a cluster, not visible here); when it was submitted.

    The driver counts as running when the spark-submit this DAG started still runs, or when the
    driver's own record names a live process on this host (a detector started by hand counts too:
    never start a second one on the same checkpoint).
    """
    store = KhipuStoreHook(store_conn_id).store()
    try:
        beat = store.heartbeat.latest(DETECTOR_QUERY)
    finally:
        store.close()
    # its last sign of life: the end of its newest batch (a batch's heartbeat is stamped with its start)
    last_beat = int(beat["at_ms"]) + int(beat["batch_duration_ms"] or 0) if beat else None
    submitted = _process_table().running(DETECTOR)
    if submitted is not None:
        return DetectorObservation(last_beat, True, int(submitted.create_time * 1000))
    driver = read_driver_record(checkpoint_dir())
    if driver is not None and driver.alive() is not False:
        return DetectorObservation(last_beat, driver.alive(), driver.started_ms)
    record = _submission()
    if record.get("deploy_mode") == "cluster":
        return DetectorObservation(last_beat, None, int(record["submitted_ms"]))
    return DetectorObservation(last_beat, False, int(record["submitted_ms"]) if record else None)


def _submission() -> dict[str, Any]:
    try:
        record = json.loads(_submission_file().read_text())
        return record if isinstance(record, dict) and "submitted_ms" in record else {}
    except (OSError, ValueError):
        return {}


def check_detector(store_conn_id: str) -> dict[str, Any]:
    """Judge the detector; record the detector-down alert (or its resolve) when its state calls for one."""
    now = _now_ms()
    health = judge_detector(observe(store_conn_id), now, SupervisionConfig.from_env())
    log.info("detector %s: %s", health.state.value, health.reason)
    store = KhipuStoreHook(store_conn_id).store()
    try:
        last = store.alerts.latest(DETECTOR_ALERT_KIND)
        firing = last is not None and alert_from(last).state is AlertState.FIRING
        alert = detector_alert(health, firing, now)
        if alert is not None and store.alerts.add(alert):
            log.warning("detector alert raised: %s", alert.title)
    finally:
        store.close()
    restart = health.state.needs_restart
    if restart and health.state is DetectorState.HUNG and _submission().get("deploy_mode") == "cluster":
        raise DetectorLaunchError(
            f"the detector on the cluster is hung ({health.reason}); stop its application through the cluster "
            "manager: submitting a second one on the same checkpoint is not safe"
        )
    return {"state": health.state.value, "reason": health.reason, "restart": restart}


def check_trace_trail(kafka_conn_id: str, store_conn_id: str) -> dict[str, Any]:
    """How far the detector trails the trace topic against the topic's retention, asked of the broker now
    (:func:`khipu.alerting.trail.check_trail`): the trace_trail alert before retention can outrun it (or its
    resolve), and a trace_skip alert for what a batch skipped. Judged whether the detector runs or not."""
    kafka = KhipuKafkaHook(kafka_conn_id)
    admin = KafkaAdmin(kafka.connection(), timeout_s=10)
    store = KhipuStoreHook(store_conn_id).store()
    try:
        checked = check_trail(
            store, admin, DETECTOR_QUERY, kafka.trace_topic, health_config_from_env().expiry_margin_ms, _now_ms()
        )
    finally:
        store.close()
    log.info("detector trails %s: %s, %s records behind, %s s behind; %d alerts raised", kafka.trace_topic,
             checked.status, checked.records_behind, checked.seconds_behind, checked.alerts)  # fmt: skip
    return asdict(checked)


# -- restarting ------------------------------------------------------------------------------------------


def stop_detector() -> str:
    """Stop the local driver: the spark-submit process group this DAG started, or else the process the
    driver's record names on this host (only while its start time matches)."""
    submitted = _process_table().running(DETECTOR)
    if submitted is not None:
        _process_table().stop(DETECTOR, timeout_s=30)
        return f"stopped spark-submit process group {submitted.pid}"
    driver = read_driver_record(checkpoint_dir())
    if driver is None:
        return "no driver recorded"
    return stop_driver(driver)


def application_args(kafka_conn_id: str, store_conn_id: str, buckets: int, shuffle_partitions: int) -> list[str]:
    """spark/detector.py's arguments: paths, names and counts only. The connections go to the owner-only file."""
    settings = KhipuSettings.from_env()
    kafka = KhipuKafkaHook(kafka_conn_id)
    trace = kafka.connection()
    registry = load_registry(settings.registry_path)
    clusters = cluster_connections(registry)
    connections = write_connections_file(
        detector_dir() / "connections.json", trace, clusters, KhipuStoreHook(store_conn_id).url()
    )
    return [
        "--registry",
        str(settings.registry_path),
        "--connections-file",
        str(connections),
        "--trace-topic",
        kafka.trace_topic,
        "--lost-topic",
        settings.lost_topic,
        "--checkpoint",
        checkpoint_dir().url,
        "--archive",
        settings.archive_dir.url,
        "--verdict-archive",
        settings.verdict_archive_dir.url,
        "--buckets",
        str(buckets),
        "--shuffle-partitions",
        str(shuffle_partitions),
    ]


def sizing(target: SparkTarget, params: Mapping[str, object]) -> DetectorSizing:
    """The detector's size: the run's Params, else the Spark connection's extra ``khipu.detector``."""
    return detector_sizing(
        sizing_values(params, detector=True),
        target.sizing_extra("detector"),
        "the run's Params",
        f"{target.conn_id}'s extra khipu.detector",
    )


def hook_arguments(target: SparkTarget, args: list[str], resources: SparkResources) -> dict[str, Any]:
    """``SparkSubmitHook``'s keyword arguments for the detector: its public constructor's, nothing else."""
    conf = {"spark.ui.enabled": "false", **hadoop_settings(os.environ)}  # where the object store is: no secret
    conf |= throughput_settings(target.master, f"-Dlog4j2.configurationFile=file:{driver_log_config()}")
    if target.cluster_mode:
        conf |= dict.fromkeys(_WAIT_APP_COMPLETION, "false")
    return {
        "conn_id": target.conn_id,
        "conf": conf,
        "jars": ",".join(str(jar) for jar in connector_jars()),
        "name": "khipu-detector",
        "application_args": args,
        **resources.hook_arguments(),
    }


def restart_detector(
    kafka_conn_id: str, store_conn_id: str, spark_conn_id: str, params: Mapping[str, object] | None = None
) -> dict[str, Any]:
    """Stop what is left of the old driver, submit the detector again, return once the new driver is up.

    Its size is checked first (``params``: the run's Params): a bad value, or another bucket count or shuffle
    partitions than the checkpoint keeps, is refused before anything is stopped."""
    target = spark_target(spark_conn_id)
    try:
        asked = sizing(target, params or {})
        buckets, partitions = asked.settled(checkpoint_sizing(query_checkpoint(checkpoint_dir())))
    except InvalidSetting as exc:  # no retry makes it right
        raise AirflowFailException(f"the detector is not restarted: {exc}") from None
    stopped = stop_detector()
    log.info("old detector: %s", stopped)
    args = application_args(kafka_conn_id, store_conn_id, buckets, partitions)
    arguments = hook_arguments(target, args, asked.resources)
    size = {"buckets": buckets, "shuffle_partitions": partitions, **asked.resources.hook_arguments()}
    if target.cluster_mode:
        record = {"deploy_mode": "cluster", "submitted_ms": _now_ms()}
        SparkSubmitHook(**arguments).submit(application())  # returns once the cluster accepted it
        _submission_file().write_text(json.dumps(record))
        return {"stopped": stopped, **record, **size}
    started = launch_local(target, arguments)
    return {"stopped": stopped, "deploy_mode": target.deploy_mode or "client", "pid": started.pid, **size}


def launch_local(target: SparkTarget, arguments: Mapping[str, Any], up_timeout_s: float = UP_TIMEOUT_S) -> Started:
    """Run the hook's ``submit()`` detached (own process group, log in <state>/logs/detector.log); wait until the
    driver has started its queries and written its driver file, so the caller knows it is up."""
    settings = KhipuSettings.from_env()
    log_path = settings.state_dir / "logs" / "detector.log"
    launched_ms = _now_ms()
    _submission_file().parent.mkdir(parents=True, exist_ok=True)
    _submission_file().write_text(json.dumps({"deploy_mode": "client", "submitted_ms": launched_ms}))
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    started = submit_detached(
        _process_table(), DETECTOR, target, arguments, application(), detector_dir() / "submit.json", log_path,
        env, project_root(),
    )  # fmt: skip
    deadline = time.monotonic() + up_timeout_s
    while time.monotonic() < deadline:
        if not started.alive():
            raise DetectorLaunchError(
                f"the detector exited during start; last lines of {log_path}:\n" + _tail(log_path, 30)
            )
        driver = read_driver_record(checkpoint_dir())
        if driver is not None and driver.started_ms >= launched_ms:
            log.info("detector driver up: pid %d (process group %d), log %s", driver.pid, started.pid, log_path)
            return started
        time.sleep(0.5)
    raise DetectorLaunchError(f"the detector driver did not come up within {up_timeout_s:.0f}s; see {log_path}")


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
