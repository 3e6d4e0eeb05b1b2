"""Hooks: Airflow connections -> confluent-kafka client settings and trace emitter settings.

A Kafka connection (default ``khipu_kafka``) keeps librdkafka settings in its extra JSON
(``bootstrap.servers``, ``security.protocol``, ...), or host/port for a plain cluster; login and
password become SASL credentials. Khipu's own keys in the extra are prefixed ``khipu.``:
``khipu.cluster`` (the cluster's registry name) and ``khipu.trace_topic``. Credentials are
never logged.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook
from sqlalchemy.engine import URL

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

    def __init__(self, kafka_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.kafka_conn_id = kafka_conn_id
        self._extra: dict[str, Any] | None = None
        self._client: dict[str, Any] | None = None

    def _load(self) -> tuple[dict[str, Any], dict[str, Any]]:
        if self._extra is None or self._client is None:
            conn = self.get_connection(self.kafka_conn_id)
            extra = dict(conn.extra_dejson or {})
            client = {k: v for k, v in extra.items() if not k.startswith(_KHIPU_PREFIX)}
            if "bootstrap.servers" not in client:
                if not conn.host:
                    raise KafkaConnectionError(
                        f"connection {self.kafka_conn_id!r} has no Kafka address: set 'bootstrap.servers' in its "
                        "extra JSON, or its host and port"
                    )
                client["bootstrap.servers"] = f"{conn.host}:{conn.port or 9092}"
            if conn.login:
                client.setdefault("sasl.username", conn.login)
            if conn.password:
                client.setdefault("sasl.password", conn.password)
            self._extra, self._client = extra, client
        return self._extra, self._client

    def client_config(self) -> dict[str, Any]:
        """librdkafka settings for clients of this cluster (contains credentials: do not log)."""
        return dict(self._load()[1])

    @property
    def bootstrap_servers(self) -> str:
        return str(self._load()[1]["bootstrap.servers"])

    @property
    def cluster(self) -> str:
        return str(self._load()[0].get(f"{_KHIPU_PREFIX}cluster", "local"))

    @property
    def trace_topic(self) -> str:
        return str(self._load()[0].get(f"{_KHIPU_PREFIX}trace_topic", DEFAULT_TRACE_TOPIC))

    def emitter_config(self, location: str) -> TraceEmitterConfig:
        client = self.client_config()
        bootstrap = client.pop("bootstrap.servers")
        return TraceEmitterConfig(
            bootstrap_servers=bootstrap,
            location=location,
            cluster=self.cluster,
            topic=self.trace_topic,
            producer_config={k: str(v) for k, v in client.items()},
        )


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
            return URL.create(
                "postgresql+psycopg2",
                username=conn.login or None,
                password=conn.password or None,
                host=conn.host or None,
                port=conn.port or None,
                database=conn.schema or None,
            ).render_as_string(hide_password=False)
        raise StoreConnectionError(
            f"connection {self.store_conn_id!r} has type {conn.conn_type!r}; expected sqlite or postgres, "
            'or a SQLAlchemy URL in its extra as {"url": ...}'
        )

    def store(self) -> Store:
        return Store(self.url())
