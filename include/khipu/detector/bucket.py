"""One bucket of messages in flight: its state, and what one evaluation of it decides.

The streaming detector keys its state by a hash bucket of message ids, not by message id: one state
read, one write and one timer per bucket and micro-batch instead of per message (every state call of
Spark's Python ``transformWithState`` is a round trip to the JVM). A bucket's state is two Arrow
tables, compressed: the traces of its messages in flight, and one row per message (when it was first
seen, which hops were reported and with how many copies, the memo of when each group was first seen past it,
when to look again).

An evaluation (:meth:`BucketJudge.evaluate`) takes the state, the bucket's new traces and the batch's
time, and decides:

- **clean messages** (:mod:`khipu.detector.clean`) all at once, with numpy;
- every other message with :func:`khipu.detector.decide.decide`, one by one, only when it has new
  traces or its own next check is due (a message leaves the clean judge for good once it does).

A decided message's rows go at once: state follows messages in flight, not traffic. Pure but for
the lookups passed in (committed offsets and their history, log starts, pointers, removals, the read-to
clock), so it is tested without Spark; :mod:`khipu.detector.processor` is the thin adapter to Spark's state API.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from khipu.detector.clean import CleanGrid, delivered_cells, judge_clean
from khipu.detector.decide import LookupUnavailable, decide, memo_key, reported_now, resend_of, to_report
from khipu.detector.model import (
    NONE,
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
from khipu.detector.routes import MAX_HOPS, TRACE_KEY_COLUMNS, RoutePlan, RoutePlans, trace_hop_key
from khipu.trace.archive import SCHEMA as ARCHIVED_TRACE
from khipu.trace.model import trace_from_columns
from khipu.verdicts.book import verdict_row
from khipu.verdicts.model import Verdict, VerdictKind

log = logging.getLogger(__name__)

SAFETY_MS = 3_600_000  # beyond the maximum wait a message is dropped whatever it says (a bug left it)
# a trace as a bucket keeps it: the trace archive's columns (but its back-pointers), and its hop
TRACE_STATE = pa.schema(
    [
        *(field for field in ARCHIVED_TRACE if field.name != "prev_offsets"),
        pa.field("hop", pa.int32()),  # the global hop index (RoutePlans), -1: no hop of the registry's routes
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
        # judged: JSON, what decide.to_report needs of each reported hop (hop id -> the copies its receipt counted,
        # -1 a LOST, null anything else), written when the message leaves the clean judge (each emitted bit is then
        # its DELIVERED, one copy); null for a judged message only in a state kept before it was
        ("reported", pa.string()),
    ]
)
# a verdict as the processor emits it: its hop by number (RoutePlans.described says the rest)
VERDICT_FIELDS = pa.schema(
    [
        ("message_id", pa.string()),
        ("hop", pa.int32()),  # the global hop number
        ("verdict", pa.string()),
        ("cause", pa.string()),
        ("count", pa.int32()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("observed_ms", pa.int64()),
        ("latency_ms", pa.int64()),
        ("e2e_latency_ms", pa.int64()),
        ("decided_ms", pa.int64()),
        ("detail", pa.string()),  # None: a plain DELIVERED's ("received once" / "written once")
        ("first_seen_ms", pa.int64()),
        # clean: by the clean judge (a fresh message's plain DELIVERED); decide: by decide; AHEAD (below)
        ("judged_by", pa.string()),
    ]
)
VERDICT_COLUMNS = tuple(VERDICT_FIELDS.names)
# judged_by of a LOST decided on the running batch's clock: the writer holds it back when a record of that batch points
# at its record (BucketJudge._decide)
AHEAD = "decide-ahead"
LogStartLookup = Callable[[str, str, int], "int | None"]  # (cluster, topic, partition) -> the partition's log start


def no_log_start(cluster: str, topic: str, partition: int) -> int | None:
    return None


RouteIds = Mapping[str, Sequence[str]]  # stream -> its hops' ids, in the order of its RoutePlan
ROUTES_KEY = b"khipu.routes"  # the messages table's metadata: the fingerprint of the routes it was kept under


def route_ids(plans: RoutePlans) -> dict[str, list[str]]:
    """Each stream's hop ids in plan order: what a bucket's hop numbers, memo and emitted bits stand for."""
    return {plan.stream.name: [hop.id for hop in plan.hops] for plan in plans.plans}


def routes_fingerprint(routes: RouteIds) -> str:
    return hashlib.sha1(json.dumps(routes, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class BucketState:
    traces: pa.Table  # TRACE_STATE
    messages: pa.Table  # MESSAGE_STATE
    routes: str | None = None  # the fingerprint of the routes its hop numbers, memos and bits follow

    @staticmethod
    def empty() -> BucketState:
        return BucketState(TRACE_STATE.empty_table(), MESSAGE_STATE.empty_table())

    def encode(self) -> bytes:
        """The state as one compressed Arrow IPC stream of two tables (traces, then messages), each one record batch:
        a table written in many chunks is many small compressed batches, slower to write and read, and a state
        decoded, grown and written again every batch would otherwise keep every chunk it was ever given."""
        sink = pa.BufferOutputStream()
        options = ipc.IpcWriteOptions(compression="zstd", use_threads=False)
        described = MESSAGE_STATE.with_metadata({ROUTES_KEY: self.routes.encode()}) if self.routes else MESSAGE_STATE
        for table, schema in ((self.traces, TRACE_STATE), (self.messages, described)):
            with ipc.new_stream(sink, schema, options=options) as writer:
                writer.write_table(table.combine_chunks().replace_schema_metadata(schema.metadata))
        return bytes(sink.getvalue())

    @staticmethod
    def decode(blob: bytes) -> BucketState:
        """The state as :meth:`encode` wrote it; a state kept by an earlier version, whose traces lack columns
        added since (trace format 3: key hash and flags), gets them as null (no key, every flag false); its
        messages lacking ``reported`` get it as null."""
        source = pa.BufferReader(blob)
        traces = ipc.open_stream(source).read_all()
        messages = ipc.open_stream(source).read_all()
        routes = (messages.schema.metadata or {}).get(ROUTES_KEY)
        if traces.schema.names != TRACE_STATE.names:
            traces = pa.table(
                {
                    field.name: traces.column(field.name)
                    if field.name in traces.schema.names
                    else pa.nulls(traces.num_rows, field.type)
                    for field in TRACE_STATE
                }
            ).cast(TRACE_STATE)
        if "reported" not in messages.schema.names:  # kept before it was: every emitted bit counts as one copy
            messages = messages.append_column(MESSAGE_STATE.field("reported"), pa.nulls(messages.num_rows, pa.string()))
        return BucketState(traces, messages.replace_schema_metadata(None), routes.decode() if routes else None)


@dataclass(frozen=True)
class Lookups:
    """What the rules ask of the world (each side-effect free as the judge sees it)."""

    committed: CommittedLookup
    log_start: LogStartLookup = no_log_start
    pointed_at: PointerLookup = nothing_pointed_at
    removed: RemovalLookup = nothing_removed
    read_to: Callable[[int], int | None] | None = None  # given the batch's time: how far the trace topic is read
    # given the batch's time: how far it will be read when the running batch ends (khipu.detector.clock)
    running_read_to: Callable[[int], int | None] | None = None
    record: RecordLookup = nothing_asked  # a record's fate in its log: its transaction's outcome, compaction
    history: CommitHistoryLookup = no_history  # when the groups' committed offsets were seen


@dataclass(frozen=True)
class Evaluation:
    state: BucketState
    verdicts: pd.DataFrame  # VERDICT_COLUMNS
    next_check_ms: int | None  # when to evaluate the bucket again (None: nothing in flight)
    judged_messages: int = 0  # messages decide was called for
    clean_messages: int = 0  # messages the clean judge answered for
    dropped_unknown: int = 0  # messages of streams the registry does not define (dropped)
    changed: bool = True  # False: the state is what it was (nothing to write back)


@dataclass
class _Messages:
    """The bucket's messages as numpy columns, worked on in place during one evaluation."""

    ids: np.ndarray  # object (str)
    stream: np.ndarray  # object (str)
    first_seen_ms: np.ndarray
    judged: np.ndarray
    emitted: np.ndarray
    memo: np.ndarray  # object (bytes)
    passed_at: np.ndarray  # object (str | None)
    next_check_ms: np.ndarray
    reported: np.ndarray  # object (str | None)

    @staticmethod
    def of(table: pa.Table) -> _Messages:
        def column(name: str) -> np.ndarray:
            return np.asarray(table.column(name).to_numpy(zero_copy_only=False)).copy()

        return _Messages(*(column(name) for name in MESSAGE_STATE.names))

    def same_as(self, other: _Messages) -> bool:
        numbers = ("judged", "emitted", "next_check_ms")
        return all(np.array_equal(getattr(self, name), getattr(other, name)) for name in numbers) and all(
            list(getattr(self, name)) == list(getattr(other, name)) for name in ("memo", "passed_at", "reported")
        )

    def table(self, keep: np.ndarray) -> pa.Table:
        columns = [self.ids, self.stream, self.first_seen_ms, self.judged, self.emitted, self.memo, self.passed_at,
                   self.next_check_ms, self.reported]  # fmt: skip
        return pa.Table.from_arrays(
            [pa.array(values[keep], type=field.type) for values, field in zip(columns, MESSAGE_STATE, strict=True)],
            schema=MESSAGE_STATE,
        )


