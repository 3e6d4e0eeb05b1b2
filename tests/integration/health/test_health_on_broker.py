"""Snapshots of a real broker -> store -> health, with the snapshot clock stepped a minute at a time.

The offsets, group states and watermarks are real; only the time stamped on each snapshot is
chosen by the test, so minutes of history take seconds.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from khipu.alerting.cluster import evaluate_cluster
from khipu.health.evaluate import HealthConfig
from khipu.health.rules import PartitionStatus
from khipu.health.windows import WindowKind
from khipu.kafka import KafkaConnection
from khipu.localstack.broker import BrokerProcess
from khipu.localstack.processes import free_port
from khipu.offsets.collect import SnapshotError, collect_snapshot
from khipu.offsets.model import PartitionKey
from khipu.store import Store
from tests.integration.helpers import consume_all, consumer_config

pytestmark = pytest.mark.integration

M = 60_000
CONFIG = HealthConfig(window_size=4, min_window=3, min_stop_ms=2 * M, skip_min_records=100)


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_800_000_000_000

    def tick(self) -> int:
        self.now_ms += M
        return self.now_ms


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    built = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    built.migrate()
    yield built
    built.close()


@pytest.fixture
def topic(broker: BrokerProcess) -> str:
    name = f"health-{secrets.token_hex(3)}"
    broker.admin().ensure_topics({name: 1})
    return name


def produce(broker: BrokerProcess, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for _ in range(count):
        producer.produce(topic, value=b"x", partition=0)
    producer.flush(10)


def snapshot(broker: BrokerProcess, store: Store, clock: Clock, watched: dict[str, frozenset[str]]) -> None:
    run, rows = collect_snapshot(broker.connection(), watched, clock.tick())
    assert run.errors == (), run.errors
    assert store.snapshots.write(run, rows)


def status(store: Store, key: PartitionKey) -> PartitionStatus:
    return PartitionStatus[store.health.current_statuses("local")[key].status_name]


def test_a_consumer_that_stops_moving_stalls_then_stops_and_each_transition_alerts_once(
    broker: BrokerProcess, store: Store, topic: str
) -> None:
    clock, group = Clock(), f"sink-{secrets.token_hex(3)}"
    key, watched = PartitionKey("local", group, topic, 0), {group: frozenset({topic})}
    consumer = Consumer(consumer_config(broker, group))
    consumer.subscribe([topic])
    for _ in range(3):  # healthy: it reads and commits everything each minute
        produce(broker, topic, 10)
        assert len(consume_all(consumer, 10)) == 10
        consumer.commit(asynchronous=False)
        snapshot(broker, store, clock, watched)
        evaluate_cluster(store, "local", CONFIG)
    assert status(store, key) is PartitionStatus.OK

    seen = []
    for _ in range(4):  # stuck: still a member of the group, but it neither reads nor commits
        produce(broker, topic, 10)
        snapshot(broker, store, clock, watched)
        evaluate_cluster(store, "local", CONFIG)
        seen.append(status(store, key))
    assert seen[-1] is PartitionStatus.STALL
    health = store.snapshots.latest("local")[0]
    assert (health.committed, health.log_end, health.lag, health.group_state) == (30, 70, 40, "STABLE")
    assert (health.members, health.assigned) == (1, True)  # a member holds the partition: a live, stuck consumer

    consumer.close()  # gone: the group empties, its last commit grows old
    for _ in range(6):
        produce(broker, topic, 10)
        snapshot(broker, store, clock, watched)
        evaluate_cluster(store, "local", CONFIG)
        seen.append(status(store, key))
    assert seen[-1] is PartitionStatus.STOP
    assert seen.index(PartitionStatus.STALL) < seen.index(PartitionStatus.STOP)
    gone = store.snapshots.latest("local")[0]
    assert (gone.group_state, gone.members, gone.assigned, gone.live) == ("EMPTY", 0, False, False)

    firing = [(a.kind, a.details["to_status"]) for a in store.alerts.read() if a.state == "firing"]
    assert firing == [("group_status", "STALL"), ("group_status", "STOP")]  # one per transition, not per minute
    transitions = [(before, after) for _, before, after, _ in store.health.transitions("local")]
    assert transitions == [("OK", "STALL"), ("STALL", "STOP")]
    [stored] = [h for k, h in store.health.current_statuses("local").items() if k == key]
    assert stored.since_ms == store.health.transitions("local")[-1][3]


def test_rewind_and_skip_commits_open_windows_with_their_ranges_and_time_lag_is_measured(
    broker: BrokerProcess, store: Store, topic: str
) -> None:
    clock, group = Clock(), f"audit-{secrets.token_hex(3)}"
    key, watched = PartitionKey("local", group, topic, 0), {group: frozenset({topic})}
    committer = Consumer(consumer_config(broker, group))

    def commit_at(offset: int) -> None:
        committer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)

    produce(broker, topic, 60)
    for offset in (10, 20, 30, 40):
        commit_at(offset)
        snapshot(broker, store, clock, watched)
        evaluate_cluster(store, "local", CONFIG)
    assert store.snapshots.backlog_started_ms("local", topic, 0, committed=40) == clock.now_ms - 3 * M

    commit_at(15)  # rewind: 15..40 will be read again
    snapshot(broker, store, clock, watched)
    evaluate_cluster(store, "local", CONFIG)
    assert status(store, key) is PartitionStatus.REWIND

    produce(broker, topic, 2000)
    commit_at(2060)  # skip: jumped to the log end, 2045 records in a minute from a group that moves ~10
    snapshot(broker, store, clock, watched)
    evaluate_cluster(store, "local", CONFIG)
    committer.close()

    windows = [(WindowKind(w.kind), w.from_offset, w.to_offset) for w in store.health.offset_windows("local", topic, 0)]
    assert windows == [(WindowKind.REWIND, 15, 40), (WindowKind.SKIP, 15, 2060)]
    assert [WindowKind(w.kind) for w in store.health.offset_windows("local", topic, 0, covering_offset=1000)] == [
        WindowKind.SKIP
    ]
    window_alerts = [a.details["kind"] for a in store.alerts.read() if a.kind == "offset_window"]
    assert window_alerts == ["rewind", "skip"]


def test_a_watched_group_without_commits_and_a_missing_topic_are_reported_not_fatal(
    broker: BrokerProcess, topic: str
) -> None:
    run, rows = collect_snapshot(broker.connection(), {"never-started": frozenset({topic, "no-such-topic"})}, 1000)
    assert [(r.group, r.topic, r.partition, r.committed) for r in rows] == [("never-started", topic, 0, None)]
    assert run.errors == ("topic no-such-topic read by group never-started does not exist on local",)


def test_an_unreachable_cluster_raises_a_snapshot_error_naming_it() -> None:
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(SnapshotError, match=f"cannot reach cluster 'east' at {address}"):
        collect_snapshot(KafkaConnection(address, cluster="east"), {"g": frozenset({"t"})}, 0, timeout_s=3)
