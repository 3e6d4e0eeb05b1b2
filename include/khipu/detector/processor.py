"""The stateful processor: keyed by message id, it gathers traces and applies :func:`decide`.

State per message: its traces (a list) and a small meta value (first seen, the memo of when each
group was first seen past it, the hops already given a verdict). A decided message's state is
dropped at once (Inca's shortcut); the TTL is only a safety net. So state stays proportional to
messages in flight, not to traffic. A processing-time timer brings an undecided message back
when its committed offsets may have moved or its grace has run out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from khipu.detector.decide import decide
from khipu.detector.model import CommittedLookup, DetectorConfig, TraceGapLookup, Verdict, no_trace_gaps
from khipu.detector.parse import TRACE_COLUMNS
from khipu.registry.model import Registry
from khipu.trace.model import NO_ATTRIBUTES, Trace, TraceType

VERDICT_SCHEMA = (
    "message_id string, stream string, hop string, hop_kind string, verdict string, cause string, count int, "
    "topic string, partition int, offset long, `group` string, location string, observed_ms long, "
    "latency_ms long, e2e_latency_ms long, decided_ms long, detail string"
)
VERDICT_FIELDS = [part.split()[0].strip("`") for part in VERDICT_SCHEMA.split(", ")]
TRACE_FIELDS = [part.split()[0].strip("`") for part in TRACE_COLUMNS.split(", ")]
META_SCHEMA = "first_seen_ms long, passed_at string, emitted string"
SAFETY_TTL_MS = 3_600_000  # beyond max_wait: state a bug left behind still goes


def trace_from_row(row: tuple[Any, ...]) -> Trace:
    values = dict(zip(TRACE_FIELDS, row, strict=True))
    attributes = json.loads(values["attributes"]) if values["attributes"] else NO_ATTRIBUTES
    return Trace(
        values["message_id"],
        values["stream"],
        values["location"],
        values["cluster"],
        TraceType(values["type"]),
        int(values["timestamp_ms"]),
        values["topic"],
        int(values["partition"]),
        int(values["offset"]),
        values["group"],
        values["emitter_id"],
        int(values["emitter_seq"]),
        float(values["sampling_percent"]),
        attributes,
    )


def verdict_row(verdict: Verdict) -> dict[str, Any]:
    return {
        "message_id": verdict.message_id,
        "stream": verdict.stream,
        "hop": verdict.hop,
        "hop_kind": verdict.hop_kind,
        "verdict": verdict.kind.value,
        "cause": verdict.cause.value if verdict.cause else None,
        "count": verdict.count,
        "topic": verdict.topic,
        "partition": verdict.partition,
        "offset": verdict.offset,
        "group": verdict.group,
        "location": verdict.location,
        "observed_ms": verdict.observed_ms,
        "latency_ms": verdict.latency_ms,
        "e2e_latency_ms": verdict.e2e_latency_ms,
        "decided_ms": verdict.decided_ms,
        "detail": verdict.detail,
    }


class VerdictProcessor(StatefulProcessor):  # type: ignore[misc]
    def __init__(
        self,
        registry: Registry,
        committed: CommittedLookup,
        config: DetectorConfig,
        trace_gap: TraceGapLookup = no_trace_gaps,
        read_to: Callable[[], int | None] | None = None,
    ) -> None:
        self.registry = registry
        self.committed = committed
        self.config = config
        self.trace_gap = trace_gap
        self.read_to = read_to  # the time up to which the trace topic is read (None: take it as caught up)

    def init(self, handle: StatefulProcessorHandle) -> None:
        ttl = self.config.max_wait_ms + SAFETY_TTL_MS
        self.handle = handle
        self.traces = handle.getListState("traces", TRACE_COLUMNS, ttl)
        self.meta = handle.getValueState("meta", META_SCHEMA, ttl)

    def handleInputRows(
        self,
        key: Any,
        rows: Iterator[pd.DataFrame],
        timerValues: TimerValues,
    ) -> Iterator[pd.DataFrame]:
        new = [tuple(r) for frame in rows for r in frame[TRACE_FIELDS].itertuples(index=False, name=None)]
        if new:
            self.traces.appendList(new)
        yield from self._evaluate(key[0], timerValues.getCurrentProcessingTimeInMs())

    def handleExpiredTimer(
        self,
        key: Any,
        timerValues: TimerValues,
        expiredTimerInfo: ExpiredTimerInfo,
    ) -> Iterator[pd.DataFrame]:
        yield from self._evaluate(key[0], timerValues.getCurrentProcessingTimeInMs())

    def _evaluate(self, message_id: str, now_ms: int) -> Iterator[pd.DataFrame]:
        traces = [trace_from_row(row) for row in self.traces.get()]
        if not traces:
            return
        meta = self.meta.get() if self.meta.exists() else None
        first_seen = int(meta[0]) if meta else now_ms
        passed_at = json.loads(meta[1]) if meta else {}
        emitted = set(json.loads(meta[2])) if meta else set()
        stream = self.registry.streams.get(traces[0].stream)
        if stream is None:  # parsing quarantines unknown streams; a registry change could still get here
            self._drop()
            return
        read_to_ms = self.read_to() if self.read_to is not None else None
        decision = decide(
            message_id,
            stream,
            traces,
            self.committed,
            passed_at,
            first_seen,
            now_ms,
            self.config,
            self.trace_gap,
            read_to_ms,
        )
        fresh = [v for v in decision.verdicts if v.hop not in emitted]
        if decision.done:
            self._drop()
        else:
            emitted.update(v.hop for v in fresh)
            self.meta.update((first_seen, json.dumps(dict(decision.passed_at)), json.dumps(sorted(emitted))))
            for timer in list(self.handle.listTimers()):
                self.handle.deleteTimer(timer)
            self.handle.registerTimer(max(int(decision.next_check_ms or now_ms), now_ms + 1))
        if fresh:
            yield pd.DataFrame([verdict_row(v) for v in fresh], columns=VERDICT_FIELDS)

    def _drop(self) -> None:
        self.traces.clear()
        self.meta.clear()
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)

    def close(self) -> None:
        """Nothing to release."""
