"""Where a directly started detector or reconcile driver listens."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from khipu.detector.job import EPOCH_FILE, carried_over_offsets, checkpoint_epoch, known_routes
from khipu.detector.launch import DetectorJobError, driver_settings, throughput_settings
from khipu.detector.outputs import BatchKeys

LOOPBACK = {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}


@pytest.mark.parametrize(
    ("master", "expected"),
    [
        ("local[*]", LOOPBACK),
        ("local[2]", LOOPBACK),
        ("spark://127.0.0.1:7077", LOOPBACK),
        ("spark://localhost:7077", LOOPBACK),
        ("spark://spark-master.internal:7077", {}),  # executors elsewhere must reach the driver
        ("yarn", {}),
    ],
)
def test_a_driver_on_this_machine_only_listens_on_loopback(
    master: str, expected: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_LOCAL_IP", "")  # so that the test's end restores what was there
    monkeypatch.delenv("SPARK_LOCAL_IP")
    assert driver_settings(master) == expected
    assert ("SPARK_LOCAL_IP" in os.environ) == bool(expected)  # the web UI follows it


def test_an_address_the_environment_chose_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.1.2.3")
    driver_settings("local[*]")
    assert os.environ["SPARK_LOCAL_IP"] == "10.1.2.3"


@pytest.mark.parametrize(
    ("master", "uncompressed"),
    [("local[*]", True), ("local[2]", True), ("spark://127.0.0.1:7077", False), ("yarn", False)],
)
def test_the_parallel_collector_everywhere_and_uncompressed_shuffles_only_on_one_machine(
    master: str, uncompressed: bool
) -> None:
    settings = throughput_settings(master, "-Dlog4j2.configurationFile=file:/x.properties")
    # the caller's own driver options stand, the collector after them
    assert (
        settings["spark.driver.extraJavaOptions"] == "-Dlog4j2.configurationFile=file:/x.properties -XX:+UseParallelGC"
    )
    assert settings["spark.executor.extraJavaOptions"] == "-XX:+UseParallelGC"
    shuffle = {
        key: settings[key] for key in ("spark.shuffle.compress", "spark.shuffle.spill.compress") if key in settings
    }
    assert shuffle == (
        dict.fromkeys(("spark.shuffle.compress", "spark.shuffle.spill.compress"), "false") if uncompressed else {}
    )


def test_a_checkpoint_keeps_the_second_it_was_first_started(tmp_path: Path) -> None:
    query = tmp_path / "checkpoint" / "khipu_detector"
    assert checkpoint_epoch(query, 1_795_000_000) == (1_795_000_000, True)  # new: nothing read yet
    assert checkpoint_epoch(query, 1_795_000_600) == (1_795_000_000, False)  # restarted from it
    other = tmp_path / "older" / "khipu_detector"
    (other / "offsets").mkdir(parents=True)
    (other / "offsets" / "7").write_text("v1\n{}\n{}")
    assert checkpoint_epoch(other, 1_795_000_900) == (1_795_000_900, False)  # batches ran: not a first start


def test_a_damaged_epoch_file_is_named(tmp_path: Path) -> None:
    (tmp_path / EPOCH_FILE).write_text("{}")
    with pytest.raises(DetectorJobError, match=EPOCH_FILE):
        checkpoint_epoch(tmp_path, 1)


def test_batch_keys_of_two_checkpoints_never_meet() -> None:
    first, second = BatchKeys(1_795_000_000), BatchKeys(1_795_000_001)
    assert first.key(BatchKeys.SPAN - 1) < second.key(0)
    assert first.key(12) - first.key(0) == 12
    with pytest.raises(ValueError, match="start a new checkpoint"):
        first.key(BatchKeys.SPAN)


def test_a_checkpoint_remembers_every_set_of_routes_it_ran_under(tmp_path: Path) -> None:
    from khipu.detector.bucket import route_ids, routes_fingerprint
    from khipu.detector.routes import RoutePlans
    from khipu.registry import parse_registry

    def plans(groups: str) -> RoutePlans:
        return RoutePlans.of(
            parse_registry(
                "version: 1\nclusters: {local: {}}\nstreams:\n  orders:\n    owner: team-t\n    route:\n"
                "      producers: [{location: p, writes: [local/in]}]\n"
                f"      consumers: [{groups}]\n"
            )
        )

    one, two = (
        plans("{group: s1, reads: [local/in]}"),
        plans("{group: s1, reads: [local/in]}, {group: s2, reads: [local/in]}"),
    )
    assert known_routes(tmp_path, one) == {routes_fingerprint(route_ids(one)): route_ids(one)}
    both = known_routes(tmp_path, two)  # the registry changed: the state kept before is read by the old routes
    assert both == {routes_fingerprint(route_ids(r)): route_ids(r) for r in (one, two)}
    assert both[routes_fingerprint(route_ids(two))]["orders"] == ["p -> local/in", "local/in -> s1", "local/in -> s2"]


def test_an_upgraded_detector_starts_where_the_old_archive_query_stopped(tmp_path: Path) -> None:
    import json

    assert carried_over_offsets(tmp_path, "khipu.traces") is None  # nothing to carry over
    old = tmp_path / "khipu_archive"
    (old / "offsets").mkdir(parents=True)
    (old / "commits").mkdir()
    for batch, ends in ((4, {"0": 10, "1": 7}), (5, {"0": 25, "1": 9})):  # as Spark writes its offset log
        metadata = {"batchWatermarkMs": 0, "batchTimestampMs": 1}
        (old / "offsets" / str(batch)).write_text(f"v1\n{json.dumps(metadata)}\n{json.dumps({'khipu.traces': ends})}")
    (old / "commits" / "4").write_text('v1\n{"nextBatchWatermarkMs":0}')  # batch 5 planned, never committed
    assert json.loads(carried_over_offsets(tmp_path, "khipu.traces") or "") == {"khipu.traces": {"0": 10, "1": 7}}
    assert carried_over_offsets(tmp_path, "other.topic") is None
