"""Runtime settings of Khipu's own processes (CLI, local stack, Airflow tasks), from the environment.

Validated once, at load; loading never connects. Applications that only trace use
:class:`khipu.tracing.TraceEmitterConfig` instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from khipu.errors import InvalidSetting
from khipu.kafka.connection import KafkaConnection
from khipu.trace.names import NAME_PATTERN, NAME_RULE
from khipu.tracing.config import DEFAULT_TRACE_TOPIC

DEFAULT_LOST_TOPIC = "khipu.lost"


class SettingsError(InvalidSetting):
    """An environment setting is invalid; names the variable, the value and what is allowed."""

    kind = "environment setting"


def project_root() -> Path:
    """The checkout this package is installed from (editable install: include/khipu -> ../..)."""
    return Path(__file__).resolve().parents[2]


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

    @property
    def archive_dir(self) -> Path:
        """The raw-trace archive the detector writes and reconciliation, the view and ``khipu trace`` read."""
        return self.state_dir / "archive"

    @property
    def verdict_archive_dir(self) -> Path:
        """The verdict archive (plain first-time DELIVERED verdicts, Parquet by hour, with its index): the
        detector writes it; reconciliation, the view, ``khipu trace`` / ``history`` and the resend task read it.
        A directory of its own, beside the trace archive: Spark reads the trace archive's root as one dataset."""
        return self.state_dir / "verdicts"

    def kafka(self, environ: Mapping[str, str] | None = None) -> KafkaConnection:
        """The trace cluster's connection: bootstrap and cluster name from these settings, credentials
        (``KHIPU_KAFKA_*``) from the environment."""
        env = dict(os.environ if environ is None else environ)
        env.update(KHIPU_BOOTSTRAP_SERVERS=self.bootstrap_servers, KHIPU_CLUSTER=self.cluster)
        return KafkaConnection.from_env(env)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KhipuSettings:
        env = os.environ if environ is None else environ
        root = project_root()
        broker_port = _port(env, "KHIPU_BROKER_PORT", 9092)
        bootstrap = env.get("KHIPU_BOOTSTRAP_SERVERS", f"127.0.0.1:{broker_port}")
        if not bootstrap.strip():
            raise SettingsError("KHIPU_BOOTSTRAP_SERVERS", bootstrap, "'host:port[,host:port...]'")
        for variable, value in (
            ("KHIPU_CLUSTER", env.get("KHIPU_CLUSTER", "local")),
            ("KHIPU_TRACE_TOPIC", env.get("KHIPU_TRACE_TOPIC", DEFAULT_TRACE_TOPIC)),
        ):
            if not NAME_PATTERN.match(value):
                raise SettingsError(variable, value, NAME_RULE)
        state_dir = Path(env.get("KHIPU_STATE_DIR", root / ".khipu"))
        controller_port = _port(env, "KHIPU_BROKER_CONTROLLER_PORT", broker_port + 1 if broker_port < 65535 else 9093)
        if controller_port == broker_port:
            raise SettingsError(
                "KHIPU_BROKER_CONTROLLER_PORT", str(controller_port), "a port other than KHIPU_BROKER_PORT"
            )
        lost_topic = env.get("KHIPU_LOST_TOPIC", DEFAULT_LOST_TOPIC)
        if not NAME_PATTERN.match(lost_topic):
            raise SettingsError("KHIPU_LOST_TOPIC", lost_topic, NAME_RULE)
        return cls(
            bootstrap_servers=bootstrap,
            cluster=env.get("KHIPU_CLUSTER", "local"),
            trace_topic=env.get("KHIPU_TRACE_TOPIC", DEFAULT_TRACE_TOPIC),
            registry_path=Path(env.get("KHIPU_REGISTRY", root / "config" / "registry.yaml")),
            state_dir=state_dir,
            broker_port=broker_port,
            airflow_port=_port(env, "KHIPU_AIRFLOW_PORT", 8080),
            store_url=env.get("KHIPU_STORE_URL", f"sqlite:///{state_dir / 'khipu.db'}"),
            controller_port=controller_port,
            lost_topic=lost_topic,
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
        }


def _port(env: Mapping[str, str], variable: str, default: int) -> int:
    raw = env.get(variable, str(default))
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise SettingsError(variable, raw, "a TCP port number in [1, 65535]")
    return int(raw)
