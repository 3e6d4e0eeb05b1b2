"""One bucket of messages in flight: its state, and what one evaluation of it decides.

The streaming detector keys its state by a hash bucket of message ids, not by message id: one state
read, one write and one timer per bucket and micro-batch instead of per message (every state call of
Spark's Python ``transformWithState`` is a round trip to the JVM). A bucket's state is two Arrow
tables, compressed: the traces of its messages in flight, and one row per message (when it was first
seen, which hops were reported, the memo of when each group was first seen past it, when to look again).

An evaluation (:meth:`BucketJudge.evaluate`) takes the state, the bucket's new traces and the batch's
time, and decides:

- **clean messages** (:mod:`khipu.detector.clean`) all at once, with numpy;
- every other message with :func:`khipu.detector.decide.decide`, one by one, only when it has new
  traces or its own next check is due (a message leaves the clean judge for good once it does).

A decided message's rows go at once: state follows messages in flight, not traffic. Pure but for
the lookups passed in (committed offsets, log starts, pointers, removals, the read-to clock), so it is
tested without Spark; :mod:`khipu.detector.processor` is the thin adapter to Spark's state API.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.ipc as ipc

from khipu.detector.clean import NONE, CleanGrid, delivered_cells, judge_clean
from khipu.detector.decide import decide, resend_of
from khipu.detector.model import (
    CommittedLookup,
    DetectorConfig,
    PointerLookup,
    RemovalLookup,
    Verdict,
    nothing_pointed_at,
    nothing_removed,
)
from khipu.detector.routes import MAX_HOPS, RoutePlan, RoutePlans
from khipu.reconcile.book import verdict_row
from khipu.trace.model import NO_ATTRIBUTES, Trace, TraceType

log = logging.getLogger(__name__)

SAFETY_MS = 3_600_000  # beyond the maximum wait a message is dropped whatever it says (a bug left it)
TRACE_FIELDS = (
    "message_id",
    "stream",
    "location",
    "cluster",
    "type",
    "timestamp_ms",
    "topic",
    "partition",
    "offset",
    "group",
    "emitter_id",
    "emitter_seq",
    "sampling_percent",
    "attributes",
)
TRACE_STATE = pa.schema(
    [
        ("message_id", pa.string()),
        ("stream", pa.string()),
        ("location", pa.string()),
        ("cluster", pa.string()),
        ("type", pa.string()),
        ("timestamp_ms", pa.int64()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("group", pa.string()),
        ("emitter_id", pa.string()),
        ("emitter_seq", pa.int64()),
        ("sampling_percent", pa.float64()),
        ("attributes", pa.string()),
        ("hop", pa.int32()),  # the global hop index (RoutePlans), -1: no hop of the registry's routes
    ]
)
MESSAGE_STATE = pa.schema(
    [
        ("message_id", pa.string()),
        ("stream", pa.string()),
        ("first_seen_ms", pa.int64()),
        ("judged", pa.bool_()),  # left the clean judge: decide judges it from now on
        ("emitted", pa.int64()),  # bit i: the verdict of the stream's hop i was emitted
        ("memo", pa.binary()),  # clean: int64 per hop, when its group was first seen past the message
        ("passed_at", pa.string()),  # judged: decide's memo, JSON
        ("next_check_ms", pa.int64()),  # judged: when decide wants to look again
    ]
)
VERDICT_COLUMNS = (
    "message_id",
    "stream",
    "hop",
    "hop_kind",
    "verdict",
    "cause",
    "count",
    "topic",
    "partition",
    "offset",
    "group",
    "location",
    "observed_ms",
    "latency_ms",
    "e2e_latency_ms",
    "decided_ms",
    "detail",
    "first_seen_ms",
    "judged_by",  # clean: by the clean judge (a fresh message's plain DELIVERED); decide: by decide
)
LogStartLookup = Callable[[str, str, int], "int | None"]  # (cluster, topic, partition) -> the partition's log start


def no_log_start(cluster: str, topic: str, partition: int) -> int | None:
    return None


@dataclass(frozen=True)
class BucketState:
    traces: pd.DataFrame  # TRACE_STATE's columns
    messages: pd.DataFrame  # MESSAGE_STATE's columns

    @staticmethod
    def empty() -> BucketState:
        return BucketState(TRACE_STATE.empty_table().to_pandas(), MESSAGE_STATE.empty_table().to_pandas())

    def encode(self) -> bytes:
        """The state as one compressed Arrow IPC stream of two tables (traces, then messages)."""
        sink = pa.BufferOutputStream()
        options = ipc.IpcWriteOptions(compression="zstd")
        for frame, schema in ((self.traces, TRACE_STATE), (self.messages, MESSAGE_STATE)):
            table = pa.Table.from_pandas(frame, schema=schema, preserve_index=False)
            with ipc.new_stream(sink, schema, options=options) as writer:
                writer.write_table(table)
        return bytes(sink.getvalue())

    @staticmethod
    def decode(blob: bytes) -> BucketState:
        source = pa.BufferReader(blob)
        traces = ipc.open_stream(source).read_all()
        messages = ipc.open_stream(source).read_all()
        return BucketState(traces.to_pandas(), messages.to_pandas())


@dataclass(frozen=True)
class Lookups:
    """What the rules ask of the world (each side-effect free as the judge sees it)."""

    committed: CommittedLookup
    log_start: LogStartLookup = no_log_start
    pointed_at: PointerLookup = nothing_pointed_at
    removed: RemovalLookup = nothing_removed
    read_to: Callable[[], int | None] | None = None  # the time up to which the trace topic is read


@dataclass(frozen=True)
class Evaluation:
    state: BucketState
    verdicts: pd.DataFrame  # VERDICT_COLUMNS
    next_check_ms: int | None  # when to evaluate the bucket again (None: nothing in flight)
    judged_messages: int = 0  # messages decide was called for
    clean_messages: int = 0  # messages the clean judge answered for
    dropped_unknown: int = 0  # messages of streams the registry does not define (dropped)
    counts: dict[str, int] = field(default_factory=dict)


class BucketJudge:
    def __init__(self, plans: RoutePlans, config: DetectorConfig) -> None:
        self.plans, self.config = plans, config
        self.by_stream = plans.by_stream
        self._hop_stream = np.full(sum(p.size for p in plans.plans), -1, dtype=np.int64)
        for number, plan in enumerate(plans.plans):
            self._hop_stream[plan.first_hop : plan.first_hop + plan.size] = number

    # -- one evaluation ------------------------------------------------------------------------------------

    def evaluate(self, state: BucketState, new: pd.DataFrame | None, now_ms: int, lookups: Lookups) -> Evaluation:
        """Add the bucket's new traces (TRACE_STATE's columns), judge what can be judged, return the new state."""
        traces = state.traces
        messages = state.messages
        touched: set[str] = set()
        if new is not None and len(new):
            new = new.loc[:, list(TRACE_STATE.names)]
            traces = pd.concat([traces, new], ignore_index=True) if len(traces) else new.reset_index(drop=True)
            arriving = new.drop_duplicates("message_id", keep="first")
            touched = set(arriving["message_id"])
            fresh = arriving[~arriving["message_id"].isin(messages["message_id"])]
            if len(fresh):
                messages = pd.concat([messages, self._new_messages(fresh, now_ms)], ignore_index=True)
        if not len(messages):
            return Evaluation(BucketState.empty(), _no_verdicts(), None)
        messages = messages.reset_index(drop=True)
        read_to = lookups.read_to() if lookups.read_to is not None else None
        clock_ms = now_ms if read_to is None else min(now_ms, read_to)

        unknown = ~messages["stream"].isin(self.by_stream).to_numpy()
        expired = (now_ms - messages["first_seen_ms"].to_numpy()) > self.config.max_wait_ms + SAFETY_MS
        index = pd.Index(messages["message_id"])
        row_message = index.get_indexer(traces["message_id"])
        judged = messages["judged"].to_numpy().copy()
        emitted = messages["emitted"].to_numpy().copy()
        memo_blobs = messages["memo"].to_numpy().copy()
        passed_at = messages["passed_at"].to_numpy().copy()
        next_check = messages["next_check_ms"].to_numpy().copy()
        turned = self._not_clean(messages, traces, row_message) & ~judged & ~unknown
        if turned.any():  # new traces made them unclean: decide takes over with what the clean judge knew
            before = _rows_by_message(
                state.traces, index.get_indexer(state.traces["message_id"]), set(np.nonzero(turned)[0].tolist())
            )
            for position in np.nonzero(turned)[0]:
                plan = self.by_stream[messages.at[position, "stream"]]
                passed_at[position] = json.dumps(
                    _memo_of_rows(plan, memo_blobs[position], before.get(int(position), []))
                )
                next_check[position] = 0
            judged |= turned
        done = unknown | expired
        frames: list[pd.DataFrame] = []
        clean_count = 0

        for plan in self.plans.plans:
            mine = np.nonzero((messages["stream"].to_numpy() == plan.stream.name) & ~judged & ~done)[0]
            if not len(mine):
                continue
            if not plan.simple:  # a message of this route may take some of its hops only: decide judges it
                judged[mine] = True
                continue
            clean_count += len(mine)
            grid = self._grid(plan, messages, traces, row_message, mine, memo_blobs, emitted, lookups, now_ms, clock_ms)
            judgement = judge_clean(plan, grid, now_ms, clock_ms, self.config)
            frames.append(self._delivered(plan, grid, judgement.deliver, messages, mine, now_ms))
            bits = (judgement.deliver.astype(np.int64) << np.arange(plan.size, dtype=np.int64)).sum(axis=1)
            emitted[mine] |= bits
            staying = judgement.in_domain
            memo_blobs[mine[staying]] = [row.tobytes() for row in judgement.memo_ms[staying]]
            done[mine[staying & judgement.done]] = True
            next_check[mine[staying]] = judgement.next_check_ms[staying]
            leaving = mine[~staying]  # decide takes them from here, with what the clean judge knew
            for local, position in zip(np.nonzero(~staying)[0], leaving, strict=True):
                passed_at[position] = json.dumps(_memo_of(plan, grid, judgement.memo_ms, int(local)))
                next_check[position] = 0
            judged[leaving] = True

        decided_by_rules = np.nonzero(
            judged & ~done & (messages["message_id"].isin(touched).to_numpy() | (next_check <= now_ms))
        )[0]
        if len(decided_by_rules):
            by_message = _rows_by_message(traces, row_message, set(decided_by_rules.tolist()))
            for position in decided_by_rules:
                verdicts, finished, memo, wanted = self._decide(
                    messages.iloc[position], by_message.get(int(position), []), emitted[position],
                    passed_at[position], now_ms, read_to, lookups,
                )  # fmt: skip
                if verdicts:
                    frames.append(_frame_of(verdicts))
                    emitted[position] |= self._bits(messages.at[position, "stream"], verdicts)
                done[position] = finished
                passed_at[position] = memo
                next_check[position] = wanted

        if expired.any():
            log.warning(
                "%d messages dropped %d ms past their maximum wait (a bug kept them)", int(expired.sum()), SAFETY_MS
            )
        keep = ~done
        kept_messages = messages.assign(judged=judged, emitted=emitted, memo=memo_blobs, passed_at=passed_at,
                                        next_check_ms=next_check)[keep].reset_index(drop=True)  # fmt: skip
        kept_traces = traces[keep[row_message]].reset_index(drop=True) if len(traces) else traces
        frames = [frame for frame in frames if len(frame)]
        verdicts = pd.concat(frames, ignore_index=True) if frames else _no_verdicts()
        wake = int(next_check[keep].min()) if keep.any() else None
        return Evaluation(
            BucketState(kept_traces, kept_messages),
            verdicts,
            None if wake is None else max(wake, now_ms + 1),
            judged_messages=len(decided_by_rules),
            clean_messages=clean_count,
            dropped_unknown=int(unknown.sum()),
        )

    # -- pieces ---------------------------------------------------------------------------------------------

    def _new_messages(self, fresh: pd.DataFrame, now_ms: int) -> pd.DataFrame:
        streams = fresh["stream"].to_numpy()
        sizes = np.asarray([self.by_stream[s].size if s in self.by_stream else 0 for s in streams], dtype=np.int64)
        return pd.DataFrame(
            {
                "message_id": fresh["message_id"].to_numpy(),
                "stream": streams,
                "first_seen_ms": np.full(len(fresh), now_ms, dtype=np.int64),
                "judged": np.zeros(len(fresh), dtype=bool),
                "emitted": np.zeros(len(fresh), dtype=np.int64),
                "memo": [np.full(size, NONE, dtype=np.int64).tobytes() for size in sizes],
                "passed_at": [None] * len(fresh),
                "next_check_ms": np.zeros(len(fresh), dtype=np.int64),
            }
        )

    def _not_clean(self, messages: pd.DataFrame, traces: pd.DataFrame, row_message: np.ndarray) -> np.ndarray:
        """Messages the clean judge cannot take: a trace of no hop of their stream's route, of another stream,
        a resend, a hop traced twice, or two positions on one topic."""
        n = len(messages)
        bad = np.zeros(n, dtype=bool)
        if not len(traces):
            return bad
        hop = traces["hop"].to_numpy().astype(np.int64)
        stream_number = {plan.stream.name: number for number, plan in enumerate(self.plans.plans)}
        message_stream = np.asarray([stream_number.get(s, -1) for s in messages["stream"].to_numpy()], dtype=np.int64)
        row_stream = np.where(hop >= 0, self._hop_stream[np.maximum(hop, 0)], -1)
        wrong = (hop < 0) | (row_stream != message_stream[row_message])
        attributes = traces["attributes"].to_numpy()
        marked = np.nonzero(pd.notna(attributes))[0]
        for row in marked:  # rare: recovery attributes, or a resend's marks
            wrong[row] |= _is_resend(traces, int(row))
        np.logical_or.at(bad, row_message[wrong], True)
        ok = ~wrong
        first = np.zeros(len(self._hop_stream), dtype=np.int64)
        for plan in self.plans.plans:
            first[plan.first_hop : plan.first_hop + plan.size] = plan.first_hop
        local = np.where(ok, hop - first[np.maximum(hop, 0)], 0)
        cell = row_message * MAX_HOPS + local
        counts = np.bincount(cell[ok], minlength=n * MAX_HOPS)
        twice = counts.reshape(n, MAX_HOPS).max(axis=1) > 1
        bad |= twice
        topic_of = np.zeros(len(self._hop_stream), dtype=np.int64)
        for plan in self.plans.plans:
            topic_of[plan.first_hop : plan.first_hop + plan.size] = plan.hop_topic
        topic_cell = (row_message * MAX_HOPS + topic_of[np.maximum(hop, 0)])[ok]
        partition = traces["partition"].to_numpy().astype(np.int64)[ok]
        offset = traces["offset"].to_numpy().astype(np.int64)[ok]
        for values in (partition, offset):
            low = np.full(n * MAX_HOPS, np.iinfo(np.int64).max, dtype=np.int64)
            high = np.full(n * MAX_HOPS, np.iinfo(np.int64).min, dtype=np.int64)
            np.minimum.at(low, topic_cell, values)
            np.maximum.at(high, topic_cell, values)
            spread = (high > low).reshape(n, MAX_HOPS).any(axis=1)
            bad |= spread
        return bad

    def _grid(
        self,
        plan: RoutePlan,
        messages: pd.DataFrame,
        traces: pd.DataFrame,
        row_message: np.ndarray,
        mine: np.ndarray,
        memo_blobs: np.ndarray,
        emitted: np.ndarray,
        lookups: Lookups,
        now_ms: int,
        clock_ms: int,
    ) -> CleanGrid:
        n, hops, topics = len(mine), plan.size, len(plan.topics)
        slot = np.full(len(messages), -1, dtype=np.int64)
        slot[mine] = np.arange(n)
        rows = np.nonzero(slot[row_message] >= 0)[0]
        m = slot[row_message[rows]]
        h = traces["hop"].to_numpy()[rows].astype(np.int64) - plan.first_hop
        t = np.asarray(plan.hop_topic, dtype=np.int64)[h]
        present = np.zeros((n, hops), dtype=bool)
        present[m, h] = True
        ts = np.full((n, hops), NONE, dtype=np.int64)
        ts[m, h] = traces["timestamp_ms"].to_numpy()[rows]
        has_position = np.zeros((n, topics), dtype=bool)
        has_position[m, t] = True
        partition = np.full((n, topics), NONE, dtype=np.int64)
        partition[m, t] = traces["partition"].to_numpy()[rows]
        offset = np.full((n, topics), NONE, dtype=np.int64)
        offset[m, t] = traces["offset"].to_numpy()[rows]
        memo = np.frombuffer(b"".join(memo_blobs[mine]), dtype=np.int64).reshape(n, hops).copy()
        done_before = ((emitted[mine][:, None] >> np.arange(hops, dtype=np.int64)) & 1).astype(bool)
        first_seen = messages["first_seen_ms"].to_numpy()[mine].astype(np.int64)
        committed = np.full((n, hops), NONE, dtype=np.int64)
        log_start = np.full((n, hops), NONE, dtype=np.int64)
        overdue = clock_ms - first_seen >= self.config.grace_ms
        for hop_number, hop in enumerate(plan.hops):
            if not plan.is_read[hop_number]:
                continue
            topic = plan.hop_topic[hop_number]
            positioned = np.nonzero(has_position[:, topic])[0]
            if not len(positioned):
                continue
            parts = partition[positioned, topic]
            for value in np.unique(parts):
                found = lookups.committed(hop.topic.cluster, hop.group or "", hop.topic.topic, int(value))
                if found is not None:
                    committed[positioned[parts == value], hop_number] = found
            unread = positioned[(committed[positioned, hop_number] <= offset[positioned, topic]) & overdue[positioned]]
            for value in np.unique(partition[unread, topic]):
                start = lookups.log_start(hop.topic.cluster, hop.topic.topic, int(value))
                if start is not None:
                    log_start[unread[partition[unread, topic] == value], hop_number] = start
        return CleanGrid(
            present, ts, has_position, partition, offset, first_seen, memo, done_before, committed, log_start
        )

    def _delivered(
        self,
        plan: RoutePlan,
        grid: CleanGrid,
        deliver: np.ndarray,
        messages: pd.DataFrame,
        mine: np.ndarray,
        now_ms: int,
    ) -> pd.DataFrame:
        cells = delivered_cells(plan, grid, deliver)
        if not len(cells.hop):
            return _no_verdicts()
        hop_id = np.asarray([h.id for h in plan.hops], dtype=object)
        kind = np.asarray([h.kind.value for h in plan.hops], dtype=object)
        topic = np.asarray([h.topic.topic for h in plan.hops], dtype=object)
        group = np.asarray([h.group for h in plan.hops], dtype=object)
        location = np.asarray([h.location for h in plan.hops], dtype=object)
        detail = np.asarray(
            ["received once" if plan.is_read[i] else "written once" for i in range(plan.size)], dtype=object
        )
        rows = mine[cells.message]
        return pd.DataFrame(
            {
                "message_id": messages["message_id"].to_numpy()[rows],
                "stream": plan.stream.name,
                "hop": hop_id[cells.hop],
                "hop_kind": kind[cells.hop],
                "verdict": "DELIVERED",
                "cause": None,
                "count": 1,
                "topic": topic[cells.hop],
                "partition": cells.partition,
                "offset": cells.offset,
                "group": group[cells.hop],
                "location": location[cells.hop],
                "observed_ms": cells.observed_ms,
                "latency_ms": _nullable(cells.latency_ms),
                "e2e_latency_ms": _nullable(cells.e2e_latency_ms),
                "decided_ms": now_ms,
                "detail": detail[cells.hop],
                "first_seen_ms": messages["first_seen_ms"].to_numpy()[rows],
                "judged_by": "clean",
            }
        )

    def _decide(
        self,
        message: pd.Series,
        rows: Sequence[Mapping[str, Any]],
        emitted: int,
        passed_at: str | None,
        now_ms: int,
        read_to: int | None,
        lookups: Lookups,
    ) -> tuple[list[Verdict], bool, str | None, int]:
        plan = self.by_stream[message["stream"]]
        traces = [_trace(row) for row in rows]
        if not traces:
            return [], True, passed_at, 0
        memo = json.loads(passed_at) if passed_at else {}
        decision = decide(
            str(message["message_id"]), plan.stream, traces, lookups.committed, memo, int(message["first_seen_ms"]),
            now_ms, self.config, lookups.pointed_at, read_to, lookups.removed,
        )  # fmt: skip
        reported = {plan.hops[i].id for i in range(plan.size) if emitted >> i & 1}
        fresh = [v for v in decision.verdicts if v.hop not in reported]
        wanted = max(int(decision.next_check_ms or now_ms), now_ms + 1)
        return fresh, decision.done, json.dumps(dict(decision.passed_at)), wanted

    def _bits(self, stream: str, verdicts: Sequence[Verdict]) -> int:
        plan = self.by_stream[stream]
        index = {hop.id: i for i, hop in enumerate(plan.hops)}
        bits = 0
        for verdict in verdicts:
            if verdict.hop in index:
                bits |= 1 << index[verdict.hop]
        return bits


def _memo_of(plan: RoutePlan, grid: CleanGrid, memo: np.ndarray, local: int) -> dict[str, int]:
    """The clean judge's memo of one message as decide keeps it: ``hop id|partition|offset`` -> ms."""
    found: dict[str, int] = {}
    for hop_number, hop in enumerate(plan.hops):
        seen = int(memo[local, hop_number])
        if seen != NONE:
            topic = plan.hop_topic[hop_number]
            found[f"{hop.id}|{int(grid.partition[local, topic])}|{int(grid.offset[local, topic])}"] = seen
    return found


