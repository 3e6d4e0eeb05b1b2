"""The Kafka hook turns an Airflow connection into Khipu's typed connection, keeping secrets out of sight."""

from __future__ import annotations

import json

import pytest

from khipu.registry.model import Cluster, Registry
from khipu_airflow.hooks import KafkaConnectionError, KhipuKafkaHook, cluster_connections


def use_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, body: dict[str, object]) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(body))


def test_extra_holds_the_client_settings_and_khipu_keys_stay_out_of_them(monkeypatch: pytest.MonkeyPatch) -> None:
    use_connection(
        monkeypatch,
        "k1",
        {
            "conn_type": "kafka",
            "extra": {
                "bootstrap.servers": "b1:9092,b2:9092",
                "security.protocol": "SSL",
                "client.id": "khipu",
                "khipu.cluster": "east",
                "khipu.trace_topic": "east.traces",
            },
        },
    )
    hook = KhipuKafkaHook("k1")
    assert hook.connection().client_config() == {
        "bootstrap.servers": "b1:9092,b2:9092",
        "security.protocol": "SSL",
        "client.id": "khipu",
    }
    assert (hook.cluster, hook.trace_topic) == ("east", "east.traces")


def test_login_and_password_are_the_sasl_credentials_shown_nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    use_connection(
        monkeypatch,
        "k2",
        {
            "conn_type": "kafka",
            "host": "kafka.internal",
            "port": 9093,
            "login": "svc",
            "password": "s3cret",
            "extra": {"security.protocol": "SASL_SSL"},
        },
    )
    hook = KhipuKafkaHook("k2")
    connection = hook.connection()
    assert connection.client_config() == {
        "bootstrap.servers": "kafka.internal:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "svc",
        "sasl.password": "s3cret",
    }
    assert "s3cret" not in repr(connection) and "s3cret" not in str(connection.redacted())
    assert "s3cret" not in connection.describe()
    emitter = hook.emitter_config("orders-api")
    assert emitter.bootstrap_servers == "kafka.internal:9093" and emitter.cluster == "local"
    assert emitter.producer_config["sasl.password"] == "s3cret" and "s3cret" not in repr(emitter)


def test_credentials_without_a_sasl_protocol_are_refused_naming_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    use_connection(monkeypatch, "k4", {"conn_type": "kafka", "host": "k", "login": "svc", "password": "pw"})
    with pytest.raises(KafkaConnectionError) as caught:
        KhipuKafkaHook("k4").connection()
    assert "connection 'k4'" in str(caught.value) and "SASL_PLAINTEXT or SASL_SSL" in str(caught.value)
    assert "pw" not in str(caught.value).replace("password", "")


def test_connection_without_an_address_is_refused_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    use_connection(monkeypatch, "k3", {"conn_type": "kafka", "extra": {"khipu.cluster": "x"}})
    with pytest.raises(KafkaConnectionError, match="connection 'k3' has no Kafka address"):
        KhipuKafkaHook("k3").connection()


def test_each_registry_cluster_gets_the_connection_its_connection_id_names(monkeypatch: pytest.MonkeyPatch) -> None:
    use_connection(monkeypatch, "kafka_east", {"conn_type": "kafka", "extra": {"bootstrap.servers": "east:9092"}})
    use_connection(monkeypatch, "kafka_west", {"conn_type": "kafka", "extra": {"bootstrap.servers": "west:9092"}})
    registry = Registry({"east": Cluster("east", "kafka_east"), "west": Cluster("west", "kafka_west")}, {})
    found = cluster_connections(registry)
    assert {name: (c.cluster, c.bootstrap_servers) for name, c in found.items()} == {
        "east": ("east", "east:9092"),
        "west": ("west", "west:9092"),
    }


def test_the_store_connection_gives_the_url_the_store_opens(monkeypatch: pytest.MonkeyPatch) -> None:
    """A postgres connection, a sqlite one and a URL in the extra: each the URL the store opens (psycopg2 for
    PostgreSQL, the driver Khipu installs: khipu.config.store_url), the password kept for the store only."""
    from sqlalchemy.engine import make_url

    from khipu_airflow.hooks import KhipuStoreHook, StoreConnectionError

    use_connection(monkeypatch, "s_pg", {"conn_type": "postgres", "login": "kh", "password": "p@ss word",
                                         "host": "db.internal", "port": 5433, "schema": "khipu"})  # fmt: skip
    opened = make_url(KhipuStoreHook("s_pg").url())
    assert (opened.drivername, opened.username, opened.password) == ("postgresql+psycopg2", "kh", "p@ss word")
    assert (opened.host, opened.port, opened.database) == ("db.internal", 5433, "khipu")
    use_connection(monkeypatch, "s_lite", {"conn_type": "sqlite", "host": "/var/khipu/khipu.db"})
    assert KhipuStoreHook("s_lite").url() == "sqlite:////var/khipu/khipu.db"
    use_connection(monkeypatch, "s_url", {"conn_type": "generic", "extra": {"url": "postgres://kh@db/khipu"}})
    assert KhipuStoreHook("s_url").url() == "postgres://kh@db/khipu"  # as given: the store normalises it on open
    use_connection(monkeypatch, "s_http", {"conn_type": "http", "host": "x"})
    with pytest.raises(StoreConnectionError, match="expected sqlite or postgres"):
        KhipuStoreHook("s_http").url()
