"""Hooks: Airflow connections -> Khipu's typed Kafka connections, trace emitter settings, the store.

A Kafka connection (default ``khipu_kafka``; one per cluster, named in the registry as
``clusters.<name>.connection_id``) keeps librdkafka settings in its extra JSON
(``bootstrap.servers``, ``security.protocol``, ``sasl.mechanism``, ...), or host/port for a plain
cluster; its login and password are the SASL credentials (mechanism PLAIN unless the extra names
another). Khipu's own keys in the extra are prefixed ``khipu.``: ``khipu.cluster`` (the cluster's
registry name) and ``khipu.trace_topic``. Credentials are never logged: errors and logs show
:meth:`KafkaConnection.redacted`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook
from sqlalchemy.engine import URL

from khipu.config.store_url import store_url
from khipu.kafka import KafkaConnection
from khipu.kafka.connection import KafkaConnectionError as InvalidKafkaSetting
from khipu.registry.model import Registry
from khipu.store import Store
from khipu.tracing.config import DEFAULT_TRACE_TOPIC, TraceEmitterConfig

_KHIPU_PREFIX = "khipu."


class KafkaConnectionError(ValueError):
    """The Airflow connection does not describe a usable Kafka cluster."""


class KhipuKafkaHook(BaseHook):  # type: ignore[misc]
    conn_name_attr = "kafka_conn_id"
    default_conn_name = "khipu_kafka"
    conn_type = "kafka"
    hook_name = "Khipu Kafka"

    def __init__(self, kafka_conn_id: str = default_conn_name, cluster: str | None = None) -> None:
        super().__init__()
        self.kafka_conn_id = kafka_conn_id
        self._cluster = cluster  # the registry's name for it, when the caller knows it
        self._extra: dict[str, Any] | None = None
        self._connection: KafkaConnection | None = None

    def _load(self) -> tuple[dict[str, Any], KafkaConnection]:
        if self._extra is None or self._connection is None:
            conn = self.get_connection(self.kafka_conn_id)
            extra = dict(conn.extra_dejson or {})
            settings = {k: v for k, v in extra.items() if not k.startswith(_KHIPU_PREFIX)}
            if "bootstrap.servers" not in settings:
                if not conn.host:
                    raise KafkaConnectionError(
                        f"connection {self.kafka_conn_id!r} has no Kafka address: set 'bootstrap.servers' in its "
                        "extra JSON, or its host and port"
                    )
                settings["bootstrap.servers"] = f"{conn.host}:{conn.port or 9092}"
            if conn.login:
                settings.setdefault("sasl.username", conn.login)
            if conn.password:
                settings.setdefault("sasl.password", conn.password)
            if settings.get("sasl.username") and not (
                settings.get("sasl.mechanism") or settings.get("sasl.mechanisms")
            ):
                settings["sasl.mechanism"] = "PLAIN"
            cluster = self._cluster or str(extra.get(f"{_KHIPU_PREFIX}cluster", "local"))
            try:
                connection = KafkaConnection.from_settings(settings, cluster=cluster)
            except InvalidKafkaSetting as exc:
                raise KafkaConnectionError(f"connection {self.kafka_conn_id!r}: {exc}") from None
            self._extra, self._connection = extra, connection
        return self._extra, self._connection

    def connection(self) -> KafkaConnection:
        """The cluster's typed connection settings (credentials inside, masked when printed)."""
        return self._load()[1]

    @property
    def bootstrap_servers(self) -> str:
        return self.connection().bootstrap_servers

    @property
    def cluster(self) -> str:
        return self.connection().cluster

    @property
    def trace_topic(self) -> str:
        return str(self._load()[0].get(f"{_KHIPU_PREFIX}trace_topic", DEFAULT_TRACE_TOPIC))

    def emitter_config(self, location: str) -> TraceEmitterConfig:
        client = self.connection().client_config()
        bootstrap = client.pop("bootstrap.servers")
        return TraceEmitterConfig(
            bootstrap_servers=bootstrap,
            location=location,
            cluster=self.cluster,
            topic=self.trace_topic,
            producer_config=client,
        )


def cluster_connections(registry: Registry) -> dict[str, KafkaConnection]:
    """Every cluster of the registry with the connection its ``connection_id`` names."""
    return {
        name: KhipuKafkaHook(cluster.connection_id, cluster=name).connection()
        for name, cluster in sorted(registry.clusters.items())
    }


class StoreConnectionError(ValueError):
    """The Airflow connection does not describe a usable Khipu store."""


class KhipuStoreHook(BaseHook):  # type: ignore[misc]
    """The Khipu store from an Airflow connection (default ``khipu_store``).

    ``sqlite`` connections name the database file in ``host``; ``postgres`` connections use host,
    port, schema (the database), login and password; any connection may instead give a full
    SQLAlchemy URL in its extra as ``{"url": ...}``.
    """

    conn_name_attr = "store_conn_id"
    default_conn_name = "khipu_store"
    conn_type = "sqlite"
    hook_name = "Khipu store"

    def __init__(self, store_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.store_conn_id = store_conn_id

    def url(self) -> str:
        """The SQLAlchemy URL (contains the password: do not log; ``Store.safe_url`` hides it)."""
        conn = self.get_connection(self.store_conn_id)
        extra = dict(conn.extra_dejson or {})
        if extra.get("url"):
            return str(extra["url"])
        if conn.conn_type == "sqlite":
            if not conn.host:
                raise StoreConnectionError(
                    f"connection {self.store_conn_id!r} (sqlite) needs the database file in host"
                )
            return f"sqlite:///{conn.host}"
        if conn.conn_type in ("postgres", "postgresql"):
            built = URL.create(
                "postgresql",  # the driver is the store's choice (khipu.config.store_url)
                username=conn.login or None,
                password=conn.password or None,
                host=conn.host or None,
                port=conn.port or None,
                database=conn.schema or None,
            ).render_as_string(hide_password=False)
            return store_url(built, Path.cwd())
        raise StoreConnectionError(
            f"connection {self.store_conn_id!r} has type {conn.conn_type!r}; expected sqlite or postgres, "
            'or a SQLAlchemy URL in its extra as {"url": ...}'
        )

    def store(self) -> Store:
        return Store(self.url())
