"""Runtime settings of Khipu's own processes (CLI, local stack, Airflow tasks), a view of the settings model.

Every variable is declared once, in :mod:`khipu.config.model`; :meth:`KhipuSettings.from_env` loads the
section it needs. Validated once, at load; loading never connects. Applications that only trace use
:class:`khipu.tracing.TraceEmitterConfig` instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from khipu.config import KhipuSection, SettingsError, default, load, project_root
from khipu.kafka.connection import KafkaConnection
from khipu.storage.location import Location

DEFAULT_LOST_TOPIC: str = default(KhipuSection, "lost_topic")

__all__ = ["DEFAULT_LOST_TOPIC", "KhipuSettings", "SettingsError", "project_root"]


@dataclass(frozen=True, slots=True)
class KhipuSettings:
    bootstrap_servers: str
    cluster: str
    trace_topic: str
    registry_path: Path
    state_dir: Path
    broker_port: int
    airflow_port: int
    store_url: str = field(repr=False)  # may hold a password
    controller_port: int = 9093
    lost_topic: str = DEFAULT_LOST_TOPIC
    object_store_port: int = 9000  # the local stack's S3Proxy
    data_url: str = ""  # KHIPU_DATA_URL: where the archives and the checkpoint live ("": the state folder)
    s3_endpoint: str = ""  # KHIPU_S3_ENDPOINT: an S3 API other than AWS's

    @property
    def data(self) -> Location:
        """Where the archives and the detector's checkpoint live: a local folder or an object-store prefix."""
        return Location.of(self.data_url or self.state_dir.absolute(), "KHIPU_DATA_URL")

    @property
    def archive_dir(self) -> Location:
        """The raw-trace archive the detector writes and reconciliation, the view and ``khipu trace`` read."""
        return self.data / "archive"

    @property
    def verdict_archive_dir(self) -> Location:
        """The verdict archive (plain first-time DELIVERED verdicts, Parquet by hour): the detector writes it;
        reconciliation, the view, ``khipu trace`` / ``history`` and the resend task read it. A folder of its
        own, beside the trace archive: Spark reads the trace archive's root as one dataset."""
        return self.data / "verdicts"

    @property
    def checkpoint_dir(self) -> Location:
        """The detector's Spark checkpoint (its offsets, state, epoch and driver record)."""
        return self.data / "detector" / "checkpoint"

    def kafka(self, environ: Mapping[str, str] | None = None) -> KafkaConnection:
        """The trace cluster's connection: bootstrap and cluster name from these settings, credentials
        (``KHIPU_KAFKA_*``) from the environment and the settings file."""
        return KafkaConnection.from_env(environ, bootstrap_servers=self.bootstrap_servers, cluster=self.cluster)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KhipuSettings:
        """From the environment (``os.environ`` unless given) and the settings file; a bad value raises
        :class:`SettingsError` naming its variable."""
        section = load(KhipuSection, environ, SettingsError)
        assert section.bootstrap_servers and section.store_url and section.controller_port  # derived at load
        return cls(
            bootstrap_servers=section.bootstrap_servers,
            cluster=section.cluster,
            trace_topic=section.trace_topic,
            registry_path=section.registry_path,
            state_dir=section.state_dir,
            broker_port=section.broker_port,
            airflow_port=section.airflow_port,
            store_url=section.store_url,
            controller_port=section.controller_port,
            lost_topic=section.lost_topic,
            object_store_port=section.object_store_port,
            data_url=section.data_url or "",
            s3_endpoint=section.s3_endpoint or "",
        )

    def as_env(self) -> dict[str, str]:
        """The environment that gives the same settings to a child process."""
        return {
            "KHIPU_BOOTSTRAP_SERVERS": self.bootstrap_servers,
            "KHIPU_CLUSTER": self.cluster,
            "KHIPU_TRACE_TOPIC": self.trace_topic,
            "KHIPU_REGISTRY": str(self.registry_path),
            "KHIPU_STATE_DIR": str(self.state_dir),
            "KHIPU_BROKER_PORT": str(self.broker_port),
            "KHIPU_AIRFLOW_PORT": str(self.airflow_port),
            "KHIPU_STORE_URL": self.store_url,
            "KHIPU_BROKER_CONTROLLER_PORT": str(self.controller_port),
            "KHIPU_LOST_TOPIC": self.lost_topic,
            "KHIPU_OBJECT_STORE_PORT": str(self.object_store_port),
            "KHIPU_DATA_URL": self.data.url,
            **({"KHIPU_S3_ENDPOINT": self.s3_endpoint} if self.s3_endpoint else {}),
        }
