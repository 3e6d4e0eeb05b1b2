"""Planning a rescale without Spark: which checkpoint and batch it carries over, where the new one starts and how its
batches are keyed, what is refused; and the pointer every user of the query checkpoint follows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from khipu.detector.checkpoint import (
    EPOCH_FILE,
    QUERY_FILE,
    CheckpointSizing,
    Epoch,
    checkpoint_sizing,
    point_at,
    query_checkpoint,
    read_epoch,
    write_epoch,
)
from khipu.detector.handover import Handover, write_handover
from khipu.detector.launch import DetectorJobError
from khipu.detector.outputs import BatchKeys
from khipu.detector.rescale import RescaleError, plan_rescale
from khipu.detector.sizing import MAX_BUCKETS
from khipu.storage.location import Location

TOPIC = "khipu.traces"
STARTED_S = 1_795_000_000


def query_folder(
    checkpoint: Path, name: str, *, started: int, committed: int, buckets: int | None = 4, first_batch: int = 0
) -> Path:
    """A query checkpoint as Spark and the detector leave it: batches 0..started in the offset log (batch n ended at
    offset 10n + partition on each of three partitions; 6 shuffle partitions), 0..committed in the commit log, the
    epoch file."""
    query = checkpoint / name
    (query / "offsets").mkdir(parents=True)
    (query / "commits").mkdir()
    for batch in range(started + 1):
        ends = {TOPIC: {str(p): 10 * batch + p for p in range(3)}}
        metadata = {"batchTimestampMs": 1, "conf": {"spark.sql.shuffle.partitions": "6"}}
        (query / "offsets" / str(batch)).write_text(f"v1\n{json.dumps(metadata)}\n{json.dumps(ends)}")
    for batch in range(committed + 1):
        (query / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    if buckets is not None:
        write_epoch(Location.of(query), Epoch(STARTED_S, buckets, first_batch))
    return query


def test_a_stop_mid_batch_is_carried_from_the_last_committed_batch_and_the_unfinished_one_is_replayed_under_its_key(
    tmp_path: Path,
) -> None:
    query_folder(tmp_path, "khipu_detector", started=6, committed=5)  # batch 6 started, not committed
    plan = plan_rescale(tmp_path, 8)
    assert plan.source.url == Location.of(tmp_path / "khipu_detector").url
    assert plan.target.url == Location.of(tmp_path / "khipu_detector.1").url
    assert (plan.batch, plan.replayed, plan.first_batch) == (5, True, 6)
    assert (plan.topic, plan.offsets) == (TOPIC, {0: 50, 1: 51, 2: 52})  # where batch 5 ended
    old, new = BatchKeys(STARTED_S), BatchKeys(plan.epoch.started_s, plan.first_batch)
    assert new.key(0) == old.key(6)  # the new batch 0 replaces what the unfinished batch 6 wrote
    assert new.key(0) > old.key(5)  # and nothing a committed batch wrote


def test_a_clean_stop_continues_after_the_last_batch(tmp_path: Path) -> None:
    query_folder(tmp_path, "khipu_detector", started=5, committed=5)
    plan = plan_rescale(tmp_path, 2)
    assert (plan.batch, plan.replayed, plan.first_batch, plan.buckets) == (5, False, 6, 2)


def test_the_new_checkpoint_keeps_the_old_shuffle_partitions_unless_given_others_and_the_dag_reads_them(
    tmp_path: Path,
) -> None:
    query_folder(tmp_path, "khipu_detector", started=5, committed=5)
    assert plan_rescale(tmp_path, 8).shuffle_partitions == 6  # the old checkpoint's, from Spark's offset log
    assert plan_rescale(tmp_path, 8, shuffle_partitions=3).shuffle_partitions == 3
    with pytest.raises(RescaleError, match=r"'shuffle_partitions': got 0; expected an integer >= 1"):
        plan_rescale(tmp_path, 8, shuffle_partitions=0)
    new = Location.of(tmp_path / "khipu_detector.1")
    write_epoch(new, Epoch(STARTED_S, 8, 6))
    write_handover(new, Handover(new.url, 4, 8, 5, False, TOPIC, {0: 50}, 3, 0, 0, 0))
    assert checkpoint_sizing(new) == CheckpointSizing(str(new), 8, 3)  # before its first batch: the hand-over's


def test_a_rescaled_checkpoint_rescaled_again_continues_its_own_batch_keys(tmp_path: Path) -> None:
    query_folder(tmp_path, "khipu_detector", started=6, committed=5)
    query_folder(tmp_path, "khipu_detector.1", started=2, committed=2, buckets=8, first_batch=6)
    point_at(tmp_path, Location.of(tmp_path / "khipu_detector.1"))
    plan = plan_rescale(tmp_path, 16)
    assert plan.source.url == Location.of(tmp_path / "khipu_detector.1").url
    assert plan.target.name == "khipu_detector.2"
    assert (plan.batch, plan.first_batch) == (2, 9)  # its batches 0..2 were keys 6..8
    assert BatchKeys(STARTED_S, plan.first_batch).key(0) == BatchKeys(STARTED_S, 6).key(3)


def test_a_folder_a_failed_rescale_left_is_never_reused(tmp_path: Path) -> None:
    query_folder(tmp_path, "khipu_detector", started=3, committed=3)
    (tmp_path / "khipu_detector.1" / "khipu-handover").mkdir(parents=True)  # no pointer was written to it
    assert query_checkpoint(tmp_path).name == "khipu_detector"
    assert plan_rescale(tmp_path, 8).target.name == "khipu_detector.2"


@pytest.mark.parametrize(
    ("committed", "buckets", "asked", "message"),
    [
        (3, 4, 4, r"'buckets': got 4; expected another count than the 4 the checkpoint keeps"),
        (3, 4, 0, rf"'buckets': got 0; expected an integer from 1 to {MAX_BUCKETS}"),
        (3, 4, MAX_BUCKETS + 1, r"'buckets': got 4097"),
        (-1, 4, 8, r"expected a checkpoint that committed a batch"),  # started, never committed: no state to read
        (3, None, 8, r"expected a checkpoint whose bucket count is recorded"),
    ],
)
def test_what_cannot_be_rescaled_is_refused_by_name(
    tmp_path: Path, committed: int, buckets: int | None, asked: int, message: str
) -> None:
    query_folder(tmp_path, "khipu_detector", started=3, committed=committed, buckets=buckets)
    with pytest.raises(RescaleError, match=message):
        plan_rescale(tmp_path, asked)


def test_the_query_checkpoint_is_the_folder_the_pointer_names_for_the_detector_and_the_dags_sizing(
    tmp_path: Path,
) -> None:
    query_folder(tmp_path, "khipu_detector", started=1, committed=1, buckets=4)
    assert query_checkpoint(tmp_path).url == Location.of(tmp_path / "khipu_detector").url
    query_folder(tmp_path, "khipu_detector.1", started=-1, committed=-1, buckets=8, first_batch=2)
    point_at(tmp_path, Location.of(tmp_path / "khipu_detector.1"))
    assert json.loads((tmp_path / QUERY_FILE).read_text()) == {"folder": "khipu_detector.1"}
    assert checkpoint_sizing(query_checkpoint(tmp_path)).buckets == 8  # what the DAG checks a start against
    assert read_epoch(query_checkpoint(tmp_path)) == Epoch(STARTED_S, 8, 2)
    assert json.loads((tmp_path / "khipu_detector.1" / EPOCH_FILE).read_text())["first_batch"] == 2
    assert "first_batch" not in json.loads((tmp_path / "khipu_detector" / EPOCH_FILE).read_text())  # as before


@pytest.mark.parametrize(
    ("pointer", "message"),
    [
        ("not json", r"'checkpoint query file'.*expected JSON"),
        ('{"folder": "../elsewhere"}', r'expected JSON \{"folder": "khipu_detector\[\.<n>\]"\}'),
        ('{"folder": "khipu_detector.7"}', r"khipu_detector.7 is not there \(delete khipu-query.json"),
    ],
)
def test_a_damaged_pointer_is_refused_by_name(tmp_path: Path, pointer: str, message: str) -> None:
    (tmp_path / QUERY_FILE).write_text(pointer)
    with pytest.raises(DetectorJobError, match=message):
        query_checkpoint(tmp_path)
