"""Committed offsets for the detector: the snapshot store when it is fresh, the broker otherwise.

One provider per Python worker, cached per (cluster, group) for ``cache_ms``: deciding a
micro-batch of messages costs a few group lookups, not one per message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException
from confluent_kafka.admin import AdminClient

from khipu.store.store import Store

log = logging.getLogger(__name__)
_NO_OFFSET = -1001


class StreamReadProgress:
    """``read_to()``: the time up to which every named query has read its whole input (cached ``cache_ms``);
    0 until each has been caught up once: a detector still working through a backlog decides nothing
    yet. The verdict query needs the archive query too: it records the back-pointers verdicts rely on."""

    def __init__(self, store_url: str, query_names: tuple[str, ...], cache_ms: int = 1_000) -> None:
        self.store_url, self.query_names, self.cache_ms = store_url, query_names, cache_ms
        self._store: Store | None = None
        self._cached: tuple[int, int | None] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_store=None, _cached=None)
        return state

    def __call__(self) -> int | None:
        now = time.time_ns() // 1_000_000
        if self._cached is None or now - self._cached[0] >= self.cache_ms:
            if self._store is None:
                self._store = Store(self.store_url)
            try:
                self._cached = (now, min(self._store.read_to_ms(name) or 0 for name in self.query_names))
            except Exception as exc:  # unknown progress: decide on nothing yet rather than too early
                log.warning("stream progress of %s unavailable: %s", ", ".join(self.query_names), exc)
                self._cached = (now, 0)
        return self._cached[1]


class PointedPositions:
    """``pointed_at(location, cluster, topic, partition, offset)``: whether an emitter at ``location`` said
    it received that record, from the pointers the archive query records (asked only for a would-be
    LOST, so rarely). A store that cannot answer fails the batch (it is retried): answering "no"
    would turn a lost trace into a false LOST."""

    def __init__(self, store_url: str) -> None:
        self.store_url = store_url
        self._store: Store | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_store=None)
        return state

    def __call__(self, location: str, cluster: str, topic: str, partition: int, offset: int) -> bool:
        if self._store is None:
            self._store = Store(self.store_url)
        return self._store.pointed_at(location, cluster, topic, partition, offset)


class CommittedOffsets:
    """``lookup(cluster, group, topic, partition)`` -> the group's committed offset, or None when unknown."""

    def __init__(
        self,
        clusters: Mapping[str, Mapping[str, Any]],
        store_url: str | None = None,
        store_fresh_ms: int = 15_000,
        cache_ms: int = 2_000,
        clock_ms: Any = None,
    ) -> None:
        self.clusters = {name: dict(config) for name, config in clusters.items()}
        self.store_url = store_url
        self.store_fresh_ms = store_fresh_ms
        self.cache_ms = cache_ms
        self._clock_ms = clock_ms
        self._admins: dict[str, AdminClient] = {}
        self._store: Store | None = None
        self._cache: dict[tuple[str, str], tuple[int, dict[tuple[str, int], int]]] = {}

    def __getstate__(self) -> dict[str, Any]:  # shipped to executors without live clients
        state = dict(self.__dict__)
        state.update(_admins={}, _store=None, _cache={})
        return state

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
        return cached[1].get((topic, partition))

    def _fetch(self, cluster: str, group: str, now: int) -> dict[tuple[str, int], int]:
        from_store = self._from_store(cluster, group, now)
        if from_store is not None:
            return from_store
        config = self.clusters.get(cluster)
        if config is None:
            log.warning("no client settings for cluster %r: committed offsets of %s unknown", cluster, group)
            return {}
        admin = self._admins.get(cluster)
        if admin is None:
            admin = self._admins[cluster] = AdminClient(dict(config))
        try:
            result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)], request_timeout=10)[
                group
            ].result(timeout=10)
        except KafkaException as exc:
            log.warning("committed offsets of %s on %s unavailable: %s", group, cluster, exc)
            return {}
        return {
            (tp.topic, tp.partition): tp.offset
            for tp in result.topic_partitions or []
            if tp.error is None and tp.offset != _NO_OFFSET
        }

    def _from_store(self, cluster: str, group: str, now: int) -> dict[tuple[str, int], int] | None:
        if not self.store_url:
            return None
        if self._store is None:
            self._store = Store(self.store_url)
        try:
            latest = self._store.latest_committed(cluster, group)
        except Exception as exc:  # the store is a shortcut; the broker is the fallback
            log.warning("store unavailable for committed offsets (%s); asking the broker", exc)
            return None
        if latest is None or now - latest[0] > self.store_fresh_ms:
            return None
        return latest[1]
