"""Runtime settings come from the environment, validated, with errors naming the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from khipu.settings import KhipuSettings, SettingsError


def test_defaults_point_at_the_local_stack() -> None:
    settings = KhipuSettings.from_env({})
    assert settings.bootstrap_servers == "127.0.0.1:9092"
    assert (settings.cluster, settings.trace_topic) == ("local", "khipu.traces")
    assert settings.registry_path.name == "registry.yaml" and settings.state_dir.name == ".khipu"


def test_broker_port_moves_the_default_bootstrap_and_env_round_trips() -> None:
    settings = KhipuSettings.from_env({"KHIPU_BROKER_PORT": "29092", "KHIPU_STATE_DIR": "/tmp/x"})
    assert settings.bootstrap_servers == "127.0.0.1:29092"
    assert KhipuSettings.from_env(settings.as_env()) == settings
    assert settings.state_dir == Path("/tmp/x")


def test_the_verdict_archive_sits_beside_the_trace_archive_in_a_directory_of_its_own() -> None:
    settings = KhipuSettings.from_env({"KHIPU_STATE_DIR": "/tmp/x"})
    assert settings.archive_dir.local_path == Path("/tmp/x/archive")
    assert settings.verdict_archive_dir.local_path == Path("/tmp/x/verdicts")
    assert settings.checkpoint_dir.local_path == Path("/tmp/x/detector/checkpoint")
    # Spark reads the trace archive's root whole: the verdict archive is not under it
    assert not settings.verdict_archive_dir.url.startswith(settings.archive_dir.url + "/")


def test_one_setting_moves_the_archives_and_the_checkpoint_to_an_object_store() -> None:
    settings = KhipuSettings.from_env({"KHIPU_STATE_DIR": "/tmp/x", "KHIPU_DATA_URL": "s3://khipu-data/prod/"})
    assert [settings.archive_dir.url, settings.verdict_archive_dir.url, settings.checkpoint_dir.url] == [
        "s3a://khipu-data/prod/archive",
        "s3a://khipu-data/prod/verdicts",
        "s3a://khipu-data/prod/detector/checkpoint",
    ]
    assert KhipuSettings.from_env(settings.as_env()).data == settings.data  # a child process gets the same


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"KHIPU_BROKER_PORT": "90000"},
            "environment setting 'KHIPU_BROKER_PORT': got '90000'; expected a TCP port number",
        ),
        (
            {"KHIPU_AIRFLOW_PORT": "http"},
            "environment setting 'KHIPU_AIRFLOW_PORT': got 'http'; expected a TCP port number",
        ),
        (
            {"KHIPU_TRACE_TOPIC": "bad topic"},
            "environment setting 'KHIPU_TRACE_TOPIC': got 'bad topic'; expected 1-249",
        ),
        (
            {"KHIPU_BOOTSTRAP_SERVERS": " "},
            "environment setting 'KHIPU_BOOTSTRAP_SERVERS': got ' '; expected 'host:port",
        ),
    ],
)
def test_bad_setting_names_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        KhipuSettings.from_env(env)
    assert str(caught.value).startswith(message)
