"""The stateful processor: Spark's ``transformWithStateInPandas`` keyed by a hash bucket of message ids.

Per bucket and micro-batch: one state read, one state write, at most one timer change
(:mod:`khipu.detector.bucket` holds the state and the judging). It reads only what judging needs of
each trace (:data:`JUDGED_COLUMNS`) and yields only what it decides: verdicts, and one ``stats`` row
per bucket evaluated (messages in flight and state bytes, for the heartbeat). The records themselves
(traces for the archive, emitter marks, malformed records) reach the writer beside it, from the same
shuffle (:func:`khipu.detector.job.judged_and_records`): every column of every record crossing into
Python and back cost more than the judging.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from khipu.detector.bucket import (
    TRACE_STATE,
    VERDICT_COLUMNS,
    BucketJudge,
    BucketState,
    LogStartLookup,
    Lookups,
    RouteIds,
)
from khipu.detector.model import (
    CommitHistoryLookup,
    CommittedLookup,
    DetectorConfig,
    PointerLookup,
    RecordLookup,
    RemovalLookup,
    no_history,
    nothing_asked,
    nothing_pointed_at,
    nothing_removed,
)
from khipu.detector.routes import RoutePlans
from khipu.registry.model import Registry

TRACE, MARK, MALFORMED, VERDICT, STATS = "trace", "mark", "malformed", "verdict", "stats"
# what the processor reads: a record's kind (it judges traces, and leaves the rest), its bucket, and a trace as a bucket
# keeps it (the job adds one column of its own, never read: khipu.detector.job.judged_and_records)
JUDGED_COLUMNS = ("bucket", "kind", *TRACE_STATE.names)
# what leaves it: verdicts (a verdict names its hop by number, in ``hop``: RoutePlans.described says the rest; the
# writer fills it in) and stats rows
OUTPUT_SCHEMA = (
    "bucket int, kind string, message_id string, hop int, verdict string, cause string, count int, partition int, "
    "offset long, observed_ms long, latency_ms long, e2e_latency_ms long, decided_ms long, detail string, "
    "first_seen_ms long, judged_by string, in_flight long, state_bytes long"
)
OUTPUT_COLUMNS = [part.split()[0].strip("`") for part in OUTPUT_SCHEMA.split(", ")]
STATE_SCHEMA = "blob binary"  # the bucket's messages in flight (BucketState.encode)
TIMER_SCHEMA = "timer_ms long"  # apart: a timer moved without anything new does not rewrite the blob


class VerdictProcessor(StatefulProcessor):  # type: ignore[misc]
    def __init__(
        self,
        registry: Registry,
        committed: CommittedLookup,
        config: DetectorConfig,
        pointed_at: PointerLookup = nothing_pointed_at,
        read_to: Callable[[int], int | None] | None = None,
        removed: RemovalLookup = nothing_removed,
        log_start: LogStartLookup | None = None,
        earlier_routes: Mapping[str, RouteIds] | None = None,
        record: RecordLookup = nothing_asked,
        history: CommitHistoryLookup = no_history,
        running_read_to: Callable[[int], int | None] | None = None,
    ) -> None:
        self.registry, self.config = registry, config
        self.lookups = Lookups(
            committed=committed,
            log_start=log_start or (lambda cluster, topic, partition: None),
            pointed_at=pointed_at,
            removed=removed,
            read_to=read_to,
            running_read_to=running_read_to,
            record=record,
            history=history,
        )
        self.judge = BucketJudge(RoutePlans.of(registry), config, earlier_routes)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = handle.getValueState("bucket", STATE_SCHEMA)
        self.timer = handle.getValueState("timer", TIMER_SCHEMA)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        frames = [frame for frame in rows if len(frame)]
        batch = pd.concat(frames, ignore_index=True) if len(frames) > 1 else (frames[0] if frames else None)
        traces = batch[batch["kind"].to_numpy() == TRACE] if batch is not None else None
        yield from self._evaluate(int(key[0]), traces, timerValues.getCurrentProcessingTimeInMs(), fired=False)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        yield from self._evaluate(int(key[0]), None, timerValues.getCurrentProcessingTimeInMs(), fired=True)

    def _evaluate(self, bucket: int, traces: pd.DataFrame | None, now_ms: int, fired: bool) -> Iterator[pd.DataFrame]:
        stored = self.state.get()
        state = BucketState.decode(bytes(stored[0])) if stored else BucketState.empty()
        registered = self.timer.get()
        timer = 0 if fired or not registered else int(registered[0])
        new = traces.loc[:, list(TRACE_STATE.names)] if traces is not None and len(traces) else None
        evaluation = self.judge.evaluate(state, new, now_ms, self.lookups)
        wanted = evaluation.next_check_ms or 0
        if wanted != timer:
            if timer:
                self.handle.deleteTimer(timer)
            if wanted:
                self.handle.registerTimer(wanted)
                self.timer.update((wanted,))
            elif registered:
                self.timer.clear()
        blob = bytes(stored[0]) if stored else b""
        if not len(evaluation.state.messages):
            if stored:
                self.state.clear()
            blob = b""
        elif evaluation.changed or not stored:  # else the stored state stands
            blob = evaluation.state.encode()
            self.state.update((blob,))
        if len(evaluation.verdicts):
            yield _shaped(evaluation.verdicts.assign(kind=VERDICT, bucket=bucket))
        stats = {"kind": STATS, "bucket": bucket, "in_flight": len(evaluation.state.messages), "state_bytes": len(blob)}
        yield _shaped(pd.DataFrame([stats]))

    def close(self) -> None:
        """Nothing to release."""


def _shaped(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with exactly the output's columns, in order (those it lacks: null)."""
    n = len(frame)
    columns = {
        name: frame[name].to_numpy() if name in frame.columns else np.full(n, None, dtype=object)
        for name in OUTPUT_COLUMNS
    }
    return pd.DataFrame(columns)


assert set(VERDICT_COLUMNS) <= set(OUTPUT_COLUMNS)
