"""spark-submit through ``SparkSubmitHook``'s public API only: the Spark connection read as the hook reads it, and a
detached submit for a driver that must outlive the Airflow task that starts it.

:func:`spark_target` reads the Airflow connection (``BaseHook.get_connection``) for the master and deploy mode, by
the hook's own rule, so that a caller can choose settings by them before it builds the hook; the connection's extra
also keeps a job's sizing under ``khipu.<job>`` (:meth:`SparkTarget.sizing_extra`).

:func:`submit_detached` runs ``python -m khipu_airflow.spark_submit SPEC`` in a process group of its own, recorded in
a :class:`khipu.process_group.ProcessTable`: that process builds the hook from SPEC (its constructor's keyword
arguments and the application, in an owner-only file) and calls ``submit()``, which runs spark-submit and passes its
output on to the log. The connection reaches it in its environment (``AIRFLOW_CONN_<ID>``, which Airflow's
environment-variables secrets backend reads; a process's environment is readable by its user only), since a process
outside the task cannot ask Airflow for it. Stopping the group stops spark-submit and its driver with it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from airflow.sdk import BaseHook, Param
from airflow.sdk.exceptions import AirflowNotFoundException

from khipu.detector.sizing import FIXED, MAX_BUCKETS, MEMORY_PATTERN, RESOURCES, SizingError
from khipu.files import write_owner_only
from khipu.process_group import ProcessTable, Started

PLUGINS_FOLDER = Path(__file__).resolve().parents[1]  # what `python -m khipu_airflow...` needs on its path
SIZING_EXAMPLE = '{"executor_memory": "4g", "executor_cores": 2}'


@dataclass(frozen=True, slots=True)
class SparkTarget:
    """Where a Spark connection submits: its master, its deploy mode (None: spark-submit's, client), its extra."""

    conn_id: str
    master: str
    deploy_mode: str | None
    extra: Mapping[str, Any] = field(default_factory=dict)
    connection_json: str | None = field(default=None, repr=False)  # may hold a password

    @property
    def cluster_mode(self) -> bool:
        return self.deploy_mode == "cluster"

    def sizing_extra(self, job: str) -> Mapping[str, object]:
        """The extra's ``khipu.<job>``: a JSON object of that job's sizing settings (none when absent)."""
        found = self.extra.get(f"khipu.{job}", {})
        if not isinstance(found, dict):
            raise SizingError(f"khipu.{job} ({self.conn_id}'s extra)", found, f"a JSON object: {SIZING_EXAMPLE}")
        return found


def spark_target(conn_id: str) -> SparkTarget:
    """The Spark connection as ``SparkSubmitHook`` resolves it: a ``spark`` connection's host is the master URL
    (``local[*]``, ``spark://h:7077``, ``yarn``, ``k8s://https://h``; a port appended when set), another type names
    the scheme (``spark://`` + host); ``deploy-mode`` comes from the extra. Without the connection the hook submits
    to ``yarn`` in spark-submit's default mode, and so does this."""
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return SparkTarget(conn_id, "yarn", None)
    if conn.conn_type == "spark" and conn.host and ("://" in conn.host or not conn.port):
        master = str(conn.host)
    else:
        master = f"{conn.conn_type}://{conn.host or ''}"
    if conn.port:
        master = f"{master}:{conn.port}"
    extra = dict(conn.extra_dejson or {})
    return SparkTarget(conn_id, master, extra.get("deploy-mode"), extra, conn.as_json())


def resource_params() -> dict[str, Param]:
    """The Params of spark-submit's resources. Each is null (unset) by default: then the Spark connection's extra
    ``khipu.<job>`` decides, else Spark's own default."""
    memory: dict[str, Any] = {"type": ["null", "string"], "pattern": MEMORY_PATTERN}
    count: dict[str, Any] = {"type": ["null", "integer"], "minimum": 1}
    unset = "null: the Spark connection's extra khipu.<job>, else Spark's default"
    return {
        "driver_memory": Param(None, **memory, description=f"spark-submit --driver-memory (512m, 4g); {unset}"),
        "executor_memory": Param(None, **memory, description=f"spark-submit --executor-memory (512m, 4g); {unset}"),
        "executor_cores": Param(None, **count, description=f"spark-submit --executor-cores; {unset}"),
        "total_executor_cores": Param(
            None, **count, description=f"spark-submit --total-executor-cores (standalone); {unset}"
        ),
        "num_executors": Param(None, **count, description=f"spark-submit --num-executors (YARN, Kubernetes); {unset}"),
    }


def detector_params() -> dict[str, Param]:
    """The detector's Params: the counts its checkpoint keeps, then spark-submit's resources."""
    unset = "null: the Spark connection's extra khipu.detector, else the checkpoint's"
    return {
        "buckets": Param(
            None, type=["null", "integer"], minimum=1, maximum=MAX_BUCKETS,
            description=f"hash buckets of message ids the state is kept in, fixed for a checkpoint; {unset} (32 new)",
        ),
        "shuffle_partitions": Param(
            None, type=["null", "integer"], minimum=1,
            description=f"partitions of the detector's shuffle, fixed for a checkpoint; {unset} (4 new)",
        ),
        **resource_params(),
    }  # fmt: skip


def sizing_values(params: Mapping[str, object], detector: bool) -> dict[str, object]:
    """The run's Params that size the job (a DAG's other Params, a window or a dry run, left out)."""
    names = (*FIXED, *RESOURCES) if detector else RESOURCES
    return {name: params[name] for name in names if name in params}


def submit_detached(
    table: ProcessTable,
    name: str,
    target: SparkTarget,
    hook_arguments: Mapping[str, Any],
    application: str,
    spec_path: Path,
    log_path: Path,
    env: Mapping[str, str],
    cwd: Path,
) -> Started:
    """Start ``SparkSubmitHook(**hook_arguments).submit(application)`` in a process group of its own, recorded in
    ``table`` as ``name``, its output (spark-submit's) appended to ``log_path``."""
    write_owner_only(spec_path, json.dumps({"application": application, "hook": dict(hook_arguments)}))
    child_env = dict(env)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PLUGINS_FOLDER), env.get("PYTHONPATH", "")) if p)
    if target.connection_json is not None:
        child_env[f"AIRFLOW_CONN_{target.conn_id.upper()}"] = target.connection_json
    argv = [sys.executable, "-m", "khipu_airflow.spark_submit", str(spec_path)]
    return table.spawn(name, argv, child_env, log_path, f"spark-submit {application}, log {log_path}", cwd=cwd)


def _carry_on(signum: int, frame: FrameType | None) -> None:
    """SIGTERM reaches the whole group: spark-submit and its driver end, submit() returns, and so does this process,
    having passed their last lines on to the log."""


def main(argv: list[str] | None = None) -> int:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    spec_path = Path((sys.argv[1:] if argv is None else argv)[0])
    spec: dict[str, Any] = json.loads(spec_path.read_text())
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s", force=True)
    signal.signal(signal.SIGTERM, _carry_on)
    hook = SparkSubmitHook(**spec["hook"])
    try:
        hook.submit(str(spec["application"]))
    except Exception as exc:  # the hook's AirflowException: spark-submit's status and its last lines
        print(f"spark-submit ended in failure: {exc}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