class BucketJudge:
    def __init__(
        self, plans: RoutePlans, config: DetectorConfig, earlier_routes: Mapping[str, RouteIds] | None = None
    ) -> None:
        """``earlier_routes``: the routes states may have been kept under before (by fingerprint), so that state
        written before a registry change is read under the new routes (:meth:`_under_current_routes`)."""
        self.plans, self.config = plans, config
        self.routes = route_ids(plans)
        self.fingerprint = routes_fingerprint(self.routes)
        self.earlier_routes = earlier_routes or {}
        self.by_stream = plans.by_stream
        size = sum(p.size for p in plans.plans)
        self._hop_stream = np.full(size, -1, dtype=np.int64)
        self._first_hop = np.zeros(size, dtype=np.int64)
        self._hop_topic = np.zeros(size, dtype=np.int64)
        for number, plan in enumerate(plans.plans):
            hops = slice(plan.first_hop, plan.first_hop + plan.size)
            self._hop_stream[hops] = number
            self._first_hop[hops] = plan.first_hop
            self._hop_topic[hops] = plan.hop_topic
        self._stream_number = {plan.stream.name: number for number, plan in enumerate(plans.plans)}
        self._hop_number = plans.numbers()
        self._blank_memo = {
            plan.stream.name: np.full(plan.size, NONE, dtype=np.int64).tobytes() for plan in plans.plans
        }

    # -- one evaluation ------------------------------------------------------------------------------------

    def evaluate(
        self, state: BucketState, new: pa.Table | pd.DataFrame | None, now_ms: int, lookups: Lookups
    ) -> Evaluation:
        """Add the bucket's new traces (TRACE_STATE's columns), judge what can be judged, return the new state."""
        migrated = state.routes is not None and state.routes != self.fingerprint and state.messages.num_rows > 0
        if migrated:
            state = self._under_current_routes(state)
        traces, table = state.traces, state.messages
        arriving = pa.array([], pa.string())
        if new is not None and len(new):
            if isinstance(new, pd.DataFrame):
                new = pa.Table.from_pandas(
                    new.loc[:, list(TRACE_STATE.names)], schema=TRACE_STATE, preserve_index=False
                )
            new = new.select(list(TRACE_STATE.names)).cast(TRACE_STATE)
            traces = pa.concat_tables([traces, new]) if traces.num_rows else new
            arriving = pc.unique(new.column("message_id"))
            fresh = arriving.filter(pc.invert(pc.is_in(arriving, value_set=table.column("message_id"))))
            if len(fresh):
                table = pa.concat_tables([table, self._new_messages(new, fresh, now_ms)])
        if not table.num_rows:
            return Evaluation(BucketState.empty(), _no_verdicts(), None)
        messages = _Messages.of(table)
        as_stored = _Messages.of(table) if new is None or not len(new) else None  # to tell whether anything changed
        read_to = lookups.read_to(now_ms) if lookups.read_to is not None else None
        running = lookups.running_read_to(now_ms) if lookups.running_read_to is not None else None
        ahead = read_to is not None and running is not None and running > read_to
        if ahead:  # on the running batch's clock: its own back-pointers are not stored yet (see _decide)
            read_to = running
        clock_ms = now_ms if read_to is None else min(now_ms, read_to)
        touched = pc.is_in(table.column("message_id"), value_set=arriving).to_numpy(zero_copy_only=False)

        unknown = np.asarray([s not in self.by_stream for s in messages.stream], dtype=bool)
        expired = (now_ms - messages.first_seen_ms) > self.config.max_wait_ms + SAFETY_MS
        ids = table.column("message_id")
        row_message = pc.index_in(traces.column("message_id"), value_set=ids).to_numpy(zero_copy_only=False)
        row_message = row_message.astype(np.int64)
        turned = self._not_clean(messages, traces, row_message) & ~messages.judged & ~unknown
        if turned.any():  # new traces made them unclean: decide takes over with what the clean judge knew
            before_rows = pc.index_in(state.traces.column("message_id"), value_set=ids).to_numpy(zero_copy_only=False)
            before = _rows_by_message(state.traces, before_rows.astype(np.int64), set(np.nonzero(turned)[0].tolist()))
            for position in np.nonzero(turned)[0]:
                plan = self.by_stream[messages.stream[position]]
                rows = before.get(int(position), [])
                messages.passed_at[position] = json.dumps(_memo_of_rows(plan, messages.memo[position], rows))
                messages.reported[position] = _reported_by_clean(plan, int(messages.emitted[position]))
                messages.next_check_ms[position] = 0
            messages.judged |= turned
        done = unknown | expired
        frames: list[pd.DataFrame] = []
        clean_count = 0

        for plan in self.plans.plans:
            mine = np.nonzero((messages.stream == plan.stream.name) & ~messages.judged & ~done)[0]
            if not len(mine):
                continue
            if not plan.simple:  # a message of this route may take some of its hops only: decide judges it
                messages.judged[mine] = True
                continue
            clean_count += len(mine)
            grid = self._grid(plan, messages, traces, row_message, mine, lookups, clock_ms)
            judgement = judge_clean(plan, grid, now_ms, clock_ms, self.config)
            frames.append(self._delivered(plan, grid, judgement.deliver, messages, mine, now_ms))
            bits = (judgement.deliver.astype(np.int64) << np.arange(plan.size, dtype=np.int64)).sum(axis=1)
            messages.emitted[mine] |= bits
            staying = judgement.in_domain
            memo = judgement.memo_ms[staying]
            messages.memo[mine[staying]] = [row.tobytes() for row in memo]
            done[mine[staying & judgement.done]] = True
            messages.next_check_ms[mine[staying]] = judgement.next_check_ms[staying]
            leaving = mine[~staying]  # decide takes them from here, with what the clean judge knew
            for local, position in zip(np.nonzero(~staying)[0], leaving, strict=True):
                messages.passed_at[position] = json.dumps(_memo_of(plan, grid, judgement.memo_ms, int(local)))
                messages.reported[position] = _reported_by_clean(plan, int(messages.emitted[position]))
                messages.next_check_ms[position] = 0
            messages.judged[leaving] = True

        by_rules = np.nonzero(messages.judged & ~done & (touched | (messages.next_check_ms <= now_ms)))[0]
        if len(by_rules):
            by_message = _rows_by_message(traces, row_message, set(by_rules.tolist()))
            waiting: list[str] = []
            for position in by_rules:
                try:
                    verdicts, finished, memo_text, wanted, reported = self._decide(
                        messages, int(position), by_message.get(int(position), []), now_ms, read_to, lookups, ahead
                    )
                except LookupUnavailable as exc:  # nobody answered: the message waits as it was, asked again soon
                    waiting.append(str(exc))
                    messages.next_check_ms[position] = now_ms + max(self.config.recheck_ms, 1)
                    continue
                if verdicts:
                    frames.append(_frame_of(verdicts, self._hop_number, ahead))
                    messages.emitted[position] |= self._bits(messages.stream[position], verdicts)
                    messages.reported[position] = reported
                done[position] = finished
                messages.passed_at[position] = memo_text
                messages.next_check_ms[position] = wanted
            if waiting:
                log.warning("%d messages wait, a lookup could not ask: %s", len(waiting), waiting[-1])

        if expired.any():
            log.warning(
                "%d messages dropped %d ms past their maximum wait (a bug kept them)", int(expired.sum()), SAFETY_MS
            )
        keep = ~done
        kept_traces = traces.filter(pa.array(keep[row_message])) if traces.num_rows else traces
        frames = [frame for frame in frames if len(frame)]
        verdicts = pd.concat(frames, ignore_index=True) if frames else _no_verdicts()
        wake = int(messages.next_check_ms[keep].min()) if keep.any() else None
        changed = migrated or as_stored is None or bool(done.any()) or not messages.same_as(as_stored)
        return Evaluation(
            BucketState(kept_traces, messages.table(keep), self.fingerprint) if changed else state,
            verdicts,
            None if wake is None else max(wake, now_ms + 1),
            judged_messages=len(by_rules),
            clean_messages=clean_count,
            dropped_unknown=int(unknown.sum()),
            changed=changed,
        )

    def restated(self, state: BucketState) -> BucketState:
        """The state under the current routes: as it is when kept under them (or before routes were recorded),
        else restated as :meth:`evaluate` would at its next evaluation (:meth:`_under_current_routes`)."""
        if state.routes is None or state.routes == self.fingerprint or not state.messages.num_rows:
            return state
        return self._under_current_routes(state)

    # -- pieces ---------------------------------------------------------------------------------------------

    def _under_current_routes(self, state: BucketState) -> BucketState:
        """A state kept under other routes (the registry changed since), restated under the current ones: each
        trace's hop number found again from its own fields, each message's emitted bits and clean memo moved
        to where its hops (by id) are now, and every message looked at again at once. Hops a route no longer
        has are forgotten; a message of a stream no longer defined is dropped by the evaluation."""
        earlier = self.earlier_routes.get(state.routes or "")
        if earlier is None:
            log.warning(
                "bucket state kept under routes %s, which this detector does not know: its messages' reported "
                "hops and memos are forgotten (a hop may be reported again; the store settles it)",
                state.routes,
            )
        traces = state.traces
        rows = traces.select(list(TRACE_KEY_COLUMNS)).to_pylist()  # a registry change is rare: Python per row
        keys = pa.array([trace_hop_key(row) for row in rows], pa.string())
        known = self.plans.hop_keys()
        found = pc.index_in(keys, value_set=pa.array(list(known), pa.string()))
        hops = pc.fill_null(pc.take(pa.array(list(known.values()), pa.int32()), found), -1)
        traces = traces.set_column(traces.schema.get_field_index("hop"), "hop", hops)
        messages = _Messages.of(state.messages)
        for position, stream in enumerate(messages.stream):
            plan = self.by_stream.get(stream)
            if plan is None:
                continue
            now_at = {hop_id: local for local, hop_id in enumerate(self.routes[stream])}
            before = list(earlier.get(stream, [])) if earlier is not None else []
            moved = [(local, now_at.get(hop_id)) for local, hop_id in enumerate(before)]
            bits, emitted = 0, int(messages.emitted[position])
            for old, new in moved:
                if new is not None and emitted >> old & 1:
                    bits |= 1 << new
            messages.emitted[position] = bits
            memo = np.full(plan.size, NONE, dtype=np.int64)
            blob = messages.memo[position]
            old_memo = np.frombuffer(blob, dtype=np.int64) if blob else np.zeros(0, dtype=np.int64)
            for old, new in moved:
                if new is not None and old < len(old_memo):
                    memo[new] = old_memo[old]
            messages.memo[position] = memo.tobytes()
            messages.next_check_ms[position] = 0
        everyone = np.ones(len(messages.ids), dtype=bool)
        return BucketState(traces, messages.table(everyone), self.fingerprint)

    def _new_messages(self, new: pa.Table, fresh: pa.Array, now_ms: int) -> pa.Table:
        """Rows for messages first seen now; a message's stream is its first trace's."""
        first = pc.index_in(fresh, value_set=new.column("message_id"))
        streams = new.column("stream").take(first).to_pylist()
        n = len(fresh)
        return pa.Table.from_arrays(
            [
                fresh,
                pa.array(streams, pa.string()),
                pa.array(np.full(n, now_ms, dtype=np.int64)),
                pa.array(np.zeros(n, dtype=bool)),
                pa.array(np.zeros(n, dtype=np.int64)),
                pa.array([self._blank_memo.get(stream, b"") for stream in streams], pa.binary()),
                pa.nulls(n, pa.string()),
                pa.array(np.zeros(n, dtype=np.int64)),
                pa.nulls(n, pa.string()),
            ],
            schema=MESSAGE_STATE,
        )

    def _not_clean(self, messages: _Messages, traces: pa.Table, row_message: np.ndarray) -> np.ndarray:
        """Messages the clean judge cannot take: a trace of no hop of their stream's route, of another stream,
        a resend, a hop traced twice, or two positions on one topic."""
        n = len(messages.ids)
        bad = np.zeros(n, dtype=bool)
        if not traces.num_rows:
            return bad
        hop = traces.column("hop").to_numpy(zero_copy_only=False).astype(np.int64)
        message_stream = np.asarray([self._stream_number.get(s, -1) for s in messages.stream], dtype=np.int64)
        row_stream = np.where(hop >= 0, self._hop_stream[np.maximum(hop, 0)], -1)
        wrong = (hop < 0) | (row_stream != message_stream[row_message])
        marked = np.nonzero(traces.column("attributes").is_valid().to_numpy(zero_copy_only=False))[0]
        if len(marked):  # rare: recovery attributes, or a resend's marks
            for row, record in zip(marked, traces.take(marked).to_pylist(), strict=True):
                wrong[row] |= resend_of(trace_from_columns(record)) is not None
        np.logical_or.at(bad, row_message[wrong], True)
        ok = ~wrong
        local = np.where(ok, hop - self._first_hop[np.maximum(hop, 0)], 0)
        cell = row_message * MAX_HOPS + local
        counts = np.bincount(cell[ok], minlength=n * MAX_HOPS)
        bad |= counts.reshape(n, MAX_HOPS).max(axis=1) > 1
        topic_cell = (row_message * MAX_HOPS + self._hop_topic[np.maximum(hop, 0)])[ok]
        for name in ("partition", "offset"):
            values = traces.column(name).to_numpy(zero_copy_only=False).astype(np.int64)[ok]
            low = np.full(n * MAX_HOPS, np.iinfo(np.int64).max, dtype=np.int64)
            high = np.full(n * MAX_HOPS, np.iinfo(np.int64).min, dtype=np.int64)
            np.minimum.at(low, topic_cell, values)
            np.maximum.at(high, topic_cell, values)
            bad |= (high > low).reshape(n, MAX_HOPS).any(axis=1)
        return bad

    def _grid(
        self,
        plan: RoutePlan,
        messages: _Messages,
        traces: pa.Table,
        row_message: np.ndarray,
        mine: np.ndarray,
        lookups: Lookups,
        clock_ms: int,
    ) -> CleanGrid:
        n, hops, topics = len(mine), plan.size, len(plan.topics)
        slot = np.full(len(messages.ids), -1, dtype=np.int64)
        slot[mine] = np.arange(n)
        rows = np.nonzero(slot[row_message] >= 0)[0]
        m = slot[row_message[rows]]

        def column(name: str) -> np.ndarray:
            return np.asarray(traces.column(name).to_numpy(zero_copy_only=False))[rows].astype(np.int64)

        h = column("hop") - plan.first_hop
        t = np.asarray(plan.hop_topic, dtype=np.int64)[h]
        present = np.zeros((n, hops), dtype=bool)
        present[m, h] = True
        ts = np.full((n, hops), NONE, dtype=np.int64)
        ts[m, h] = column("timestamp_ms")
        has_position = np.zeros((n, topics), dtype=bool)
        has_position[m, t] = True
        partition = np.full((n, topics), NONE, dtype=np.int64)
        partition[m, t] = column("partition")
        offset = np.full((n, topics), NONE, dtype=np.int64)
        offset[m, t] = column("offset")

        def flag(name: str) -> np.ndarray:
            return np.asarray(traces.column(name).fill_null(False).to_numpy(zero_copy_only=False))[rows].astype(bool)

        sent = ~np.asarray(plan.is_read, dtype=bool)[h]
        transactional = np.zeros((n, topics), dtype=bool)
        transactional[m[sent], t[sent]] = flag("transactional")[sent]
        read_uncommitted = flag("read_uncommitted")
        uncommitted = np.zeros((n, hops), dtype=bool)
        uncommitted[m[~sent], h[~sent]] = read_uncommitted[~sent]
        committed_read = np.zeros((n, topics), dtype=bool)
        committed_read[m[~sent & ~read_uncommitted], t[~sent & ~read_uncommitted]] = True
        memo = np.frombuffer(b"".join(messages.memo[mine]), dtype=np.int64).reshape(n, hops).copy()
        done_before = ((messages.emitted[mine][:, None] >> np.arange(hops, dtype=np.int64)) & 1).astype(bool)
        first_seen = messages.first_seen_ms[mine].astype(np.int64)
        committed = np.full((n, hops), NONE, dtype=np.int64)
        passed_since = np.full((n, hops), NONE, dtype=np.int64)
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
                here = positioned[parts == value]
                found = lookups.committed(hop.topic.cluster, hop.group or "", hop.topic.topic, int(value))
                if found is not None:
                    committed[here, hop_number] = found
                history = lookups.history(hop.topic.cluster, hop.group or "", hop.topic.topic, int(value))
                if history is not None:
                    passed_since[here, hop_number] = history.passed_since_all(offset[here, topic])
            unread = positioned[(committed[positioned, hop_number] <= offset[positioned, topic]) & overdue[positioned]]
            for value in np.unique(partition[unread, topic]):
                start = lookups.log_start(hop.topic.cluster, hop.topic.topic, int(value))
                if start is not None:
                    log_start[unread[partition[unread, topic] == value], hop_number] = start
        return CleanGrid(
            present, ts, has_position, partition, offset, first_seen, memo, done_before, committed, log_start,
            transactional, committed_read, uncommitted, passed_since,
        )  # fmt: skip

    def _delivered(
        self,
        plan: RoutePlan,
        grid: CleanGrid,
        deliver: np.ndarray,
        messages: _Messages,
        mine: np.ndarray,
        now_ms: int,
    ) -> pd.DataFrame:
        cells = delivered_cells(plan, grid, deliver)
        if not len(cells.hop):
            return _no_verdicts()
        rows = mine[cells.message]
        return pd.DataFrame(
            {
                "message_id": messages.ids[rows],
                "hop": cells.hop + plan.first_hop,
                "verdict": "DELIVERED",
                "cause": None,
                "count": 1,
                "partition": cells.partition,
                "offset": cells.offset,
                "observed_ms": cells.observed_ms,
                "latency_ms": _nullable(cells.latency_ms),
                "e2e_latency_ms": _nullable(cells.e2e_latency_ms),
                "decided_ms": now_ms,
                "detail": None,
                "first_seen_ms": messages.first_seen_ms[rows],
                "judged_by": "clean",
            }
        )

    def _decide(
        self,
        messages: _Messages,
        position: int,
        rows: Sequence[Mapping[str, Any]],
        now_ms: int,
        read_to: int | None,
        lookups: Lookups,
        ahead: bool = False,
    ) -> tuple[list[Verdict], bool, str | None, int, str | None]:
        """Decide one message: (what to report, whether it is decided, decide's memo, when to look again, what has
        been reported of it then).

        ``ahead``: ``read_to`` is the running batch's clock (:func:`khipu.detector.clock.running_read_to_ms`),
        whose own back-pointers are stored only after it. A LOST reported on it is marked ``ahead`` (the writer
        holds it back when a record of the batch points at its record: :func:`khipu.detector.outputs.held_back`)
        and the message stays for one more evaluation, in the next batch, on the pointers stored by then: a
        pointer found makes the hop TRACE_LOST, which a LOST reported is always reported again as
        (:func:`khipu.detector.decide.to_report`); the same LOST again is not reported twice."""
        plan = self.by_stream[messages.stream[position]]
        passed_at = messages.passed_at[position]
        traces = [trace_from_columns(row) for row in rows]
        if not traces:
            return [], True, passed_at, 0, messages.reported[position]
        memo = json.loads(passed_at) if passed_at else {}
        decision = decide(
            str(messages.ids[position]), plan.stream, traces, lookups.committed, memo,
            int(messages.first_seen_ms[position]), now_ms, self.config, lookups.pointed_at, read_to, lookups.removed,
            lookups.record, lookups.history,
        )  # fmt: skip
        emitted = int(messages.emitted[position])
        said = messages.reported[position]
        reported: dict[str, int | None] = (  # kept before it was: what each emitted hop said is not known
            json.loads(said) if said else {plan.hops[i].id: None for i in range(plan.size) if emitted >> i & 1}
        )
        fresh = to_report(decision.verdicts, reported)
        wanted = max(int(decision.next_check_ms or now_ms), now_ms + 1)
        now_said = json.dumps(reported_now(reported, fresh)) if fresh else said
        unconfirmed = ahead and any(v.kind is VerdictKind.LOST for v in fresh)
        if unconfirmed:
            wanted = now_ms + 1
        done = decision.done and not unconfirmed
        return fresh, done, json.dumps(dict(decision.passed_at)), wanted, now_said

    def _bits(self, stream: str, verdicts: Sequence[Verdict]) -> int:
        plan = self.by_stream[stream]
        index = {hop.id: i for i, hop in enumerate(plan.hops)}
        bits = 0
        for verdict in verdicts:
            if verdict.hop in index:
                bits |= 1 << index[verdict.hop]
        return bits


