"""The Kafka hook turns an Airflow connection into client and emitter settings, keeping secrets out of sight."""

from __future__ import annotations

import json

import pytest

from khipu_airflow.hooks import KafkaConnectionError, KhipuKafkaHook


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
                "security.protocol": "SASL_SSL",
                "khipu.cluster": "east",
                "khipu.trace_topic": "east.traces",
            },
        },
    )
    hook = KhipuKafkaHook("k1")
    assert hook.client_config() == {"bootstrap.servers": "b1:9092,b2:9092", "security.protocol": "SASL_SSL"}
    assert (hook.cluster, hook.trace_topic) == ("east", "east.traces")


def test_host_port_and_credentials_become_bootstrap_and_sasl(monkeypatch: pytest.MonkeyPatch) -> None:
    use_connection(
        monkeypatch,
        "k2",
        {"conn_type": "kafka", "host": "kafka.internal", "port": 9093, "login": "svc", "password": "s3cret"},
    )
    hook = KhipuKafkaHook("k2")
    assert hook.client_config() == {
        "bootstrap.servers": "kafka.internal:9093",
        "sasl.username": "svc",
        "sasl.password": "s3cret",
    }
    emitter = hook.emitter_config("orders-api")
    assert emitter.bootstrap_servers == "kafka.internal:9093" and emitter.cluster == "local"
    assert "s3cret" not in repr(emitter)


def test_connection_without_an_address_is_refused_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    use_connection(monkeypatch, "k3", {"conn_type": "kafka", "extra": {"khipu.cluster": "x"}})
    with pytest.raises(KafkaConnectionError, match="connection 'k3' has no Kafka address"):
        KhipuKafkaHook("k3").client_config()
