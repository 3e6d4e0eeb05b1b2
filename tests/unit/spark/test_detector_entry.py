"""spark/detector.py's arguments become a valid job, with the library's defaults."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from khipu.detector.model import DetectorConfig

ENTRY = Path(__file__).resolve().parents[3] / "spark" / "detector.py"


def load_entry():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("detector_entry", ENTRY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_defaults_are_the_detector_configs_and_the_state_folder() -> None:
    job, master = load_entry().parse_args([])
    assert job.detector == DetectorConfig()
    assert job.checkpoint_dir.url.endswith("/detector/checkpoint") and job.checkpoint_dir.is_local
    assert (job.lost_topic, job.trace_topic, master) == ("khipu.lost", "khipu.traces", "local[*,4]")
    assert job.trace_connection.bootstrap_servers == "127.0.0.1:9092" and job.cluster_connections == {}
    assert job.store_url.endswith("khipu.db")


def test_locations_are_urls_and_a_bad_one_is_refused_naming_its_option() -> None:
    import pytest

    from khipu.storage.location import StorageError

    job, _ = load_entry().parse_args(
        ["--checkpoint", "s3a://khipu-data/prod/checkpoint", "--archive", "s3://khipu-data/prod/archive"]
    )
    assert (job.checkpoint_dir.spark_url, job.archive_dir.url) == (
        "s3a://khipu-data/prod/checkpoint",
        "s3a://khipu-data/prod/archive",
    )
    with pytest.raises(StorageError, match=r"'--verdict-archive'.*a bucket and a prefix"):
        load_entry().parse_args(["--verdict-archive", "s3a://khipu-data"])


def test_arguments_override_and_an_empty_lost_topic_turns_it_off() -> None:
    job, _ = load_entry().parse_args(
        ["--grace-ms", "5000", "--lost-topic", "", "--trigger-seconds", "2", "--bootstrap-servers", "127.0.0.1:19092"]
    )
    assert (job.detector.grace_ms, job.lost_topic, job.trigger_seconds) == (5000, None, 2.0)
    assert job.trace_connection.bootstrap_servers == "127.0.0.1:19092"  # the argument, not the environment's


def test_a_connections_file_gives_the_clusters_and_the_store_and_must_be_private(tmp_path: Path) -> None:
    import pytest

    from khipu.detector.launch import DetectorJobError, write_connections_file
    from khipu.kafka import KafkaConnection

    east = KafkaConnection.from_settings(
        {
            "bootstrap.servers": "east:9094",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "pw",
        },
        cluster="east",
    )
    west = KafkaConnection("west:9092", cluster="west")
    path = write_connections_file(tmp_path / "c.json", east, {"east": east, "west": west}, "postgresql://u:pw@db/k")
    assert path.stat().st_mode & 0o077 == 0
    job, _ = load_entry().parse_args(["--connections-file", str(path)])
    assert job.trace_connection == east and dict(job.cluster_connections) == {"east": east, "west": west}
    assert job.store_url == "postgresql://u:pw@db/k" and "pw" not in repr(job)
    path.chmod(0o644)
    with pytest.raises(DetectorJobError, match="readable by its owner only"):
        load_entry().parse_args(["--connections-file", str(path)])