def _reported_by_clean(plan: RoutePlan, emitted: int) -> str:
    """What the clean judge reported of a message leaving it, as decide.to_report reads it: DELIVERED, one copy, for
    each emitted hop (it reports nothing else)."""
    return json.dumps({plan.hops[i].id: 1 for i in range(plan.size) if emitted >> i & 1})


def _memo_of(plan: RoutePlan, grid: CleanGrid, memo: np.ndarray, local: int) -> dict[str, int]:
    """The clean judge's memo of one message as decide keeps it: ``hop id|partition|offset`` -> ms."""
    found: dict[str, int] = {}
    for hop_number, hop in enumerate(plan.hops):
        seen = int(memo[local, hop_number])
        if seen != NONE:
            topic = plan.hop_topic[hop_number]
            found[memo_key(hop, (int(grid.partition[local, topic]), int(grid.offset[local, topic])))] = seen
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
            found[memo_key(hop, at)] = int(seen)
    return found


def _rows_by_message(traces: pa.Table, row_message: np.ndarray, wanted: set[int]) -> dict[int, list[dict[str, Any]]]:
    found: dict[int, list[dict[str, Any]]] = {}
    picked = np.nonzero(np.isin(row_message, list(wanted)))[0]
    if not len(picked):
        return found
    for position, record in zip(row_message[picked], traces.take(picked).to_pylist(), strict=True):
        found.setdefault(int(position), []).append(record)
    return found


def _frame_of(verdicts: Sequence[Verdict], numbers: Mapping[tuple[str, str], int], ahead: bool = False) -> pd.DataFrame:
    """``ahead``: decided on the running batch's clock; its LOST verdicts say so (:data:`AHEAD`)."""
    rows = []
    for verdict in verdicts:
        row = verdict_row(verdict)
        hop = numbers[(verdict.stream, verdict.hop)]
        by = AHEAD if ahead and verdict.kind is VerdictKind.LOST else "decide"
        rows.append({**{name: row.get(name) for name in VERDICT_COLUMNS}, "hop": hop, "judged_by": by})
    frame = pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))
    for name in ("partition", "offset", "observed_ms", "latency_ms", "e2e_latency_ms", "first_seen_ms"):
        frame[name] = pd.array(frame[name].to_numpy(dtype=object), dtype="Int64")
    return frame


def _nullable(values: np.ndarray) -> pd.arrays.IntegerArray:
    return pd.arrays.IntegerArray(np.where(values == NONE, 0, values), values == NONE)


def _no_verdicts() -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype=object) for name in VERDICT_COLUMNS})
