"""A rescale's hand-over: the messages in flight of a checkpoint, re-keyed to another bucket count, and where the
checkpoint that takes them over starts reading.

The detector keeps a message's state in bucket ``pmod(xxhash64(message_id), buckets)`` (:mod:`khipu.detector.bucket`),
so a bucket count is fixed for a checkpoint. A rescale (:mod:`khipu.detector.rescale`) reads the state of the old
checkpoint's last committed batch, cuts each old bucket's state into the messages each new bucket takes
(:func:`split_state`; :class:`Rekeyed` does it to Spark's rows) and writes those slices into the new checkpoint
(``khipu-handover/``, Parquet of :data:`HANDOVER_SCHEMA`) with a manifest (``khipu-rescaled.json``, :class:`Handover`):
the counts, and the offsets of the trace topic where the old checkpoint's last committed batch ended.

The new checkpoint's first start (:func:`khipu.detector.job.start_detector`) finds the manifest and no committed batch
of its own (:func:`pending_handover`): its query reads the topic from those offsets, and its processor takes the
slices as Spark's initial state (``initialState`` of ``transformWithStateInPandas``), merging each bucket's slices
into one state (:func:`merge_states`) and waking the bucket when the first of its messages wants looking at
(:func:`wake_ms`). Pure but for the manifest's file; nothing here starts Spark.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from khipu.detector.bucket import BucketState
from khipu.detector.checkpoint import HANDOVER_FILE
from khipu.detector.clock import source_offsets
from khipu.detector.launch import DetectorJobError
from khipu.detector.xxhash64 import spark_bucket
from khipu.storage.location import Location

HANDOVER_STATE = "khipu-handover"  # in the new query checkpoint: the slices, Parquet
# a slice: the messages of the old bucket ``from_bucket`` that the new ``bucket`` takes, as a BucketState blob
HANDOVER_SCHEMA = pa.schema(
    [
        ("bucket", pa.int32()),  # the new bucket: the processor's grouping key, as the packed records carry it
        ("blob", pa.binary()),
        ("messages", pa.int64()),
        ("from_bucket", pa.int32()),
    ]
)
HANDOVER_DDL = "bucket int, blob binary, messages bigint, from_bucket int"  # HANDOVER_SCHEMA as Spark declares it
# a bucket's state as Spark's state data source reads it, flattened (khipu.detector.rescale)
OLD_STATE_SCHEMA = pa.schema([("from_bucket", pa.int32()), ("blob", pa.binary())])


@dataclass(frozen=True, slots=True)
class Handover:
    """What a rescale handed over (``khipu-rescaled.json``): from which checkpoint and batch, to how many buckets,
    how many messages in flight, and where the trace topic is to be read from."""

    source: str  # the old query checkpoint's URL
    from_buckets: int
    buckets: int
    batch: int  # the old checkpoint's last committed batch: its state is the one handed over
    replayed: bool  # the old checkpoint had started a batch after it and not committed it: the new batch 0 replays it
    topic: str
    offsets: Mapping[int, int]  # partition -> the offset the batch ended at (the next to read)
    shuffle_partitions: int  # the new checkpoint's (the old one's unless the rescale was given another)
    messages: int
    slices: int
    rescaled_ms: int

    def starting_offsets(self, topic: str) -> str:
        """Spark's ``startingOffsets`` for the new query: the old batch's end offsets. Another topic than the one
        the old checkpoint read is refused (its offsets would mean nothing there)."""
        if topic != self.topic:
            raise DetectorJobError(
                "trace topic", topic, f"{self.topic!r}, the topic the rescaled checkpoint {self.source} read"
            )
        return json.dumps({topic: {str(partition): offset for partition, offset in sorted(self.offsets.items())}})

    def to_json(self) -> str:
        body = asdict(self)
        body["offsets"] = {str(partition): offset for partition, offset in sorted(self.offsets.items())}
        return json.dumps(body, sort_keys=True)

    @staticmethod
    def from_json(text: str, where: str) -> Handover:
        try:
            body: dict[str, Any] = json.loads(text)
            body["offsets"] = {int(partition): int(offset) for partition, offset in body["offsets"].items()}
            return Handover(**body)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DetectorJobError("rescale manifest", where, f"the JSON a rescale writes ({exc})") from exc


def offsets_of_batch(query_checkpoint: Location, batch: int) -> tuple[str, dict[int, int]]:
    """(topic, partition -> end offset) of a batch in the query's offset log: the Kafka source's line, the last."""
    path = query_checkpoint / "offsets" / str(batch)
    lines = path.read_text().splitlines()
    found = json.loads(lines[-1]) if len(lines) > 2 else None
    topics = list(found) if isinstance(found, dict) else []
    ends = source_offsets(found, topics[0]) if len(topics) == 1 else None
    if not ends:
        expected = "v1, Spark's metadata, then the trace topic's offsets"
        raise DetectorJobError("checkpoint offset log", path.url, expected)
    return topics[0], ends


def write_handover(query_checkpoint: Location, handover: Handover) -> None:
    (query_checkpoint / HANDOVER_FILE).write_text(handover.to_json())


def read_handover(query_checkpoint: Location | Path) -> Handover | None:
    """The query checkpoint's rescale manifest; None when a rescale did not write it."""
    path = Location.of(query_checkpoint, "checkpoint") / HANDOVER_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return Handover.from_json(text, path.url)


