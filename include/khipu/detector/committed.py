"""What the detector asks of the clusters: committed offsets (the broker first, the snapshot store when it cannot
answer) and when each was first seen (:class:`CommitHistories`), log starts (the snapshot store when fresh, the
broker otherwise), and what a record's log says of it (its transaction's outcome, compaction: :class:`RecordFates`);
stream progress and back-pointers from the store.

One provider per Python worker, cached per (cluster, group) for ``cache_ms``: deciding a
micro-batch of messages costs a few group lookups, not one per message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from confluent_kafka import KafkaException
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError

from khipu.detector.decide import Lookups, LookupUnavailable
from khipu.detector.model import CommitHistory, RecordFate, RecordState, Removal
from khipu.kafka import KafkaAdmin, KafkaConnection, KafkaUnavailable, TopicRetention
from khipu.kafka.records import Isolation, LogReader
from khipu.store import RemovalEvidence, Store
from khipu.store.engine import StoreUnavailable
from khipu.trace import keys

log = logging.getLogger(__name__)

# what a store that is restarting or unreachable raises; anything else is a fault of ours and fails the batch
STORE_UNAVAILABLE = (
    StoreUnavailable,
    OperationalError,
    InterfaceError,
    DisconnectionError,
    TimeoutError,
    ConnectionError,
)
# what a cluster that does not answer raises: the client's own errors, and a request that timed out
CLUSTER_UNAVAILABLE = (KafkaUnavailable, KafkaException, TimeoutError, ConnectionError)
FIRST_RETRY_MS, MOST_RETRY_MS = 1_000, 30_000  # the back-off's bounds


class Backoff:
    """Whom not to ask for a while: a source (a cluster, the store) that did not answer is asked again after
    ``first_ms``, then twice as long after each further failure, never more than ``most_ms``; at once again
    after it answers. Each failure and the recovery are logged with how long it has been and how many tries."""

    def __init__(self, what: str, first_ms: int = FIRST_RETRY_MS, most_ms: int = MOST_RETRY_MS) -> None:
        self.what, self.first_ms, self.most_ms = what, first_ms, most_ms
        self._failing: dict[str, tuple[int, int, int, int, str]] = {}  # key -> since, last, delay, failures, why

    def quiet(self, key: str, now_ms: int) -> str | None:
        """Why ``key`` is not asked now (it failed less than its delay ago), or None: ask it."""
        failing = self._failing.get(key)
        if failing is None or now_ms - failing[1] >= failing[2]:
            return None
        since, _, _, failures, why = failing
        return f"no answer for {(now_ms - since) / 1000:.0f} s ({failures} tries; asked again soon): {why}"

    def failed(self, key: str, now_ms: int, why: str) -> None:
        since, _, delay, failures, _ = self._failing.get(key, (now_ms, now_ms, 0, 0, why))
        delay = min(self.most_ms, max(self.first_ms, 2 * delay))
        self._failing[key] = (since, now_ms, delay, failures + 1, why)
        log.warning("%s %s did not answer (try %d, %.0f s so far; next in %.0f s): %s; what it decides waits",
                    self.what, key, failures + 1, (now_ms - since) / 1000, delay / 1000, why)  # fmt: skip

    def answered(self, key: str, now_ms: int) -> None:
        failing = self._failing.pop(key, None)
        if failing is not None:
            log.warning("%s %s answers again after %.0f s and %d failed tries", self.what, key,
                        (now_ms - failing[0]) / 1000, failing[3])  # fmt: skip

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_failing": {}}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


THE_STORE = "(the store)"  # how an executor's unanswered ask of the store is counted beside the clusters'


class StreamReadProgress:
    """``read_to(batch_ms)``: the time up to which every named query has read its whole input, read from the store
    once per micro-batch (``batch_ms``, the batch's time, keys the cache: the writer records the figure before
    the batch runs); 0 until known: a detector that does not know how far it has read decides nothing yet.
    :meth:`running`: how far the batch now running will have read it when it ends, read with it.
    ``not_answered`` (:meth:`ClusterClients.not_answered`) is told of each ask the store did not answer, so the
    driver's log says so: executors that cannot reach the store decide nothing, and must not look healthy."""

    def __init__(
        self, store_url: str, query_names: tuple[str, ...], not_answered: Callable[[str], None] | None = None
    ) -> None:
        self.store_url, self.query_names, self.not_answered = store_url, query_names, not_answered
        self._store: Store | None = None
        self._cached: tuple[int | None, int, int | None] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_store=None, _cached=None)
        return state

    def __call__(self, batch_ms: int | None = None) -> int | None:
        return self._read(batch_ms)[1]

    def running(self, batch_ms: int | None = None) -> int | None:
        """How far every named query's running batch will have read its input (None: not known for one of them)."""
        return self._read(batch_ms)[2]

    def _read(self, batch_ms: int | None) -> tuple[int | None, int, int | None]:
        if self._cached is None or batch_ms is None or self._cached[0] != batch_ms:
            if self._store is None:
                self._store = Store(self.store_url)
            heartbeat = self._store.heartbeat
            try:
                found = min(heartbeat.read_to_ms(name) or 0 for name in self.query_names)
            except Exception as exc:  # unknown progress: decide on nothing yet rather than too early
                log.warning("stream progress of %s unavailable: %s", ", ".join(self.query_names), exc)
                found = 0
                if self.not_answered is not None:
                    self.not_answered(THE_STORE)
            try:
                running = [heartbeat.running_read_to_ms(name) for name in self.query_names]
                ahead = None if None in running else min(r for r in running if r is not None)
            except Exception as exc:  # decide on what the finished batches read, as without it
                log.warning("how far the running batch of %s reads unavailable: %s", ", ".join(self.query_names), exc)
                ahead = None
            self._cached = (batch_ms, found, ahead)
        return self._cached


