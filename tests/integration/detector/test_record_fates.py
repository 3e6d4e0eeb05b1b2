"""What the log says of a record, asked of the real broker: a transaction's outcome, compaction, removal.

The ground truth is what the test's own producer did (delivery reports, the transactions it committed or
aborted, the keys it wrote) and what a plain consumer reads back from the log, never RecordFates itself.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from confluent_kafka import Producer

from khipu.detector.committed import ClusterClients, RecordFates
from khipu.detector.model import RecordState
from khipu.kafka import KafkaConnection
from khipu.localstack.broker import BrokerProcess
from khipu.localstack.processes import free_port
from khipu.trace.keys import key_hash
from tests.integration.helpers import log_offsets, until

pytestmark = pytest.mark.integration


def fates_of(broker: BrokerProcess) -> RecordFates:
    return RecordFates(ClusterClients({"local": broker.connection()}), cache_ms=0)


def written(producer: Any, topic: str, records: list[tuple[bytes | None, bytes | None]]) -> list[int]:
    """Produce the records (key, value) in order; their offsets from the delivery reports."""
    offsets: list[int] = []

    def landed(error: Any, message: Any) -> None:
        assert error is None, error
        offsets.append(message.offset())

    for key, value in records:
        producer.produce(topic, value=value, key=key, on_delivery=landed)
        producer.flush(10)
    return offsets


def test_a_records_transaction_is_read_from_the_log_committed_aborted_or_still_open(broker: BrokerProcess) -> None:
    topic = f"fates-txn-{secrets.token_hex(3)}"
    broker.admin().ensure_topics({topic: 1})
    plain = written(Producer({"bootstrap.servers": broker.bootstrap_servers}), topic, [(b"p", b"plain")])
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"t-{topic}"})
    producer.init_transactions(30)
    outcomes: dict[int, str] = {}
    for outcome in ("commit", "abort", "commit", "open"):
        producer.begin_transaction()
        offsets = written(producer, topic, [(b"k", f"{outcome}-{n}".encode()) for n in range(3)])
        outcomes.update(dict.fromkeys(offsets, outcome))
        if outcome == "commit":
            producer.commit_transaction(30)
        elif outcome == "abort":
            producer.abort_transaction(30)
    fates = fates_of(broker)
    expected = {"commit": RecordState.VISIBLE, "abort": RecordState.ABORTED, "open": RecordState.OPEN}
    assert fates("local", topic, 0, plain[0], None).state is RecordState.VISIBLE  # written without a transaction
    # commit_transaction and abort_transaction return once the coordinator has logged the outcome; it writes the
    # markers to the partitions after that (KIP-98), so the log says so moments later, not at once
    want = {offset: expected[outcome] for offset, outcome in outcomes.items()}
    until(lambda: {o: fates("local", topic, 0, o, None).state for o in outcomes} == want, 15,
          "the log tells each transaction's outcome")  # fmt: skip
    producer.commit_transaction(30)  # the open one commits: read_committed readers see it now
    opened = [o for o, outcome in outcomes.items() if outcome == "open"]
    until(lambda: {fates("local", topic, 0, o, None).state for o in opened} == {RecordState.VISIBLE}, 15,
          "the open transaction, committed, is visible")  # fmt: skip
    aborted = [o for o, outcome in outcomes.items() if outcome == "abort"]
    assert "read_committed skips it" in fates("local", topic, 0, aborted[0], None).detail


def test_a_record_compaction_removed_is_told_with_the_later_record_of_its_key(broker: BrokerProcess) -> None:
    topic = f"fates-cmp-{secrets.token_hex(3)}"
    compact = {
        "cleanup.policy": "compact",
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "1000",
    }
    broker.admin().ensure_topics({topic: 1}, {topic: compact})
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
    first, tombstoned, newer, tombstone = written(
        producer, topic, [(b"k0", b"v1"), (b"k1", b"v1"), (b"k0", b"v2"), (b"k1", None)]
    )

    def cleaned() -> bool:  # appends roll the active segment: the cleaner only cleans the ones before it
        written(producer, topic, [(b"filler", b"x")])
        kept = log_offsets(broker, topic)
        return first not in kept and tombstoned not in kept and tombstone not in kept

    until(cleaned, 60, "the cleaner removed the superseded records and the tombstone")
    fates = fates_of(broker)
    superseded = fates("local", topic, 0, first, key_hash(b"k0"))
    assert (superseded.state, superseded.later_of_key, superseded.compacted_topic) == (
        RecordState.COMPACTED,
        newer,
        True,
    )
    assert fates("local", topic, 0, newer, key_hash(b"k0")).state is RecordState.VISIBLE  # still the latest of k0
    deleted = fates("local", topic, 0, tombstoned, key_hash(b"k1"))  # its key's tombstone is gone too
    assert (deleted.state, deleted.later_of_key) == (RecordState.COMPACTED, None)
    assert fates("local", topic, 0, first, None).later_of_key is None  # no key hash: nothing to look for


def test_a_record_below_the_log_start_is_gone_and_an_unreachable_cluster_is_unavailable(broker: BrokerProcess) -> None:
    topic = f"fates-gone-{secrets.token_hex(3)}"
    broker.admin().ensure_topics({topic: 1})
    offsets = written(Producer({"bootstrap.servers": broker.bootstrap_servers}), topic, [(b"k", b"v")] * 3)
    broker.admin().delete_records({(topic, 0): offsets[2]})
    fates = fates_of(broker)
    gone = fates("local", topic, 0, offsets[0], key_hash(b"k"))
    assert (gone.state, gone.later_of_key) == (RecordState.GONE, None)  # a delete-only topic: no key looked for
    assert f"the log starts at {offsets[2]}" in gone.detail
    assert fates("local", topic, 0, offsets[2], key_hash(b"k")).state is RecordState.VISIBLE
    nowhere = RecordFates(ClusterClients({"local": KafkaConnection(f"127.0.0.1:{free_port()}")}, timeout_s=2))
    unknown = nowhere("local", topic, 0, 0, None)
    assert unknown.state is RecordState.UNAVAILABLE and "did not answer" in unknown.detail
    again = nowhere("local", topic, 0, 1, None)  # not asked again at once: a batch never stalls on a silent cluster
    assert again.state is RecordState.UNAVAILABLE and "ms ago" in again.detail
    elsewhere = fates("east", topic, 0, 0, None)  # a cluster no connection names
    assert elsewhere.state is RecordState.UNAVAILABLE and "no connection for cluster 'east'" in elsewhere.detail
