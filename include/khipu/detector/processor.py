"""The stateful processor: Spark's ``transformWithStateInPandas`` keyed by a hash bucket of message ids.

Per bucket and micro-batch: one state read, one state write, at most one timer change
(:mod:`khipu.detector.bucket` holds the state and the judging). Its input is the bucket's records packed
(:mod:`khipu.detector.packed`: a few rows of Arrow blobs, not a row per record), of which it judges the
traces; it yields one row per bucket evaluated: its verdicts packed, its messages in flight and state bytes for
the heartbeat, and the asks of its lookups that a cluster did not answer (for the driver's log). The records
themselves (traces for the archive, emitter marks, malformed records) reach the writer beside it, from the same
shuffle (:func:`khipu.detector.job.judged_and_records`).

In the first batch of a checkpoint a rescale wrote, Spark hands it each bucket's share of the old checkpoint's
messages in flight as initial state (:meth:`VerdictProcessor.handleInitialState`, :mod:`khipu.detector.handover`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from khipu.detector.bucket import (
    TRACE_STATE,
    VERDICT_FIELDS,
    BucketJudge,
    BucketState,
    LogStartLookup,
    Lookups,
    RouteIds,
)
from khipu.detector.handover import merge_states, wake_ms
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
from khipu.detector.packed import JUDGED, PACKED_FIELDS, RECORD_FIELDS, ipc_bytes, unanswered_text, unpack
from khipu.detector.records import TRACE
from khipu.detector.routes import RoutePlans
from khipu.registry.model import Registry

STATE_VAR = "bucket"  # the value state of a bucket's messages in flight: what a rescale reads (khipu.detector.rescale)
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
        unanswered: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self.registry, self.config = registry, config
        self.unanswered = unanswered  # the asks a cluster did not answer since last called (ClusterClients)
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
        self.state = handle.getValueState(STATE_VAR, STATE_SCHEMA)
        self.timer = handle.getValueState("timer", TIMER_SCHEMA)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        records = unpack((b for frame in rows for b in frame["blob"]), RECORD_FIELDS)
        traces = (
            records.filter(pc.equal(records.column("kind"), TRACE)).select(list(TRACE_STATE.names)).combine_chunks()
        )
        yield from self._evaluate(int(key[0]), traces, timerValues.getCurrentProcessingTimeInMs(), fired=False)

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: TimerValues) -> None:
        """The first batch of a rescaled checkpoint: this bucket's slices of the old buckets' states (Spark may hand
        a bucket's rows over in several calls), merged into its state, and its timer set to when the first of its
        messages wants looking at, as the old buckets' timers were (in the past: this batch evaluates it)."""
        stored = self.state.get()
        parts = [BucketState.decode(bytes(stored[0]))] if stored else []
        parts += [BucketState.decode(bytes(blob)) for blob in initialState["blob"] if blob is not None]
        state = merge_states(parts, self.judge.restated)
        wake = wake_ms(state)
        if wake is None:
            return
        wake = max(wake, 1)  # a timer of 0 would read as none (_evaluate)
        self.state.update((state.encode(),))
        registered = self.timer.get()
        if registered and int(registered[0]) == wake:
            return
        if registered:  # an earlier slice of this bucket's set it later
            self.handle.deleteTimer(int(registered[0]))
        self.handle.registerTimer(wake)
        self.timer.update((wake,))

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        yield from self._evaluate(int(key[0]), None, timerValues.getCurrentProcessingTimeInMs(), fired=True)

    def _evaluate(self, bucket: int, traces: pa.Table | None, now_ms: int, fired: bool) -> Iterator[pd.DataFrame]:
        stored = self.state.get()
        state = BucketState.decode(bytes(stored[0])) if stored else BucketState.empty()
        registered = self.timer.get()
        timer = 0 if fired or not registered else int(registered[0])
        new = traces if traces is not None and traces.num_rows else None
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
        kept = bytes(stored[0]) if stored else b""
        if not len(evaluation.state.messages):
            if stored:
                self.state.clear()
            kept = b""
        elif evaluation.changed or not stored:  # else the stored state stands
            kept = evaluation.state.encode()
            self.state.update((kept,))
        verdicts = None
        if len(evaluation.verdicts):
            frame = evaluation.verdicts.loc[:, list(VERDICT_FIELDS.names)]
            verdicts = ipc_bytes(pa.Table.from_pandas(frame, schema=VERDICT_FIELDS, preserve_index=False))
        in_flight = len(evaluation.state.messages)
        judged = {"bucket": [bucket], "kind": [JUDGED], "blob": [verdicts], "in_flight": [in_flight],
                  "state_bytes": [len(kept)], "unanswered": [unanswered_text(self.unanswered())]}  # fmt: skip
        yield pd.DataFrame(judged, columns=PACKED_FIELDS.names)

    def close(self) -> None:
        """Nothing to release."""