class PointedPositions:
    """``pointed_at(location, cluster, topic, partition, offset)``: whether an emitter at ``location`` said
    it received that record, from the pointers the archive query records (asked only for a would-be
    LOST, so rarely). A store that cannot answer raises :class:`LookupUnavailable` (the message waits and
    is asked about again, the store with a bounded back-off): answering "no" would turn a lost trace into a
    false LOST."""

    def __init__(self, store_url: str, not_answered: Callable[[str], None] | None = None) -> None:
        self.store_url, self.not_answered = store_url, not_answered
        self._store: Store | None = None
        self._backoff = Backoff("the store")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_store=None, _backoff=Backoff("the store"))
        return state

    def __call__(self, location: str, cluster: str, topic: str, partition: int, offset: int) -> bool:
        now = _now_ms()
        quiet = self._backoff.quiet("(pointers)", now)
        if quiet is not None:
            raise LookupUnavailable(f"the store: {quiet}")
        if self._store is None:
            self._store = Store(self.store_url)
        try:
            found = self._store.channel.pointed_at(location, cluster, topic, partition, offset)
        except STORE_UNAVAILABLE as exc:
            if self.not_answered is not None:
                self.not_answered(THE_STORE)
            self._backoff.failed("(pointers)", _now_ms(), _reason(exc))  # its delay runs from when the wait ended
            raise LookupUnavailable(f"the store did not answer: {_reason(exc)}") from exc
        self._backoff.answered("(pointers)", now)
        return found


