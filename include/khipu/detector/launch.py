"""What starts a detector or a reconciliation driver needs, without Spark: the connections file its secrets travel
in, the jars of Spark's Kafka connector, and where a directly started driver listens.

Secrets (SASL passwords, the store's password) never travel on a command line: a supervisor
writes them to a connections file only its user can read (:func:`write_connections_file`) and
passes its path. Nothing here imports pyspark, so the Airflow plugins that start drivers do not load it.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from khipu.errors import InvalidSetting
from khipu.files import write_owner_only
from khipu.kafka import KafkaConnection
from khipu.settings import project_root
from khipu.storage.location import Location

CONNECTOR_JARS = project_root() / ".jvm" / "spark-kafka"


class DetectorJobError(InvalidSetting):
    kind = "detector job setting"


def connector_jars(directory: Path = CONNECTOR_JARS) -> list[Path]:
    """The jars of Spark's Kafka connector and its dependencies, installed by `make install`."""
    jars = sorted(directory.glob("*.jar"))
    if not any(jar.name.startswith("spark-sql-kafka-0-10") for jar in jars):
        raise DetectorJobError(
            "connector jars", str(directory), "spark-sql-kafka-0-10 and its dependencies there; run `make install`"
        )
    return jars


def driver_settings(master: str) -> dict[str, str]:
    """Where a directly started driver listens. With ``local[*]`` or a cluster on this machine, on 127.0.0.1
    only (its RPC, block manager and web UI: nothing reachable from elsewhere); with a cluster elsewhere the
    executors must reach the driver, so Spark's own choice (``spark.driver.host``/``SPARK_LOCAL_IP``) stands.
    The web UI follows ``SPARK_LOCAL_IP``, so that is set too, unless the environment already sets it."""
    host = master.removeprefix("spark://").split(":")[0]
    if not (master.startswith("local") or host in ("127.0.0.1", "localhost")):
        return {}
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}


# The JVM's garbage collector: the parallel (throughput) collector. A micro-batch allocates much and briefly, and on
# two CPUs shared with its Python workers G1's concurrent threads and barriers made the detector read a backlog
# 12-14 % slower (docs/detector.md, "The JVM's settings"); a pause of the parallel collector delays a batch, which a
# micro-batch detector absorbs. It replaces any spark.driver.extraJavaOptions of spark-defaults.conf.
GC_OPTION = "-XX:+UseParallelGC"


def throughput_settings(master: str, *driver_java_options: str) -> dict[str, str]:
    """The Spark settings the detector runs with, besides its own options: the parallel collector in the driver
    (after ``driver_java_options``) and the executors, and with every task on this machine (``local``), shuffle
    blocks uncompressed: they never leave it, and compressing them only costs CPU."""
    settings = {
        "spark.driver.extraJavaOptions": " ".join((*driver_java_options, GC_OPTION)),
        "spark.executor.extraJavaOptions": GC_OPTION,
    }
    if master.startswith("local"):
        settings |= {"spark.shuffle.compress": "false", "spark.shuffle.spill.compress": "false"}
    return settings


def write_connections_file(
    path: Path, trace: KafkaConnection, clusters: Mapping[str, KafkaConnection], store_url: str
) -> Path:
    """Write the detector's connections (credentials included) to ``path``, mode 0600, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "trace": trace.to_json(),
        "clusters": {name: connection.to_json() for name, connection in sorted(clusters.items())},
        "store_url": store_url,
    }
    write_owner_only(path, json.dumps(body))
    return path


def read_connections_file(path: Path) -> tuple[KafkaConnection, dict[str, KafkaConnection], str]:
    """(trace connection, connection per cluster, store URL); refuses a file others can read."""
    try:
        mode = path.stat().st_mode
        data: dict[str, Any] = json.loads(path.read_text())
    except OSError as exc:
        raise DetectorJobError("connections file", str(path), f"a readable file ({exc.strerror})") from None
    except ValueError:
        raise DetectorJobError("connections file", str(path), "JSON written by write_connections_file") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise DetectorJobError(
            "connections file", f"{path} (mode {stat.filemode(mode)})", "readable by its owner only (chmod 600)"
        )
    try:
        trace = KafkaConnection.from_json(data["trace"])
        clusters = {name: KafkaConnection.from_json(body) for name, body in dict(data.get("clusters", {})).items()}
        return trace, clusters, str(data["store_url"])
    except (KeyError, TypeError):
        raise DetectorJobError(
            "connections file", str(path), '{"trace": ..., "clusters": {...}, "store_url": ...}'
        ) from None


def runs_on_one_host(master: str) -> bool:
    """Whether every executor of a Spark master runs in the driver's process (``local``, ``local[...]``)."""
    return master == "local" or master.startswith("local[")


def check_deployment(master: str, store_url: str, locations: Mapping[str, Location]) -> None:
    """Refuse, before anything starts, a set-up whose executors would reach for what only the driver's host has:
    with a master whose executors run elsewhere (``spark://``, ``yarn``, ``k8s://``), an SQLite store (a file on
    the driver's disk: executors on another host would find no store and decide nothing) or a local folder for
    an archive or the checkpoint. Then every location must answer (an object store that cannot be listed, a
    bucket that does not exist). DetectorJobError names the setting, its value and what is expected."""
    if not runs_on_one_host(master):
        if store_url.startswith("sqlite"):
            raise DetectorJobError(
                "store", f"SQLite with master {master}",
                "PostgreSQL (KHIPU_STORE_URL=postgresql://...) when executors run off the driver's host: an SQLite "
                "file is on the driver's disk only; or a local[...] master",
            )  # fmt: skip
        for setting, location in locations.items():
            if location.is_local:
                raise DetectorJobError(
                    setting, f"{location.spark_url} with master {master}",
                    "an object store URL every host reaches (KHIPU_DATA_URL=s3a://bucket/prefix): a local folder "
                    "is on the driver's disk only; or a local[...] master",
                )  # fmt: skip
    for setting, location in locations.items():
        location.check_reachable(setting)