def _memo_of_rows(plan: RoutePlan, blob: bytes, rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The clean judge's memo of one message (its blob) as decide keeps it, placed by the traces it had then."""
    memo = np.frombuffer(blob, dtype=np.int64) if blob else np.zeros(0, dtype=np.int64)
    positions = {(str(row["cluster"]), str(row["topic"])): (int(row["partition"]), int(row["offset"])) for row in rows}
    found: dict[str, int] = {}
    for hop_number, seen in enumerate(memo.tolist()):
        hop = plan.hops[hop_number]
        at = positions.get((hop.topic.cluster, hop.topic.topic))
        if seen != NONE and at is not None:
            found[f"{hop.id}|{at[0]}|{at[1]}"] = int(seen)
    return found


def _is_resend(traces: pd.DataFrame, row: int) -> bool:
    return resend_of(_trace(traces.iloc[row])) is not None


def _rows_by_message(
    traces: pd.DataFrame, row_message: np.ndarray, wanted: set[int]
) -> dict[int, list[dict[str, Any]]]:
    found: dict[int, list[dict[str, Any]]] = {}
    picked = np.nonzero(np.isin(row_message, list(wanted)))[0]
    if not len(picked):
        return found
    for position, record in zip(row_message[picked], traces.iloc[picked].to_dict("records"), strict=True):
        found.setdefault(int(position), []).append(record)
    return found


def _trace(row: Mapping[str, Any]) -> Trace:
    raw = row.get("attributes")
    attributes = json.loads(raw) if isinstance(raw, str) and raw else NO_ATTRIBUTES
    group = row.get("group")
    return Trace(
        str(row["message_id"]),
        str(row["stream"]),
        str(row["location"]),
        str(row["cluster"]),
        TraceType(row["type"]),
        int(row["timestamp_ms"]),
        str(row["topic"]),
        int(row["partition"]),
        int(row["offset"]),
        None if group is None or (isinstance(group, float) and np.isnan(group)) else str(group),
        str(row["emitter_id"]),
        int(row["emitter_seq"]),
        float(row["sampling_percent"]),
        attributes,
    )


def _frame_of(verdicts: Sequence[Verdict]) -> pd.DataFrame:
    rows = []
    for verdict in verdicts:
        row = verdict_row(verdict)
        rows.append({**{name: row.get(name) for name in VERDICT_COLUMNS}, "judged_by": "decide"})
    frame = pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))
    for name in ("partition", "offset", "observed_ms", "latency_ms", "e2e_latency_ms", "first_seen_ms"):
        frame[name] = pd.array(frame[name].to_numpy(dtype=object), dtype="Int64")
    return frame


def _nullable(values: np.ndarray) -> pd.arrays.IntegerArray:
    return pd.arrays.IntegerArray(np.where(values == NONE, 0, values), values == NONE)


def _no_verdicts() -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype=object) for name in VERDICT_COLUMNS})