class ClusterClients:
    """One admin client per cluster and one store, built lazily where they are used (on executors) and never
    pickled live: shared by the lookups below, so a worker holds one client per cluster, not one per lookup."""

    def __init__(
        self, clusters: Mapping[str, KafkaConnection], store_url: str | None = None, timeout_s: float = 10.0
    ) -> None:
        self.clusters, self.store_url, self.timeout_s = dict(clusters), store_url, timeout_s
        self._admins: dict[str, KafkaAdmin] = {}
        self._store: Store | None = None
        self._unanswered: dict[str, int] = {}  # cluster -> asks it did not answer, since they were last taken

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_admins={}, _store=None, _unanswered={})
        return state

    def not_answered(self, cluster: str) -> None:
        """A lookup asked ``cluster`` and got no answer (an error, a request that timed out)."""
        self._unanswered[cluster] = self._unanswered.get(cluster, 0) + 1

    def take_unanswered(self) -> dict[str, int]:
        """The asks each cluster did not answer since the last call: the processor hands them to the driver, whose
        log says which cluster the executors' lookups could not reach (their own logs stay on the executors)."""
        taken, self._unanswered = self._unanswered, {}
        return taken

    def admin(self, cluster: str) -> KafkaAdmin | None:
        """The cluster's admin client; None when no connection names it."""
        connection = self.clusters.get(cluster)
        if connection is None:
            return None
        if cluster not in self._admins:
            self._admins[cluster] = KafkaAdmin(connection, timeout_s=self.timeout_s)
        return self._admins[cluster]

    def store(self) -> Store | None:
        if not self.store_url:
            return None
        if self._store is None:
            self._store = Store(self.store_url)
        return self._store


HISTORY_KEEP_MS = 3_600_000  # how long a worker remembers a committed offset after it last changed


class CommitHistories:
    """Every committed offset a Python worker was told, per (cluster's bootstrap servers, group, topic, partition),
    with when it was first told (after the answer came: the commit was made by then, on this worker's clock): the
    :class:`khipu.detector.model.CommitHistory` the rules start a group's grace from. Only changes are kept (the
    first sight of each offset), each for ``keep_ms`` after the partition's latest change (forgetting only makes a
    wait longer). An offset lower than the last one seen (a rewind, a topic made again) starts the partition's history
    over, and a partition a group's answer no longer names (its topic deleted) is forgotten: before either, the history
    would say the group was past records it has not read. (A history older than a record's write is not used for it
    either: :func:`khipu.detector.decide.first_seen_past_ms`.)

    A worker keeps one (:data:`WORKER_HISTORIES`) across the tasks it runs, so a history outlives one micro-batch;
    a worker started afresh starts with none, and the rules fall back to the time they first see the commit."""

    def __init__(self, keep_ms: int = HISTORY_KEEP_MS) -> None:
        self.keep_ms = keep_ms
        self._seen: dict[tuple[str, str], dict[tuple[str, int], tuple[list[int], list[int]]]] = {}
        self._built: dict[tuple[str, str, str, int], CommitHistory] = {}

    def saw(self, where: str, group: str, offsets: Mapping[tuple[str, int], int], at_ms: int) -> None:
        """The group's committed offsets as an answer gave them at ``at_ms`` (an empty answer says nothing: a group
        not known, or a cluster that did not answer)."""
        if not offsets:
            return
        partitions = self._seen.setdefault((where, group), {})
        for gone in [position for position in partitions if position not in offsets]:
            del partitions[gone]
            self._built.pop((where, group, *gone), None)
        for (topic, partition), committed in offsets.items():
            times, values = partitions.setdefault((topic, partition), ([], []))
            if values and committed == values[-1]:
                continue
            if values and (committed < values[-1] or at_ms < times[-1]):  # went back: what it said no longer holds
                times.clear()
                values.clear()
            times.append(at_ms)
            values.append(committed)
            if at_ms - times[0] > self.keep_ms:
                kept = next(i for i, t in enumerate(times) if at_ms - t <= self.keep_ms)
                del times[:kept], values[:kept]
            self._built.pop((where, group, topic, partition), None)

    def history(self, where: str, group: str, topic: str, partition: int) -> CommitHistory | None:
        key = (where, group, topic, partition)
        if key not in self._built:
            seen = self._seen.get((where, group), {}).get((topic, partition))
            if not seen or not seen[0]:
                return None
            self._built[key] = CommitHistory(np.asarray(seen[0], dtype=np.int64), np.asarray(seen[1], dtype=np.int64))
        return self._built[key]


