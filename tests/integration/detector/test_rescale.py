"""Rescaling the detector to another bucket count on the real broker and Spark, as docs/detector.md ("Rescaling to
another bucket count") tells an operator to: the detector runs with 4 buckets and is stopped with messages in
flight, ``spark/rescale.py --buckets 8`` carries them to a new checkpoint, and the detector started again with 8
buckets ends with every verdict the applications' ground truth says, none stored twice.

It is stopped the hardest way for "nothing twice": killed while its writer was writing a batch (that batch's traces
archived, the batch not committed), so the rescaled checkpoint's first batch must replace what that batch wrote."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from subprocess import STDOUT
from typing import Any

import pyarrow.dataset as ds
import pytest

from khipu.demo.score import observable_messages, score
from khipu.detector.bucket import BucketState
from khipu.detector.checkpoint import checkpoint_sizing, query_checkpoint
from khipu.detector.handover import HANDOVER_STATE, committed_batches
from khipu.detector.job import DETECTOR_QUERY, DetectorJob, start_detector
from khipu.detector.outputs import BatchKeys
from khipu.localstack.broker import BrokerProcess
from khipu.storage.batches import last_batch
from khipu.storage.location import Location
from khipu.store import Store
from khipu.trace import Trace
from tests.integration.detector.conftest import (
    ROOT,
    demo_traces,
    detector_command,
    detector_job,
    stored_verdicts,
    wait_until_settled,
)
from tests.integration.helpers import traces_of, until

pytestmark = pytest.mark.integration


def test_a_detector_stopped_with_messages_in_flight_and_rescaled_from_4_to_8_buckets_decides_every_message_once(
    broker: BrokerProcess, spark: Any, tmp_path: Path
) -> None:
    # a demo run (every fault) before the detector starts, then another while it runs: the first run's messages are
    # decided once the detector has caught up, the second's are in flight when it is stopped
    first = demo_traces(broker, tmp_path, "rescale-a", count=80, seed=11)
    four = detector_job(broker, tmp_path, first.trace_topic, "rescale", lost_topic=None)
    store = Store(four.store_url)
    log = tmp_path / "four.log"
    # a few trace records per batch (each a batch of an emitter's traces), so that it reads the second run slowly
    command = detector_command(four, tmp_path, "local[2]", "--buckets", "4", "--max-offsets-per-trigger", "3")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    detector = subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=STDOUT, start_new_session=True)
    try:
        until(lambda: bool(stored_verdicts(store, four.verdicts_dir)), 180, "the first run's first verdicts")
        second = demo_traces(broker, tmp_path, "rescale-b", count=80, seed=12, trace_topic=first.trace_topic)
        until(
            lambda: _holding_messages(store) and _in_writer(four) is not None, 90,
            "the 4-bucket detector holding messages and writing a batch it has not committed",
        )  # fmt: skip
    finally:
        os.killpg(detector.pid, signal.SIGKILL)
        detector.wait()
    old_query = query_checkpoint(four.checkpoint_dir)
    unfinished = _in_writer(four)
    at_stop = store.heartbeat.latest(DETECTOR_QUERY)
    decided_before = {v["message_id"] for v in stored_verdicts(store, four.verdicts_dir)}
    observable = observable_messages(first.truth) | observable_messages(second.truth)

    rescaled = subprocess.run(
        [sys.executable, str(ROOT / "spark" / "rescale.py"), "--checkpoint", str(four.checkpoint_dir),
         "--buckets", "8", "--master", "local[2]"],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert rescaled.returncode == 0, rescaled.stderr[-3000:]
    handover = json.loads(rescaled.stdout.splitlines()[-1])
    new_query = query_checkpoint(four.checkpoint_dir)
    in_flight = _handed_over(new_query)

    eight = dataclasses.replace(four, buckets=8)
    queries = start_detector(spark, eight)
    try:
        verdicts = wait_until_settled(eight.store_url, len(observable), verdicts_dir=eight.verdicts_dir)
    finally:
        for query in queries:
            query.stop()
    print(f"killed in the writer of batch {unfinished}, holding {at_stop and at_stop['state_rows']} messages; "
          f"hand-over: {handover}")  # fmt: skip

    # killed while writing batch N+1 of a checkpoint that had committed N, holding messages in flight
    assert unfinished is not None and unfinished == handover["batch"] + 1 and handover["replayed"]
    assert handover["from_buckets"] == 4 and handover["buckets"] == 8
    assert handover["messages"] == len(in_flight) > 0
    # the detector now runs on the new checkpoint, which keeps 8 buckets; the old one is kept as it was
    assert old_query.name == DETECTOR_QUERY and new_query.name == f"{DETECTOR_QUERY}.1"
    assert handover["checkpoint"] == new_query.url and handover["source"] == old_query.url
    assert checkpoint_sizing(new_query).buckets == 8 and committed_batches(new_query)
    assert checkpoint_sizing(old_query).buckets == 4 and committed_batches(old_query)[-1] == handover["batch"]
    # every verdict the applications' ground truth says, the in-flight messages' among them
    for demo in (first, second):
        result = score(demo.truth, verdicts)
        assert result.exact, (result.wrong, result.missing, result.extra)
    decided = {v["message_id"] for v in verdicts}
    assert decided_before and in_flight <= decided  # some decided before the stop; the rest after the rescale
    # each once: no verdict archived twice, no trace archived twice (the unfinished batch's files were replaced)
    archived = Counter((row["message_id"], row["hop"]) for row in _rows(eight.verdicts_dir))
    assert archived and max(archived.values()) == 1
    traces = [t for t in traces_of(broker, first.trace_topic) if isinstance(t, Trace)]
    assert len(_rows(eight.archive_dir)) == len(traces)
    store.close()


def _holding_messages(store: Store) -> bool:
    """Messages in flight after the last batch the detector finished."""
    beat = store.heartbeat.latest(DETECTOR_QUERY)
    return bool(beat and (beat["state_rows"] or 0) > 0)


def _in_writer(job: DetectorJob) -> int | None:
    """The batch the detector is writing and has not committed: the trace archive records it as written (the first
    of the writer's outputs), the checkpoint has not committed it. None: no such batch."""
    recorded = last_batch(job.archive_dir)
    query = query_checkpoint(job.checkpoint_dir)
    if recorded is None or not recorded.files:
        return None
    batch = recorded.batch_id % BatchKeys.SPAN
    return batch if batch not in committed_batches(query) else None


def _rows(archive: Location) -> list[dict[str, Any]]:
    return ds.dataset(archive.local_path, format="parquet", partitioning="hive").to_table().to_pylist()


def _handed_over(query: Location) -> set[str]:
    """The ids of the messages in flight a rescale handed over to ``query``."""
    slices = ds.dataset((query / HANDOVER_STATE).local_path, format="parquet").to_table(columns=["blob"])
    return {m for blob in slices.column("blob").to_pylist() for m in BucketState.decode(blob).messages["message_id"]
            .to_pylist()}  # fmt: skip
