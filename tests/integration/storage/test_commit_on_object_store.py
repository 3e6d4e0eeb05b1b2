"""A micro-batch killed mid-write on a real S3 API (s3proxy), then replayed: no partial file, no duplicate.

The writer is a real process killed with SIGKILL while it uploads a batch of many hours (the failure a
driver dying mid-batch produces); the replay writes the same batch id with other hours, as a verdict
archive's replay does when it decides at another time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from khipu.localstack.object_store import ObjectStoreProcess
from khipu.storage.location import Location
from khipu.trace import archive

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
BASE_MS = 1_796_000_000_000 - 1_796_000_000_000 % HOUR_MS
WRITER = """
import sys
import pyarrow as pa
from khipu.trace import archive
root, hours = sys.argv[1], int(sys.argv[2])
times = [{base} + h * {hour} + 5 for h in range(hours) for _ in range(200)]
rows = {{name: [None] * len(times) for name in archive.SCHEMA.names}}
rows.update(message_id=[f"m-{{i}}" for i in range(len(times))], stream=["orders"] * len(times),
            type=["SENT"] * len(times), location=["app"] * len(times), cluster=["local"] * len(times),
            timestamp_ms=times, kafka_timestamp_ms=times, emitter_id=["e"] * len(times))
archive.write_batch(root, 42, pa.table(rows).cast(archive.SCHEMA))
"""


def _traces(hours: range, prefix: str) -> pa.Table:
    times = [BASE_MS + h * HOUR_MS + 5 for h in hours]
    rows: dict[str, list[object]] = {name: [None] * len(times) for name in archive.SCHEMA.names}
    rows.update(
        message_id=[f"{prefix}-{h}" for h in hours], stream=["orders"] * len(times), type=["SENT"] * len(times),
        location=["app"] * len(times), cluster=["local"] * len(times), timestamp_ms=times,
        kafka_timestamp_ms=times, emitter_id=["e"] * len(times),
    )  # fmt: skip
    return pa.table(rows).cast(archive.SCHEMA)


def test_a_batch_killed_mid_write_leaves_whole_files_and_its_replay_leaves_only_its_own(
    object_store: ObjectStoreProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in object_store.environment().items():
        monkeypatch.setenv(name, value)
    root = Location.of(f"s3a://{object_store.bucket}/commit-{uuid.uuid4().hex[:8]}/archive")
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER.format(base=BASE_MS, hour=HOUR_MS), root.url, "400"],
        env=os.environ.copy(), stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while len(root.files(recursive=True)) < 3:  # some hours uploaded: the batch is under way
        assert writer.poll() is None, f"the writer ended before it was killed: {writer.stderr.read()!r}"  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the writer wrote nothing within 60 s"
        time.sleep(0.05)
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    left = root.files(recursive=True)
    assert 3 <= len(left) < 400, "killed mid-batch: some hours written, not all"
    filesystem = root.filesystem()
    for path in left:  # every file the killed writer left is whole
        assert pq.read_table(path, filesystem=filesystem).num_rows == 200

    # the replay (same batch id) files its traces under other hours, as a verdict archive's replay may
    archive.write_batch(root, 42, _traces(range(1000, 1003), "replayed"))
    after = root.files(recursive=True)
    assert len(after) == 3 and all("batch_id=42" in path for path in after)
    first = BASE_MS // HOUR_MS
    wanted = [f"replayed-{h}" for h in range(1000, 1003)] + ["m-0"]  # m-0: the killed attempt's, gone
    read = archive.read_traces_in_hours(root, wanted, range(first, first + 2000))
    assert sorted(t.message_id for t in read) == ["replayed-1000", "replayed-1001", "replayed-1002"]
