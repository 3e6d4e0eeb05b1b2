"""Compaction on a real S3 API (S3Proxy): an hour of micro-batches killed mid-compaction, then compacted again, holds
the same rows, each once; the verdict archive's search finds through its index what it found before compaction.

The compaction killed is a real process (SIGKILL, as a worker dies) running khipu.retention.compaction, killed once
its compacted file is in the store and while it deletes the hour's batch folders: the state no rename could
avoid. The archives are written by the detector's own writers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from khipu.localstack.object_store import ObjectStoreProcess
from khipu.retention.compaction import CLOSED_MARGIN_MS, compact_archive
from khipu.storage.compaction import COMPACTED_FOLDER, list_hour
from khipu.storage.location import Location
from khipu.store import Store
from khipu.trace import archive
from khipu.trace.archive import HOUR_MS, hour_of
from khipu.verdicts import archive as verdicts
from khipu.verdicts.archive import VerdictArchive, verdict_table

pytestmark = pytest.mark.integration

T0 = 1_796_000_000_000 // HOUR_MS * HOUR_MS
HOUR = hour_of(T0)
READ_TO = T0 + HOUR_MS + CLOSED_MARGIN_MS  # the detector has read past the hour's end by the margin
BATCHES = 240
COMPACTOR = """
import sys
from khipu.retention.compaction import compact_archive
from khipu.storage.location import Location
from khipu.trace import archive
compact_archive(Location.of(sys.argv[1]), archive.COMPACTION, int(sys.argv[2]), 1 << 30)
"""


def trace(message_id: str, seq: int) -> dict[str, Any]:
    at = T0 + 1_000 + seq
    return {"message_id": message_id, "stream": "orders", "location": "p", "cluster": "local", "type": "SENT",
            "timestamp_ms": at, "topic": "orders", "partition": 0, "offset": seq, "group": None, "emitter_id": "e",
            "emitter_seq": seq, "sampling_percent": 100.0, "attributes": None, "prev_offsets": None,
            "kafka_timestamp_ms": at}  # fmt: skip


def stored_rows(root: Location) -> Counter[tuple[Any, ...]]:
    """Every row in the hour's files, as often as the files hold it."""
    filesystem = root.filesystem()
    return Counter(
        tuple(sorted(row.items()))
        for path in (root / f"hour={HOUR}").files(recursive=True)
        for row in pq.read_table(path, filesystem=filesystem, schema=archive.SCHEMA).to_pylist()
    )


@pytest.fixture
def on_store(object_store: ObjectStoreProcess, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in object_store.environment().items():
        monkeypatch.setenv(name, value)
    return f"s3a://{object_store.bucket}/compaction-{uuid.uuid4().hex[:8]}"


def test_a_compaction_killed_before_its_deletes_leaves_copies_and_the_rerun_each_row_once(on_store: str) -> None:
    root = Location.of(f"{on_store}/archive")
    for batch in range(BATCHES):
        rows = [trace(f"m-{batch}-{i}", batch * 4 + i) for i in range(4)]
        archive.write_batch(root, batch, pa.Table.from_pylist(rows, schema=archive.SCHEMA))
    again = [trace(f"m-7-{i}", 7 * 4 + i) for i in range(4)]  # batch 7's traces read again by a new checkpoint
    archive.write_batch(root, 179_600_000_000_000_007, pa.Table.from_pylist(again, schema=archive.SCHEMA))
    archive.write_batch(root, 179_600_000_000_000_008, pa.Table.from_pylist([], schema=archive.SCHEMA))
    written = stored_rows(root)
    assert sum(written.values()) == BATCHES * 4 + 4 and len(written) == BATCHES * 4

    compactor = subprocess.Popen(
        [sys.executable, "-c", COMPACTOR, root.url, str(READ_TO)], env=os.environ.copy(), stderr=subprocess.PIPE
    )
    parts = root / f"hour={HOUR}" / COMPACTED_FOLDER
    deadline = time.monotonic() + 120
    while not parts.files():  # the compacted file is in the store: the deletes come next
        assert compactor.poll() is None, f"the compaction ended before it was killed: {compactor.stderr.read()!r}"  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "no compacted file within 120 s"
        time.sleep(0.02)
    compactor.send_signal(signal.SIGKILL)
    compactor.wait(timeout=30)

    listing = list_hour(root, f"hour={HOUR}")
    assert len(listing.generations) == 1 and not listing.compacted, "killed with batch folders left"
    assert 0 < len(listing.batches) <= BATCHES + 1
    left = stored_rows(root)
    assert set(left) == set(written) and sum(left.values()) > len(written)  # nothing lost; some rows twice
    read = archive.read_traces(root, [f"m-{b}-{i}" for b in range(BATCHES) for i in range(4)], T0, T0 + HOUR_MS)
    assert len(read) == BATCHES * 4  # a reader counts each trace once meanwhile

    lines: list[str] = []
    done = compact_archive(root, archive.COMPACTION, READ_TO, 1 << 30, progress=lines.append)
    assert [hour.hour for hour in done.hours] == [HOUR]
    assert stored_rows(root) == Counter(set(written))  # the same rows, each once
    assert list_hour(root, f"hour={HOUR}").compacted and root.is_dir()
    assert (root / f"hour={HOUR}").child_folders("batch_id=") == [COMPACTED_FOLDER]

    again_done = compact_archive(root, archive.COMPACTION, READ_TO, 1 << 30, progress=lines.append)
    assert again_done.hours == [] and again_done.already == 1
    assert lines[-1] == "trace archive: nothing to compact (1 hour(s) compacted before, 0 not closed yet)"


def test_the_verdict_search_finds_a_compacted_hours_verdicts_in_the_object_store(on_store: str, tmp_path: Any) -> None:
    store = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    store.migrate()
    ids = [f"m-{b}-{i}" for b in range(30) for i in range(5)]
    with VerdictArchive(f"{on_store}/verdicts", store) as archived:
        for batch in range(30):
            at = T0 + 60_000 + batch * 1_000
            rows = [{"message_id": f"m-{batch}-{i}", "hop": "local/orders -> sink", "stream": "orders",
                     "hop_kind": "read", "verdict": "DELIVERED", "cause": None, "count": 1, "topic": "orders",
                     "partition": 0, "offset": batch * 5 + i, "group": "sink", "location": "sink",
                     "observed_ms": at, "latency_ms": 40, "e2e_latency_ms": 40, "decided_ms": at + i, "detail": "",
                     "first_seen_ms": at - 1_000} for i in range(5)]  # fmt: skip
            archived.write_batch(batch, verdict_table(rows))
            archived.index.record(batch, [(r["message_id"], r["first_seen_ms"], HOUR) for r in rows])
        archived.write_batch(30, verdict_table([]))
        before = archived.search(ids)
        assert len(before.rows) == 150

        size = sum(info.size for info in archived.root.file_infos(recursive=True))
        done = compact_archive(archived.root, verdicts.COMPACTION, READ_TO, size // 3 + 1)
        assert [hour.compaction.files_after for hour in done.hours if hour.compaction] == [3]
        assert (archived.root / f"hour={HOUR}").child_folders("batch_id=") == [COMPACTED_FOLDER]
        assert archived.search(ids).rows == before.rows
        assert archived.search(["m-17-3"]).rows == [r for r in before.rows if r["message_id"] == "m-17-3"]
    store.close()
