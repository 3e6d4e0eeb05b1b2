"""The commit watch, on a real broker: a group's commit reaches its history within the watch's interval, with no
lookup asking meanwhile (between micro-batches), and the watch's answers serve lookups. Ground truth is the commits
the test makes, timed around each call that makes it."""

from __future__ import annotations

import secrets
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from khipu.detector.committed import WORKER_WATCH, ClusterClients, CommitHistories, CommittedOffsets, CommitWatch
from khipu.kafka import KafkaConnection
from khipu.localstack.broker import BrokerProcess
from khipu.localstack.processes import free_port

pytestmark = pytest.mark.integration


def commit(broker: BrokerProcess, group: str, topic: str, offset: int) -> tuple[int, int]:
    """Commit ``offset`` for ``group``; (ms before asking, ms after the broker acknowledged)."""
    committer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    try:
        before = time.time_ns() // 1_000_000
        committer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
        return before, time.time_ns() // 1_000_000
    finally:
        committer.close()


def test_a_commit_is_seen_within_the_watch_interval_without_a_lookup_asking(broker: BrokerProcess) -> None:
    topic, group = f"watched-{secrets.token_hex(3)}", f"watched-g-{secrets.token_hex(3)}"
    broker.admin().ensure_topics({topic: 1})
    commit(broker, group, topic, 5)
    histories = CommitHistories()
    lookup = CommittedOffsets(
        ClusterClients({"local": broker.connection()}), cache_ms=600, histories=histories, watch_ms=250
    )
    assert lookup("local", group, topic, 0) == 5  # asked itself (the watch had no answer yet), and the watch follows
    assert (broker.bootstrap_servers, group) in WORKER_WATCH.watching()
    delays = []
    for offset in (9, 14, 20):
        before, acknowledged = commit(broker, group, topic, offset)
        deadline = time.monotonic() + 10
        while (history := histories.history(broker.bootstrap_servers, group, topic, 0)) is None or (
            seen := history.passed_since_ms(offset - 1)
        ) is None:
            assert time.monotonic() < deadline, f"commit {offset} not seen within 10 s with no lookup asking"
            time.sleep(0.05)
        assert seen >= before  # never before the commit was asked for: it was made by then
        delays.append(seen - acknowledged)
    # seen within the interval (250 ms) and an ask's time of the acknowledgement; 1 s allows for a loaded machine
    assert max(delays) <= 1_000, delays
    time.sleep(0.7)  # past the lookup's own cache
    assert lookup("local", group, topic, 0) == 20  # the watch's newest answer (asked within the lookup's cache time)
    print(f"\ncommits seen by the watch {delays} ms after the broker acknowledged them (interval 250 ms)")


def test_a_group_no_lookup_asks_about_is_no_longer_watched_and_a_silent_cluster_is_not_asked_in_a_loop(
    broker: BrokerProcess,
) -> None:
    watch = CommitWatch(idle_ms=500)
    group = f"idle-{secrets.token_hex(3)}"
    watch.follow(broker.connection(), group, CommitHistories(), every_ms=100)
    assert watch.watching() == [(broker.bootstrap_servers, group)]
    deadline = time.monotonic() + 10
    while watch.watching():
        assert time.monotonic() < deadline, "an idle group is still watched 10 s on"
        time.sleep(0.1)
    nobody = KafkaConnection(f"127.0.0.1:{free_port()}")  # nothing listens: every ask fails
    silent = CommitWatch(idle_ms=9_000)  # let go of soon after the test
    silent.follow(nobody, "g", CommitHistories(), every_ms=100)
    time.sleep(8)
    watched = silent._watched[(nobody.bootstrap_servers, "g")]
    # each ask waits out its 5 s timeout, and the next comes 1 s after (then 2 s, doubling): 1 or 2 tries in 8 s,
    # not one every 100 ms
    assert 1 <= watched.failures <= 2 and watched.answer is None
