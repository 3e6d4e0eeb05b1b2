"""Typed Kafka connection settings: validated at load, each client gets its shape, secrets never shown."""

from __future__ import annotations

import pickle

import pytest

from khipu.kafka import KafkaConnection, KafkaConnectionError, Secret


def sasl(**changes: str) -> KafkaConnection:
    settings = {
        "bootstrap.servers": "k1:9094,k2:9094",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "khipu",
        "sasl.password": 'pa"ss',
        "client.id": "khipu-detector",
        **changes,
    }
    return KafkaConnection.from_settings(settings, cluster="east")


def test_librdkafka_and_spark_each_get_the_same_cluster_in_their_own_words() -> None:
    connection = sasl()
    assert connection.client_config() == {
        "bootstrap.servers": "k1:9094,k2:9094",
        "client.id": "khipu-detector",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "khipu",
        "sasl.password": 'pa"ss',
    }
    options = connection.spark_options()
    assert options["kafka.bootstrap.servers"] == "k1:9094,k2:9094"
    assert options["kafka.client.id"] == "khipu-detector"
    assert options["kafka.security.protocol"] == "SASL_PLAINTEXT"
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert options["kafka.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="khipu" password="pa\\"ss";'
    )


def test_the_password_is_masked_in_repr_redacted_describe_and_errors() -> None:
    connection = sasl()
    for shown in (repr(connection), str(connection.redacted()), connection.describe(), repr(connection.sasl_password)):
        assert 'pa"ss' not in shown
    assert connection.redacted()["sasl.password"] == "***"
    assert connection.describe() == "cluster 'east' at k1:9094,k2:9094 (SASL_PLAINTEXT/SCRAM-SHA-512 as khipu)"


def test_it_travels_to_executors_and_files_whole() -> None:
    connection = sasl()
    assert pickle.loads(pickle.dumps(connection)) == connection
    assert KafkaConnection.from_json(connection.to_json()) == connection
    assert Secret("a") == Secret("a") and Secret("a") != Secret("b")


@pytest.mark.parametrize(
    ("settings", "setting", "expected"),
    [
        ({"bootstrap.servers": "no-port"}, "bootstrap.servers", "'host:port"),
        ({"bootstrap.servers": "k:9092", "security.protocol": "TLS"}, "security.protocol", "one of PLAINTEXT"),
        (
            {"bootstrap.servers": "k:9092", "security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"},
            "sasl.mechanism",
            "one of PLAIN, SCRAM-SHA-256",
        ),
        (
            {"bootstrap.servers": "k:9092", "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"},
            "sasl.username/sasl.password",
            "both set",
        ),
        ({"bootstrap.servers": "k:9092", "sasl.username": "u"}, "security.protocol", "SASL_PLAINTEXT or SASL_SSL"),
    ],
)
def test_a_bad_setting_names_itself_and_what_was_expected(
    settings: dict[str, str], setting: str, expected: str
) -> None:
    with pytest.raises(KafkaConnectionError) as caught:
        KafkaConnection.from_settings(settings)
    assert caught.value.setting == setting and expected in str(caught.value)


def test_an_unknown_secret_option_is_masked_in_the_error() -> None:
    with pytest.raises(KafkaConnectionError) as caught:
        KafkaConnection("k:9092", options={"ssl.keystore.password": 5})  # type: ignore[dict-item]
    assert "***" in str(caught.value) and "5" not in str(caught.value).split("got")[1].split(";")[0]


def test_from_env_reads_the_khipu_kafka_variables() -> None:
    connection = KafkaConnection.from_env(
        {
            "KHIPU_BOOTSTRAP_SERVERS": "b:9092",
            "KHIPU_CLUSTER": "west",
            "KHIPU_KAFKA_SECURITY_PROTOCOL": "sasl_plaintext",
            "KHIPU_KAFKA_SASL_MECHANISM": "plain",
            "KHIPU_KAFKA_SASL_USERNAME": "u",
            "KHIPU_KAFKA_SASL_PASSWORD": "p",
        }
    )
    assert (connection.cluster, connection.security_protocol, connection.sasl_mechanism) == (
        "west",
        "SASL_PLAINTEXT",
        "PLAIN",
    )
    assert connection.client_config()["sasl.password"] == "p"
    assert KafkaConnection.from_env({}).client_config() == {"bootstrap.servers": "127.0.0.1:9092"}


def test_the_jaas_config_escapes_only_what_jaas_knows_so_non_ascii_passwords_survive() -> None:
    options = sasl(**{"sasl.password": 'pä\\ss"'}).spark_options()
    assert options["kafka.sasl.jaas.config"].endswith('password="pä\\\\ss\\"";')


def test_a_setting_spark_cannot_take_is_refused_by_name_not_dropped() -> None:
    connection = sasl(**{"ssl.certificate.location": "/etc/client.pem"})
    assert connection.client_config()["ssl.certificate.location"] == "/etc/client.pem"  # librdkafka takes it
    with pytest.raises(KafkaConnectionError) as caught:
        connection.spark_options()
    assert caught.value.setting == "ssl.certificate.location" and "Spark's Kafka connector" in str(caught.value)


def test_a_bad_environment_names_the_variable_to_fix() -> None:
    with pytest.raises(KafkaConnectionError) as caught:
        KafkaConnection.from_env({"KHIPU_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"})
    assert caught.value.setting == "KHIPU_KAFKA_SASL_MECHANISM" and "PLAIN" in str(caught.value)
    with pytest.raises(KafkaConnectionError) as caught:
        KafkaConnection.from_env({"KHIPU_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KHIPU_KAFKA_SASL_MECHANISM": "PLAIN"})
    assert caught.value.setting == "KHIPU_KAFKA_SASL_USERNAME / KHIPU_KAFKA_SASL_PASSWORD"
