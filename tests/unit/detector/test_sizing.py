"""How large the detector's and reconciliation's Spark applications are: what a DAG passes (its Params, or the Spark
connection's extra) is validated once, naming the setting, where it came from and what is expected; a checkpoint
keeps its bucket count and shuffle partitions, and a start asking for others is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from khipu.detector.checkpoint import EPOCH_FILE, CheckpointSizing, checkpoint_sizing
from khipu.detector.job import checkpoint_epoch
from khipu.detector.launch import DetectorJobError
from khipu.detector.sizing import (
    DEFAULT_BUCKETS,
    DEFAULT_SHUFFLE_PARTITIONS,
    DetectorSizing,
    SizingError,
    SparkResources,
    detector_sizing,
    spark_resources,
)

PARAMS, EXTRA = "the run's Params", "spark_default's extra khipu.detector"

# (case, values, refused setting or None, why the answer is right)
VALUES: list[tuple[int, dict[str, Any], str | None, str]] = [
    (1, {}, None, "nothing set: every setting takes its default"),
    (2, dict.fromkeys(("buckets", "shuffle_partitions", "driver_memory", "executor_cores"), None), None,
     "a Param left at null means unset, as Airflow passes an untouched optional Param"),
    (3, {"buckets": 1, "shuffle_partitions": 1}, None, "one bucket, one partition: the smallest that works"),
    (4, {"buckets": 4096}, None, "the largest bucket count the detector keeps"),
    (5, {"buckets": 0}, "buckets", "no bucket to keep a message's state in"),
    (6, {"buckets": 4097}, "buckets", "past the largest bucket count"),
    (7, {"buckets": "32"}, "buckets", "a count is a number: a string is refused, not guessed at"),
    (8, {"buckets": True}, "buckets", "a boolean is no count, though Python calls it an int"),
    (9, {"shuffle_partitions": 0}, "shuffle_partitions", "a shuffle needs at least one partition"),
    (10, {"executor_cores": 0}, "executor_cores", "an executor runs tasks on at least one core"),
    (11, {"total_executor_cores": -2}, "total_executor_cores", "a negative number of cores"),
    (12, {"num_executors": 2.5}, "num_executors", "half an executor"),
    (13, {"driver_memory": "2g", "executor_memory": "512m"}, None, "JVM memory sizes, as spark-submit takes"),
    (14, {"driver_memory": "1536M", "executor_memory": "4gb"}, None, "upper case, a b after the unit: as Spark reads"),
    (15, {"driver_memory": "2"}, "driver_memory", "no unit: Spark reads bytes in some settings, MiB in others"),
    (16, {"executor_memory": "lots"}, "executor_memory", "not a size"),
    (17, {"executor_memory": "0g"}, "executor_memory", "no memory at all"),
    (18, {"executor_memory": 4}, "executor_memory", "a size is text with a unit"),
    (19, {"bucket": 16}, "bucket", "a setting the DAG does not know (a typo) is named, not ignored"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "values", "refused", "why"), VALUES, ids=[f"case {c[0]}" for c in VALUES])
def test_each_setting_is_checked_and_a_bad_one_is_named_with_its_source(
    case: int, values: dict[str, Any], refused: str | None, why: str
) -> None:
    if refused is None:
        sizing = detector_sizing(values, {}, PARAMS, EXTRA)
        assert {name: getattr(sizing, name, None) or getattr(sizing.resources, name, None) for name in values} == {
            name: value for name, value in values.items()
        }, why
        return
    with pytest.raises(SizingError) as refusal:
        detector_sizing(values, {}, PARAMS, EXTRA)
    assert refusal.value.setting == f"{refused} ({PARAMS})", why
    assert "expected" in str(refusal.value)


def test_a_param_wins_over_the_connections_extra_and_the_extra_fills_what_the_params_leave_unset() -> None:
    sizing = detector_sizing(
        {"buckets": None, "executor_memory": "2g", "executor_cores": None},
        {"buckets": 64, "executor_memory": "8g", "driver_memory": "1g"},
        PARAMS,
        EXTRA,
    )
    assert sizing == DetectorSizing(
        buckets=64, shuffle_partitions=None, resources=SparkResources(driver_memory="1g", executor_memory="2g")
    )


def test_a_bad_value_in_the_connections_extra_names_the_extra() -> None:
    with pytest.raises(SizingError, match=r"buckets \(spark_default's extra khipu.detector\)': got 0; expected"):
        detector_sizing({}, {"buckets": 0}, PARAMS, EXTRA)


def test_reconciliation_takes_spark_resources_only() -> None:
    assert spark_resources({"executor_memory": "3g", "num_executors": 2}, {}, PARAMS, "x") == SparkResources(
        executor_memory="3g", num_executors=2
    )
    with pytest.raises(SizingError, match="buckets"):  # a detector setting means nothing to a reconciliation
        spark_resources({"buckets": 16}, {}, PARAMS, "x")


def test_spark_resources_are_spark_submit_hook_arguments_of_the_same_names() -> None:
    resources = SparkResources(driver_memory="1g", executor_cores=2, num_executors=3)
    assert resources.hook_arguments() == {"driver_memory": "1g", "executor_cores": 2, "num_executors": 3}
    assert SparkResources().hook_arguments() == {}  # unset: Spark's own defaults, nothing on the command line


# (case, asked, kept by the checkpoint, expected or None (refused), why the answer is right)
SETTLE: list[tuple[int, int | None, int | None, int | None, str]] = [
    (1, None, None, DEFAULT_BUCKETS, "a new checkpoint with nothing asked: the default"),
    (2, 64, None, 64, "a new checkpoint takes the count asked for"),
    (3, None, 64, 64, "nothing asked: the checkpoint's own count, whatever the default (a restart keeps it)"),
    (4, 64, 64, 64, "asked what the checkpoint has: nothing to change"),
    (5, 16, 64, None, "asked another count than the checkpoint's: the state is kept per bucket, refused"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "asked", "kept", "expected", "why"), SETTLE, ids=[f"case {c[0]}" for c in SETTLE])
def test_a_checkpoint_keeps_its_bucket_count(
    case: int, asked: int | None, kept: int | None, expected: int | None, why: str
) -> None:
    sizing = DetectorSizing(buckets=asked)
    kept_by = CheckpointSizing("s3a://b/checkpoint/khipu_detector", kept, None)
    if expected is None:
        with pytest.raises(SizingError) as refusal:
            sizing.settled(kept_by)
        message = str(refusal.value)
        assert f"got {asked}" in message and f"expected {kept}" in message, why
        assert "s3a://b/checkpoint/khipu_detector" in message and "Rescaling" in message, why
        return
    assert sizing.settled(kept_by) == (expected, DEFAULT_SHUFFLE_PARTITIONS), why


def test_a_checkpoint_keeps_its_shuffle_partitions() -> None:
    kept_by = CheckpointSizing("/c/khipu_detector", 32, 8)
    assert DetectorSizing().settled(kept_by) == (32, 8)
    with pytest.raises(SizingError, match=r"'shuffle_partitions': got 4; expected 8, .*/c/khipu_detector"):
        DetectorSizing(shuffle_partitions=4).settled(kept_by)


def offset_log(query: Path, batch: int, partitions: int) -> None:
    (query / "offsets").mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {"spark.sql.shuffle.partitions": str(partitions)}}
    (query / "offsets" / str(batch)).write_text(f'v1\n{json.dumps(meta)}\n{{"t":{{"0":5}}}}')


def test_what_a_checkpoint_keeps_is_read_from_its_epoch_file_and_its_offset_log(tmp_path: Path) -> None:
    query = tmp_path / "khipu_detector"
    assert checkpoint_sizing(query) == CheckpointSizing(str(query), None, None)  # none yet
    (query / "offsets").mkdir(parents=True)
    (query / "offsets" / ".3.crc").write_text("crc")  # Spark's checksum files are not batches
    offset_log(query, 2, 6)
    offset_log(query, 11, 6)  # the newest batch by number, not by name
    (query / EPOCH_FILE).write_text(json.dumps({"started_s": 1_795_000_000, "buckets": 48}))
    assert checkpoint_sizing(query) == CheckpointSizing(str(query), 48, 6)


def test_a_damaged_offset_log_is_named(tmp_path: Path) -> None:
    query = tmp_path / "khipu_detector"
    (query / "offsets").mkdir(parents=True)
    (query / "offsets" / "0").write_text("v1\nnot json\n")
    with pytest.raises(DetectorJobError, match=r"offsets/0"):
        checkpoint_sizing(query)


def test_the_detector_records_its_bucket_count_in_a_new_checkpoint_and_refuses_another_later(tmp_path: Path) -> None:
    query = tmp_path / "checkpoint" / "khipu_detector"
    assert checkpoint_epoch(query, 1_795_000_000, buckets=16) == (1_795_000_000, True)
    assert json.loads((query / EPOCH_FILE).read_text()) == {"started_s": 1_795_000_000, "buckets": 16}
    assert checkpoint_epoch(query, 1_795_000_600, buckets=16) == (1_795_000_000, False)  # restarted as it was
    with pytest.raises(SizingError, match=r"'buckets': got 32; expected 16"):
        checkpoint_epoch(query, 1_795_000_900, buckets=32)
    assert checkpoint_sizing(query).buckets == 16  # unchanged by the refused start


def test_an_epoch_file_of_an_earlier_release_gets_the_bucket_count_it_runs_with(tmp_path: Path) -> None:
    query = tmp_path / "khipu_detector"
    query.mkdir()
    (query / EPOCH_FILE).write_text(json.dumps({"started_s": 1_795_000_000}))  # before the count was kept
    assert checkpoint_epoch(query, 1_795_000_600, buckets=32) == (1_795_000_000, False)
    assert json.loads((query / EPOCH_FILE).read_text()) == {"started_s": 1_795_000_000, "buckets": 32}