WORKER_HISTORIES = CommitHistories()  # this process's (a Spark Python worker runs one task after another)


class CommittedOffsets:
    """``lookup(cluster, group, topic, partition)`` -> the group's committed offset, or None when unknown.

    Asked of the broker (OffsetFetch, cached ``cache_ms`` per group): a commit is seen within seconds, which is
    what LOST's latency rests on. When the broker cannot answer, the offset-snapshot store's newest snapshot
    stands in if it is fresh (``store_fresh_ms``); otherwise the offsets are unknown (None) and messages wait:
    a lookup that fails is never read as "not committed". A cluster that does not answer (an error, a request
    timing out) is asked again with a bounded back-off (:class:`Backoff`), so a frozen broker costs one timeout
    per back-off, not one per group and batch."""

    def __init__(
        self,
        clients: ClusterClients,
        store_fresh_ms: int = 15_000,
        cache_ms: int = 2_000,
        clock_ms: Any = None,
        histories: CommitHistories | None = None,
    ) -> None:
        self.clients = clients
        self.store_fresh_ms = store_fresh_ms
        self.cache_ms = cache_ms
        self._clock_ms = clock_ms
        self._cache: dict[tuple[str, str], tuple[int, dict[tuple[str, int], int]]] = {}
        self._backoff = Backoff("cluster")
        self._histories = histories  # None: the worker's own (WORKER_HISTORIES)

    def __getstate__(self) -> dict[str, Any]:  # shipped to executors without live clients or stale answers
        state = dict(self.__dict__)
        state.update(_cache={}, _backoff=Backoff("cluster"))
        if self._histories is WORKER_HISTORIES:
            state["_histories"] = None  # the receiving worker's own, not a copy of this one's
        return state

    @property
    def histories(self) -> CommitHistories:
        return self._histories if self._histories is not None else WORKER_HISTORIES

    def history(self, cluster: str, group: str, topic: str, partition: int) -> CommitHistory | None:
        """When the group's committed offset on the partition was seen, as this worker asked it
        (:class:`CommitHistories`); None: not asked yet, or the cluster has no connection."""
        connection = self.clients.clusters.get(cluster)
        if connection is None:
            return None
        return self.histories.history(connection.bootstrap_servers, group, topic, partition)

    def _now(self) -> int:
        return int(self._clock_ms()) if self._clock_ms else time.time_ns() // 1_000_000

    def __call__(self, cluster: str, group: str, topic: str, partition: int) -> int | None:
        return self.lookup(cluster, group, topic, partition)

    def lookup(self, cluster: str, group: str, topic: str, partition: int) -> int | None:
        now = self._now()
        cached = self._cache.get((cluster, group))
        if cached is None or now - cached[0] >= self.cache_ms:
            cached = (now, self._fetch(cluster, group, now))
            self._cache[(cluster, group)] = cached
            connection = self.clients.clusters.get(cluster)
            if connection is not None:  # told now, so committed by now (taken after the answer, not before asking)
                self.histories.saw(connection.bootstrap_servers, group, cached[1], self._now())
        return cached[1].get((topic, partition))

    def _fetch(self, cluster: str, group: str, now: int) -> dict[tuple[str, int], int]:
        admin = self.clients.admin(cluster)
        why: str | None = f"no connection for cluster {cluster!r}"
        if admin is not None:
            quiet = self._backoff.quiet(cluster, now)
            if quiet is not None:
                why = None  # said when it failed (Backoff): not again on every lookup meanwhile
            else:
                try:
                    offsets = admin.committed_offsets(group)
                except CLUSTER_UNAVAILABLE as exc:  # unknown, never "not committed"
                    why = _reason(exc)
                    self.clients.not_answered(cluster)
                    self._backoff.failed(cluster, self._now(), why)  # its delay runs from when the wait ended
                else:
                    self._backoff.answered(cluster, now)
                    return {position: offset for position, offset in offsets.items() if offset is not None}
        from_store = self._from_store(cluster, group, now)
        if from_store is not None:
            if why is not None:
                log.warning("committed offsets of %s from the snapshot store: the broker did not answer (%s)", group,
                            why)  # fmt: skip
            return from_store
        if why is not None:
            log.warning("committed offsets of %s unknown (%s; no fresh snapshot either): its messages wait", group, why)
        return {}

    def _from_store(self, cluster: str, group: str, now: int) -> dict[tuple[str, int], int] | None:
        store = self.clients.store()
        if store is None:
            return None
        try:
            latest = store.snapshots.latest_committed(cluster, group)
        except STORE_UNAVAILABLE as exc:  # the store stands in for the broker; without either, unknown
            log.warning("store unavailable for committed offsets (%s)", exc)
            return None
        if latest is None or now - latest[0] > self.store_fresh_ms:
            return None
        return latest[1]


