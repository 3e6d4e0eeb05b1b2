"""Sections load from the given environment and the settings file, each value's source known, secrets masked."""

from __future__ import annotations

from pathlib import Path

import pytest

from khipu.config import (
    ExporterSection,
    KhipuSection,
    SettingsError,
    Source,
    effective_settings,
    load,
    load_with_sources,
    unknown_variables,
)


def test_the_environment_overrides_the_file_and_the_file_the_default(tmp_path: Path) -> None:
    file = tmp_path / "khipu.env"
    file.write_text("# the team's settings\nKHIPU_CLUSTER=east\nKHIPU_BROKER_PORT=29092\n")
    section, sources = load_with_sources(
        KhipuSection, {"KHIPU_SETTINGS_FILE": str(file), "KHIPU_CLUSTER": "west", "KHIPU_STATE_DIR": "/tmp/s"}
    )
    assert (section.cluster, sources["KHIPU_CLUSTER"]) == ("west", Source.ENVIRONMENT)
    assert (section.broker_port, sources["KHIPU_BROKER_PORT"]) == (29092, Source.FILE)
    assert (section.lost_topic, sources["KHIPU_LOST_TOPIC"]) == ("khipu.lost", Source.DEFAULT)
    # derived defaults follow what was set, and stay defaults
    assert section.bootstrap_servers == "127.0.0.1:29092" and sources["KHIPU_BOOTSTRAP_SERVERS"] is Source.DEFAULT
    assert section.store_url == "sqlite:////tmp/s/khipu.db" and section.controller_port == 29093


def test_a_missing_settings_file_is_named() -> None:
    with pytest.raises(SettingsError) as caught:
        load(KhipuSection, {"KHIPU_SETTINGS_FILE": "/nonexistent/khipu.env"})
    assert caught.value.setting == "KHIPU_SETTINGS_FILE" and caught.value.value == "/nonexistent/khipu.env"


def test_an_empty_variable_is_unset() -> None:
    assert load(ExporterSection, {"KHIPU_EXPORTER_HOST": "", "KHIPU_EXPORTER_TOKEN": ""}).host == "127.0.0.1"


def test_a_bad_value_in_the_file_is_named_like_one_in_the_environment(tmp_path: Path) -> None:
    file = tmp_path / "khipu.env"
    file.write_text("KHIPU_EXPORTER_PORT=http\n")
    with pytest.raises(SettingsError) as caught:
        load(ExporterSection, {"KHIPU_SETTINGS_FILE": str(file)})
    assert (caught.value.setting, caught.value.value) == ("KHIPU_EXPORTER_PORT", "http")
    assert "a TCP port number" in str(caught.value)


def test_effective_settings_mask_secrets_and_say_where_each_came_from(tmp_path: Path) -> None:
    file = tmp_path / "khipu.env"
    file.write_text("KHIPU_EXPORTER_TOKEN=s3cr3t-token\n")
    env = {
        "KHIPU_SETTINGS_FILE": str(file),
        "KHIPU_STORE_URL": "postgresql://khipu:hunter2@db:5432/khipu",
        "KHIPU_KAFKA_SASL_PASSWORD": "pa55",
    }
    shown = {row.variable: row for row in effective_settings(env)}
    assert (shown["KHIPU_STORE_URL"].value, shown["KHIPU_STORE_URL"].source) == (
        "postgresql+psycopg2://khipu:***@db:5432/khipu",  # the driver it is opened with
        Source.ENVIRONMENT,
    )
    assert (shown["KHIPU_EXPORTER_TOKEN"].value, shown["KHIPU_EXPORTER_TOKEN"].source) == ("***", Source.FILE)
    assert shown["KHIPU_KAFKA_SASL_PASSWORD"].value == "***" and shown["KHIPU_KAFKA_SASL_PASSWORD"].secret
    assert (shown["KHIPU_CLUSTER"].value, shown["KHIPU_CLUSTER"].source) == ("local", Source.DEFAULT)
    assert not any(secret in row.value for row in shown.values() for secret in ("hunter2", "s3cr3t", "pa55"))


def test_a_khipu_name_no_section_declares_is_reported(tmp_path: Path) -> None:
    file = tmp_path / "khipu.env"
    file.write_text("KHIPU_DETECTOR_GRACE=5\n")
    env = {"KHIPU_SETTINGS_FILE": str(file), "KHIPU_EXPORTER_PROT": "1", "KHIPU_CLUSTER": "x"}
    assert unknown_variables(env) == ["KHIPU_DETECTOR_GRACE", "KHIPU_EXPORTER_PROT"]