def committed_batches(query_checkpoint: Location) -> list[int]:
    """The batches the query committed (Spark's commit log), in order."""
    return sorted(int(info.base_name) for info in (query_checkpoint / "commits").children() if info.base_name.isdigit())


def pending_handover(query_checkpoint: Location | Path) -> Handover | None:
    """The hand-over the query still has to take: a rescale wrote one, and the query has committed no batch (until
    its batch 0 commits, a restart replays that batch, which takes the hand-over again)."""
    query = Location.of(query_checkpoint, "checkpoint")
    handover = read_handover(query)
    if handover is None or committed_batches(query):
        return None
    return handover


# -- the state, re-keyed ------------------------------------------------------------------------------------------


def split_state(state: BucketState, buckets: int) -> dict[int, BucketState]:
    """A bucket's state cut by the bucket each message takes under ``buckets`` (Spark's ``pmod(xxhash64(id),
    buckets)``, as :class:`khipu.detector.parse.RecordDecoder` keys the records): each message's row and traces
    together, under the routes the state was kept under. Empty buckets are left out."""
    messages, traces = state.messages, state.traces
    if not messages.num_rows:
        return {}
    message_bucket = spark_bucket(messages.column("message_id"), buckets)
    trace_bucket = spark_bucket(traces.column("message_id"), buckets) if traces.num_rows else np.zeros(0, np.int32)
    return {
        int(bucket): BucketState(
            traces.filter(pa.array(trace_bucket == bucket)),
            messages.filter(pa.array(message_bucket == bucket)),
            state.routes,
        )
        for bucket in np.unique(message_bucket)
    }


def merge_states(parts: Sequence[BucketState], restate: Callable[[BucketState], BucketState]) -> BucketState:
    """One bucket's state from slices of others (each message is in one slice). Slices kept under different routes
    are each first restated under the current ones (``restate``: :meth:`khipu.detector.bucket.BucketJudge.restated`);
    otherwise the routes stay the slices' own, and the bucket's next evaluation restates them as it would have."""
    kept = [part for part in parts if part.messages.num_rows]
    if not kept:
        return BucketState.empty()
    if len({part.routes for part in kept} - {None}) > 1:
        kept = [restate(part) for part in kept]
    routes = next((part.routes for part in kept if part.routes is not None), None)
    return BucketState(
        pa.concat_tables([part.traces for part in kept]).combine_chunks(),
        pa.concat_tables([part.messages for part in kept]).combine_chunks(),
        routes,
    )


def wake_ms(state: BucketState) -> int | None:
    """When the bucket is to be evaluated again: when the first of its messages wants looking at (each message's
    ``next_check_ms``, as an evaluation leaves it; the bucket's timer was that). None: nothing in flight."""
    if not state.messages.num_rows:
        return None
    return int(pc.min(state.messages.column("next_check_ms")).as_py())


class Rekeyed:
    """Spark's ``mapInArrow`` over the old checkpoint's states (:data:`OLD_STATE_SCHEMA`): each state's slices under
    ``buckets`` (:data:`HANDOVER_SCHEMA`), one row per old and new bucket that share messages."""

    def __init__(self, buckets: int) -> None:
        self.buckets = buckets

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows: dict[str, list[Any]] = {name: [] for name in HANDOVER_SCHEMA.names}
            for from_bucket, blob in zip(
                batch.column("from_bucket").to_pylist(), batch.column("blob").to_pylist(), strict=True
            ):
                if not blob:
                    continue
                for bucket, part in sorted(split_state(BucketState.decode(blob), self.buckets).items()):
                    rows["bucket"].append(bucket)
                    rows["blob"].append(part.encode())
                    rows["messages"].append(part.messages.num_rows)
                    rows["from_bucket"].append(from_bucket)
            yield pa.RecordBatch.from_pydict(rows, schema=HANDOVER_SCHEMA)