class RecordRemovals:
    """``removed(cluster, group, topic, partition, offset)``: whether a record left its log before the group
    got to it, with the evidence that tells expiry from truncation (:class:`Removal`).

    The partition's log-start offset comes from the snapshot store when fresh, else from the broker
    (ListOffsets earliest), cached ``cache_ms`` per partition: asking for every undecided message costs
    a few lookups per batch. Only a record below the log start costs more: the snapshot history says
    when it was first seen gone and whether the group had gone past it while it was there (then it
    was skipped, and this answers None); retention comes from the snapshots, else the broker. A log
    start neither can tell is taken as "still in the log" (the message waits, or a group past it
    skipped it); a store that fails on the history of a removed record fails the batch.
    """

    def __init__(self, clients: ClusterClients, store_fresh_ms: int = 15_000, cache_ms: int = 5_000) -> None:
        self.clients, self.store_fresh_ms, self.cache_ms = clients, store_fresh_ms, cache_ms
        self._starts: dict[tuple[str, str, int], tuple[int, int | None]] = {}
        self._retention: dict[tuple[str, str], tuple[int | None, int | None]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_starts={}, _retention={})
        return state

    def __call__(self, cluster: str, group: str, topic: str, partition: int, offset: int) -> Removal | None:
        now = time.time_ns() // 1_000_000
        start = self._log_start(cluster, topic, partition, now)
        if start is None or start <= offset:
            return None
        evidence = self._evidence(cluster, group, topic, partition, offset)
        if evidence is not None and evidence.passed_while_present:
            return None  # the group went past it while the log still held it: a skip, not a removal
        retention_ms = evidence.retention_ms if evidence is not None else None
        retention_bytes = evidence.retention_bytes if evidence is not None else None
        if retention_ms is None:
            retention_ms, retention_bytes = self._broker_retention(cluster, topic)
        first_gone = evidence.first_gone_ms if evidence is not None else None
        return Removal(start, first_gone if first_gone is not None else now, retention_ms, retention_bytes)

    def log_start(self, cluster: str, topic: str, partition: int) -> int | None:
        """The partition's log-start offset as this lookup knows it (cached ``cache_ms``); None: not known.
        A record below it may have left the log: only then is the full :meth:`__call__` worth asking."""
        return self._log_start(cluster, topic, partition, time.time_ns() // 1_000_000)

    def _log_start(self, cluster: str, topic: str, partition: int, now: int) -> int | None:
        cached = self._starts.get((cluster, topic, partition))
        if cached is not None and now - cached[0] < self.cache_ms:
            return cached[1]
        start: int | None = None
        store = self.clients.store()
        try:
            latest = store.snapshots.latest_log_start(cluster, topic, partition) if store is not None else None
        except STORE_UNAVAILABLE as exc:  # the store is a shortcut; the broker is the fallback
            log.warning("store unavailable for log starts (%s); asking the broker", exc)
            latest = None
        if latest is not None and now - latest[0] <= self.store_fresh_ms:
            start = latest[1]
        else:
            admin = self.clients.admin(cluster)
            if admin is not None:
                try:
                    found = admin.log_starts([(topic, partition)])
                    start = found.found.get((topic, partition))
                except CLUSTER_UNAVAILABLE as exc:
                    self.clients.not_answered(cluster)
                    log.warning("log start of %s[%d] on %s unavailable: %s", topic, partition, cluster, exc)
        self._starts[(cluster, topic, partition)] = (now, start)
        return start

    def _evidence(self, cluster: str, group: str, topic: str, partition: int, offset: int) -> RemovalEvidence | None:
        """The snapshot history of a removed record. A store that cannot answer raises :class:`LookupUnavailable`
        (the message waits and is asked about again): answering "no history" could turn a skip into an expiry."""
        store = self.clients.store()
        if store is None:
            return None
        try:
            return store.snapshots.removal_evidence(cluster, group, topic, partition, offset)
        except STORE_UNAVAILABLE as exc:
            raise LookupUnavailable(f"the store did not answer: {_reason(exc)}") from exc

    def _broker_retention(self, cluster: str, topic: str) -> tuple[int | None, int | None]:
        """The topic's retention from the broker, remembered once known (a failure is asked again next time)."""
        if (cluster, topic) not in self._retention:
            admin = self.clients.admin(cluster)
            try:
                kept = admin.retention([topic]).found.get(topic) if admin is not None else None
            except CLUSTER_UNAVAILABLE as exc:
                self.clients.not_answered(cluster)
                log.warning("retention of %s on %s unavailable: %s", topic, cluster, exc)
                kept = None
            if kept is None:
                return None, None
            self._retention[(cluster, topic)] = (kept.retention_ms, kept.retention_bytes)
        return self._retention[(cluster, topic)]


SILENT_FOR_MS = 5_000  # a cluster that did not answer is not asked again for this long (UNAVAILABLE meanwhile)


@dataclass
class _Range:
    """Offsets one isolation level found over ``[start, end)`` of a partition, read at ``at_ms``."""

    start: int
    end: int
    offsets: frozenset[int]
    at_ms: int


@dataclass
class _KeyIndex:
    """The newest offset of each key hash over ``[start, end)`` of a partition (read_committed), read at ``at_ms``."""

    start: int
    end: int
    newest: dict[str, int]
    at_ms: int


class RecordFates:
    """``record(cluster, topic, partition, offset, key_hash)``: what the log says of the record at a position
    (:class:`khipu.detector.model.RecordFate`), asked only where the traces cannot tell (a would-be LOST, a
    transactional write no read_committed receipt proves committed):

    - below the partition's log start: GONE (retention, DeleteRecords);
    - at or past the last stable offset, below the high watermark: OPEN (its transaction is not decided);
    - a read_uncommitted consumer finds a later offset first: the record is not in the log; on a compacted topic
      the cleaner took it: COMPACTED (a delete-only topic has no such gap: UNKNOWN);
    - otherwise a read_committed consumer finds it (VISIBLE) or skips it (ABORTED).

    On a compacted topic, with the SENT trace's key hash, a later record of the same key still in the log is
    looked for (``later_of_key``; read_committed, at most ``key_scan_limit`` records per partition). One read
    answers for the records after it too (each level's offsets are kept per range for ``cache_ms``), so a
    batch's lookups on a partition cost a read or two. A cluster that does not answer gives UNAVAILABLE, logged,
    and is not asked again for SILENT_FOR_MS: the hop waits and asks again at its next check (never a LOST for
    want of asking, never a stalled batch)."""

    def __init__(
        self, clients: ClusterClients, cache_ms: int = 2_000, key_scan_limit: int = 1_000_000, clock_ms: Any = None
    ) -> None:
        self.clients, self.cache_ms, self.key_scan_limit = clients, cache_ms, key_scan_limit
        self._clock_ms = clock_ms
        self._readers: dict[str, LogReader] = {}
        self._silent: dict[str, tuple[int, str]] = {}  # cluster -> when it last did not answer, and why
        self._bounds: dict[tuple[str, str, int], tuple[int, tuple[int, int, int]]] = {}
        self._topics: dict[tuple[str, str], tuple[int, TopicRetention | None]] = {}
        self._ranges: dict[tuple[str, str, int, Isolation], list[_Range]] = {}
        self._keys: dict[tuple[str, str, int], _KeyIndex] = {}

    def __getstate__(self) -> dict[str, Any]:  # shipped to executors without live clients or stale answers
        state = dict(self.__dict__)
        state.update(_readers={}, _silent={}, _bounds={}, _topics={}, _ranges={}, _keys={})
        return state

    def _now(self) -> int:
        return int(self._clock_ms()) if self._clock_ms else time.time_ns() // 1_000_000

    def __call__(self, cluster: str, topic: str, partition: int, offset: int, key_hash: str | None) -> RecordFate:
        now = self._now()
        silent = self._silent.get(cluster)
        if silent is not None and now - silent[0] < SILENT_FOR_MS:  # asked again at once, a batch would stall
            return RecordFate(
                RecordState.UNAVAILABLE, detail=f"the cluster did not answer {now - silent[0]} ms ago: {silent[1]}"
            )
        try:
            return self._fate(cluster, topic, partition, offset, key_hash)
        except (KafkaUnavailable, KafkaException, TimeoutError) as exc:
            why = str(exc) or type(exc).__name__
            self._silent[cluster] = (now, why)
            self.clients.not_answered(cluster)
            log.warning("the log of %s[%d] on %s could not say what offset %d is: %s", topic, partition, cluster,
                        offset, why)  # fmt: skip
            return RecordFate(RecordState.UNAVAILABLE, detail=f"the cluster did not answer: {why}")

    def _fate(self, cluster: str, topic: str, partition: int, offset: int, key_hash: str | None) -> RecordFate:
        now = self._now()
        start, stable, high = self._partition_bounds(cluster, topic, partition, now)
        kept = self._topic(cluster, topic, now)
        compacted = kept is not None and kept.compacted
        if offset < start:
            later = self._later_of_key(cluster, topic, partition, start, stable, key_hash, now) if compacted else None
            return RecordFate(RecordState.GONE, later, compacted, f"the log starts at {start} now")
        if offset >= high:
            return RecordFate(RecordState.UNKNOWN, compacted_topic=compacted, detail=f"the log ends at {high}")
        if offset >= stable:
            return RecordFate(
                RecordState.OPEN, compacted_topic=compacted, detail=f"at or past the last stable offset {stable}"
            )
        if not self._holds(cluster, topic, partition, offset, high, Isolation.UNCOMMITTED, now):
            if not compacted:
                return RecordFate(
                    RecordState.UNKNOWN, detail=f"offset {offset} holds no record, on a topic not compacted"
                )
            later = self._later_of_key(cluster, topic, partition, offset + 1, stable, key_hash, now)
            return RecordFate(RecordState.COMPACTED, later, True, f"offset {offset} is gone from the log (compacted)")
        if self._holds(cluster, topic, partition, offset, stable, Isolation.COMMITTED, now):
            return RecordFate(RecordState.VISIBLE, compacted_topic=compacted, detail="read_committed reads it")
        return RecordFate(
            RecordState.ABORTED,
            compacted_topic=compacted,
            detail=f"read_uncommitted reads offset {offset}, read_committed skips it",
        )

    def _reader(self, cluster: str) -> LogReader:
        if cluster not in self._readers:
            connection = self.clients.clusters.get(cluster)
            if connection is None:
                raise KafkaUnavailable(f"no connection for cluster {cluster!r}")
            self._readers[cluster] = LogReader(connection)
        return self._readers[cluster]

    def _admin(self, cluster: str) -> KafkaAdmin:
        admin = self.clients.admin(cluster)
        if admin is None:
            raise KafkaUnavailable(f"no connection for cluster {cluster!r}")
        return admin

    def _partition_bounds(self, cluster: str, topic: str, partition: int, now: int) -> tuple[int, int, int]:
        """(log start, last stable offset, high watermark), asked at most every ``cache_ms``."""
        key = (cluster, topic, partition)
        cached = self._bounds.get(key)
        if cached is not None and now - cached[0] < self.cache_ms:
            return cached[1]
        admin, where = self._admin(cluster), [(topic, partition)]
        answers: list[Any] = []
        for ask in (admin.log_starts, admin.stable_offsets, admin.watermarks):  # the first failure ends it
            answer = ask(where)
            if answer.errors:
                raise KafkaUnavailable("; ".join(answer.errors))
            answers.append(answer.found[where[0]])
        bounds = (answers[0], answers[1], answers[2][1])
        self._bounds[key] = (now, bounds)
        return bounds

    def _topic(self, cluster: str, topic: str, now: int) -> TopicRetention | None:
        cached = self._topics.get((cluster, topic))
        if cached is None or now - cached[0] >= 60_000:
            answer = self._admin(cluster).retention([topic])
            if answer.errors:  # never taken for "not compacted": a gap would read as no answer, then a loss
                raise KafkaUnavailable("; ".join(answer.errors))
            cached = (now, answer.found.get(topic))
            self._topics[(cluster, topic)] = cached
        return cached[1]

    def _holds(
        self, cluster: str, topic: str, partition: int, offset: int, end: int, isolation: Isolation, now: int
    ) -> bool:
        """Whether a consumer of this isolation level finds ``offset`` (reading on from it to ``end``, remembered)."""
        ranges = self._ranges.setdefault((cluster, topic, partition, isolation), [])
        ranges[:] = [r for r in ranges if now - r.at_ms < self.cache_ms]
        for known in ranges:
            if known.start <= offset < known.end:
                return offset in known.offsets
        limit = 500
        records = self._reader(cluster).read(topic, partition, offset, end, isolation, limit)
        covered = end if len(records) < limit else records[-1].offset + 1
        ranges.append(_Range(offset, covered, frozenset(r.offset for r in records), now))
        return any(r.offset == offset for r in records)

    def _later_of_key(
        self, cluster: str, topic: str, partition: int, after: int, stable: int, key_hash: str | None, now: int
    ) -> int | None:
        """The newest offset at or after ``after`` holding a record of the key (read_committed), or None. The index of
        a partition is built once from the first offset asked and extended as the log grows (a key's newest record
        only moves on); it starts again only when an earlier offset is asked."""
        if key_hash is None:
            return None
        key = (cluster, topic, partition)
        index = self._keys.get(key)
        if index is None or index.start > after:
            index = self._keys[key] = _KeyIndex(after, after, {}, now)
        reader, read = self._reader(cluster), 0
        while index.end < stable and read < self.key_scan_limit:
            records = reader.read(topic, partition, index.end, stable, Isolation.COMMITTED, 5_000)
            if not records:
                index.end = stable
                break
            for record in records:
                hashed = keys.key_hash(record.key)
                if hashed is not None:
                    index.newest[hashed] = record.offset
            index.end, read = records[-1].offset + 1, read + len(records)
        newest = index.newest.get(key_hash)
        return newest if newest is not None and newest >= after else None


def _reason(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0] or type(exc).__name__


def cluster_lookups(clients: ClusterClients, store_url: str) -> Lookups:
    """What the rules ask of the clusters and the store, as reconciliation asks it (the detector's processor holds
    the same lookups): committed offsets and their history, pointers, removals from the log, records' fates."""
    committed = CommittedOffsets(clients)
    pointed, removals, fates = PointedPositions(store_url), RecordRemovals(clients), RecordFates(clients)
    return Lookups(committed, pointed, removals, fates, committed.history)
