"""Kafka's own semantics end to end: transactions, an exactly-once processor, compaction, compact+delete, skewed clocks.

Five small pipelines on the real broker, traced with Khipu's library, run at once under one streaming detector.
Each one's ground truth is what its own applications did and saw: the transactions the producer committed or
aborted, the records each group read, what a processor wrote in each attempt, the keys written, what the log still
held (a plain consumer's read), never Khipu's output. The expected verdict of every (message, hop) follows from
that truth by Kafka's documented semantics; every verdict stored must be it.
"""

from __future__ import annotations

import functools
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from khipu.detector.job import DetectorJob, start_detector
from khipu.detector.model import DetectorConfig
from khipu.localstack.broker import BrokerProcess
from khipu.offsets.collect import collect_snapshot, groups_to_watch
from khipu.registry.loader import load_registry
from khipu.report.service import khipu_health
from khipu.store import Store
from khipu.tracing import TracedConsumer, TracedProducer, TraceEmitter, TraceEmitterConfig, carry_trace_headers
from khipu.tracing.headers import trace_context
from khipu.verdicts.metrics import MinuteCounts
from tests.integration.detector.conftest import decided, play_at_once
from tests.integration.helpers import TEST_SESSION_TIMEOUT_MS, log_offsets, stream_yaml, until

pytestmark = pytest.mark.integration

CONFIG = DetectorConfig(grace_ms=4_000, max_wait_ms=120_000, recheck_ms=1_000)
SKEW_MS = 30_000
D, A, S, L, DUP = "DELIVERED", "ABORTED", "SUPERSEDED", "LOST", "DUPLICATE"
Expected = dict[tuple[str, str], tuple[str, str | None]]  # (message id, hop) -> (verdict, cause)


@dataclass
class Scenario:
    name: str
    expected: Expected = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)  # what the applications saw, for the note


@dataclass
class Topics:
    run: str
    trace: str
    txn: str
    eos_in: str
    eos_out: str
    compact: str
    compact_delete: str
    skew: str
    registry: Path | None = None  # set once written
    store_url: str = ""

    def group(self, name: str) -> str:
        return f"{name}-{self.run}"


def registry_text(t: Topics) -> str:
    def stream(name: str, producer: str, topic: str, consumers: list[str]) -> str:
        return stream_yaml(name, "team-semantics", producer, topic, consumers)

    return "version: 1\nclusters: {local: {}}\nstreams:\n" + "".join(
        [
            stream("sem.txn", "txn-producer", t.txn, [
                f"{{group: {t.group('txn-committed')}, location: txn-committed, reads: [local/{t.txn}]}}",
                f"{{group: {t.group('txn-uncommitted')}, location: txn-uncommitted, reads: [local/{t.txn}]}}",
            ]),
            stream("sem.eos", "eos-source", t.eos_in, [
                f"{{group: {t.group('eos-proc')}, location: eos-proc, reads: [local/{t.eos_in}], "
                f"writes: [local/{t.eos_out}]}}",
                f"{{group: {t.group('eos-sink')}, location: eos-sink, reads: [local/{t.eos_out}]}}",
            ]),
            stream("sem.compact", "cmp-producer", t.compact, [
                f"{{group: {t.group('cmp-sink')}, location: cmp-sink, reads: [local/{t.compact}]}}",
            ]),
            stream("sem.compact-delete", "cd-producer", t.compact_delete, [
                f"{{group: {t.group('cd-sink')}, location: cd-sink, reads: [local/{t.compact_delete}]}}",
            ]),
            stream("sem.skew", "skew-producer", t.skew, [
                f"{{group: {t.group('skew-sink')}, location: skew-sink, reads: [local/{t.skew}]}}",
            ]),
        ]
    )  # fmt: skip


def write_hop(location: str, topic: str) -> str:
    return f"{location} -> local/{topic}"


def read_hop(topic: str, group: str) -> str:
    return f"local/{topic} -> {group}"


def emitter(broker: BrokerProcess, topics: Topics, location: str, skew_ms: int = 0) -> TraceEmitter:
    """A trace emitter; ``skew_ms``: the clock of the host it runs on is that far off (a fake clock: two hosts'
    clocks cannot differ on one machine)."""
    config = TraceEmitterConfig(broker.bootstrap_servers, location, "local", topics.trace, mark_interval_s=1.0)
    return TraceEmitter(config, clock_ms=lambda: time.time_ns() // 1_000_000 + skew_ms)


class Sink(threading.Thread):
    """A traced consumer group reading a topic, committing what it has read (its position) every half second, until
    told to stop and quiet for a second; ``received``: each message id and how many times it got it."""

    def __init__(
        self, broker: BrokerProcess, topics: Topics, location: str, group: str, topic: str, **config: Any
    ) -> None:
        super().__init__(daemon=True, name=f"sink-{location}")
        self.emitter = emitter(broker, topics, location, config.pop("skew_ms", 0))
        settings = {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": TEST_SESSION_TIMEOUT_MS,
            **config,
        }
        self.consumer = TracedConsumer(settings, emitter=self.emitter)
        self.topic, self.received, self.stop = topic, Counter[str](), threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.consumer.subscribe([self.topic])
            quiet_since, committed_at = time.monotonic(), 0.0
            while not (self.stop.is_set() and time.monotonic() - quiet_since > 1.0):
                message = self.consumer.poll(0.2)
                if message is not None and message.error() is None:
                    quiet_since = time.monotonic()
                    context = trace_context(message.headers())
                    if context is not None:
                        self.received[context.message_id] += 1
                if time.monotonic() - committed_at > 0.5:
                    self._commit()
                    committed_at = time.monotonic()
            self._commit()
        except BaseException as exc:  # the test fails on it, naming the sink
            self.error = exc
        finally:
            self.consumer.close()
            self.emitter.close()

    def _commit(self) -> None:
        assigned = self.consumer.assignment()
        positions = [tp for tp in self.consumer.position(assigned) if tp.offset >= 0] if assigned else []
        if positions:
            self.consumer.commit(offsets=positions, asynchronous=False)


def delivered_at(landed: dict[str, tuple[int, int]], message_id: str) -> Callable[[Any, Any], None]:
    """A delivery callback recording the message's (partition, offset) in ``landed``."""

    def report(error: Any, message: Message) -> None:
        if error is None:
            landed[message_id] = (message.partition(), message.offset())

    return report


def snapshot_offsets(broker: BrokerProcess, t: Topics) -> None:
    """One offset snapshot of the registry's groups into the detector's store (khipu_snapshot_offsets' task)."""
    assert t.registry is not None
    watched = groups_to_watch(load_registry(t.registry), "local")
    run, rows = collect_snapshot(broker.connection(), watched, time.time_ns() // 1_000_000)
    store = Store(t.store_url)
    try:
        store.snapshots.write(run, rows)
    finally:
        store.close()


def set_retention(broker: BrokerProcess, topic: str, retention_ms: int) -> None:
    """Change a topic's retention.ms, as an operator does (IncrementalAlterConfigs)."""
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", str(retention_ms), incremental_operation=AlterConfigOpType.SET)
    ])  # fmt: skip
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(10)


# -- the pipelines ----------------------------------------------------------------------------------------------


def transactions(broker: BrokerProcess, t: Topics) -> Scenario:
    """A transactional producer: 30 transactions of 10 messages, every fifth aborted, and one more committed 8 s after
    its writes (longer than the grace); a read_committed and a read_uncommitted sink reading all along."""
    committed_sink = Sink(broker, t, "txn-committed", t.group("txn-committed"), t.txn)
    uncommitted_sink = Sink(broker, t, "txn-uncommitted", t.group("txn-uncommitted"), t.txn,
                            **{"isolation.level": "read_uncommitted"})  # fmt: skip
    for sink in (committed_sink, uncommitted_sink):
        sink.start()
    source = emitter(broker, t, "txn-producer")
    producer = TracedProducer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"txn-{t.run}"},
                              emitter=source, stream="sem.txn")  # fmt: skip
    outcome: dict[str, str] = {}
    producer.init_transactions(30)
    for n in range(31):
        producer.begin_transaction()
        ids = [producer.produce(t.txn, value=f"{n}-{i}".encode(), key=f"{i}".encode()) for i in range(10)]
        producer.flush(10)
        aborted = n % 5 == 2
        if n == 30:  # the slow one: committed long after its writes; the uncommitted sink has read them by then
            time.sleep(8)
        producer.abort_transaction(30) if aborted else producer.commit_transaction(30)
        outcome.update(dict.fromkeys((i for i in ids if i), "aborted" if aborted else "committed"))
    producer.flush(10)
    source.close()
    for sink in (committed_sink, uncommitted_sink):
        sink.stop.set()
        sink.join(60)
        assert sink.error is None, sink.error
    scenario = Scenario("transactions", facts={
        "messages": len(outcome), "aborted": sum(o == "aborted" for o in outcome.values()),
        "slow": [i for i in ids if i], "read_committed got": len(committed_sink.received),
        "read_uncommitted got": len(uncommitted_sink.received),
    })  # fmt: skip
    for message_id, result in outcome.items():
        scenario.expected[(message_id, write_hop("txn-producer", t.txn))] = (A if result == "aborted" else D, None)
        for sink in (committed_sink, uncommitted_sink):
            hop = read_hop(t.txn, sink.consumer.group_id)
            got = sink.received[message_id]
            # a read_committed group never sees an aborted record; a read_uncommitted one got it, of an aborted txn
            verdict = A if result == "aborted" else D if got == 1 else DUP if got > 1 else L
            scenario.expected[(message_id, hop)] = (verdict, None)
    return scenario


def exactly_once(broker: BrokerProcess, t: Topics) -> Scenario:
    """A source writes 60 messages; an exactly-once processor (read_committed, offsets sent to its transaction)
    writes each on, aborting every third transaction and reprocessing from its committed offsets; a sink reads the
    output read_committed."""
    source_emitter = emitter(broker, t, "eos-source")
    source = TracedProducer({"bootstrap.servers": broker.bootstrap_servers}, emitter=source_emitter, stream="sem.eos")
    written = [source.produce(t.eos_in, value=f"m{i}".encode(), key=f"{i}".encode()) for i in range(60)]
    source.flush(10)
    source_emitter.close()
    sink = Sink(broker, t, "eos-sink", t.group("eos-sink"), t.eos_out)
    sink.start()
    proc_emitter = emitter(broker, t, "eos-proc")
    group = t.group("eos-proc")
    consumer = TracedConsumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group,
                               "auto.offset.reset": "earliest", "enable.auto.commit": False,
                               "session.timeout.ms": TEST_SESSION_TIMEOUT_MS}, emitter=proc_emitter)  # fmt: skip
    producer = TracedProducer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"eos-{t.run}"},
                              emitter=proc_emitter)  # fmt: skip
    producer.init_transactions(30)
    consumer.subscribe([t.eos_in])
    reads: Counter[str] = Counter()
    committed_writes: Counter[str] = Counter()
    aborted_ids: set[str] = set()
    attempt, quiet_since = 0, time.monotonic()
    while time.monotonic() - quiet_since < 3:
        batch = [m for m in consumer.consume(10, 1.0) if m.error() is None]
        if not batch:
            continue
        quiet_since = time.monotonic()
        ids = [c.message_id for c in (trace_context(m.headers()) for m in batch) if c is not None]
        reads.update(ids)
        producer.begin_transaction()
        for message in batch:
            producer.produce(t.eos_out, value=message.value(), key=message.key(),
                             headers=carry_trace_headers(message.headers()))  # fmt: skip
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
        )
        attempt += 1
        if attempt % 3 == 0:  # injected: the transaction aborts, and the batch is read again from the commits
            producer.abort_transaction(30)
            aborted_ids.update(ids)
            for tp in consumer.committed(consumer.assignment(), 10):
                consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))
        else:
            producer.commit_transaction(30)
            committed_writes.update(ids)
    consumer.close()
    proc_emitter.close()
    sink.stop.set()
    sink.join(60)
    assert sink.error is None, sink.error
    scenario = Scenario("exactly-once processor", facts={
        "messages": len(written), "transactions": attempt, "aborted transactions": attempt // 3,
        "messages reprocessed": len(aborted_ids), "sink got": len(sink.received),
    })  # fmt: skip
    for message_id in (m for m in written if m):
        scenario.expected[(message_id, write_hop("eos-source", t.eos_in))] = (D, None)
        # read again after each abort of a transaction holding it (two aborts in a row: three reads), written once
        read_twice_after_abort = (
            reads[message_id] > 1 and message_id in aborted_ids and committed_writes[message_id] == 1
        )
        read_once = (D, None) if reads[message_id] == 1 else (L, None)
        scenario.expected[(message_id, read_hop(t.eos_in, group))] = (
            (DUP, "reprocessed_after_abort") if read_twice_after_abort else read_once
        )
        scenario.expected[(message_id, write_hop("eos-proc", t.eos_out))] = (
            (D, None) if committed_writes[message_id] == 1 else (DUP, "rewind_replay")
        )
        scenario.expected[(message_id, read_hop(t.eos_out, sink.consumer.group_id))] = (
            (D, None) if sink.received[message_id] == 1 else (L, None)
        )
    return scenario


def compaction(broker: BrokerProcess, t: Topics) -> Scenario:
    """300 records on 20 keys, the last of five keys a tombstone, to a compacted topic; a sink starts once the
    cleaner has removed every superseded record and the tombstones (untraced appends roll the segments)."""
    source_emitter = emitter(broker, t, "cmp-producer")
    producer = TracedProducer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0},
                              emitter=source_emitter, stream="sem.compact")  # fmt: skip
    at: dict[str, tuple[int, int]] = {}
    keys: dict[str, tuple[str, bool]] = {}
    for n in range(300):
        key, message_id = f"k{n % 20}", f"cmp-{t.run}-{n}"
        tombstone = n >= 295 and n % 20 >= 15
        producer.produce(t.compact, value=None if tombstone else f"v{n}".encode(), key=key.encode(),
                         on_delivery=delivered_at(at, message_id), message_id=message_id)  # fmt: skip
        keys[message_id] = (key, tombstone)
    producer.flush(10)
    source_emitter.close()
    newest = {key: max(at[m][1] for m, (k, _) in keys.items() if k == key) for key, _ in keys.values()}
    superseded = {at[m][1] for m, (key, _) in keys.items() if at[m][1] < newest[key]}
    tombstones = {at[m][1] for m, (_, dead) in keys.items() if dead}
    filler = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})  # untraced: rolls segments

    def cleaned() -> bool:
        filler.produce(t.compact, value=b"x", key=b"filler")
        filler.flush(10)
        return not (set(log_offsets(broker, t.compact)) & (superseded | tombstones))

    until(cleaned, 60, "the cleaner removed the superseded records and the tombstones")
    in_log = set(log_offsets(broker, t.compact))
    sink = Sink(broker, t, "cmp-sink", t.group("cmp-sink"), t.compact)
    sink.start()
    sink.stop.set()
    sink.join(60)
    assert sink.error is None, sink.error
    scenario = Scenario("compacted topic", facts={
        "messages": len(keys), "keys": 20, "tombstones": len(tombstones),
        "left in the log": len(in_log & {at[m][1] for m in keys}), "sink got": len(sink.received),
    })  # fmt: skip
    for message_id, (key, tombstone) in keys.items():
        scenario.expected[(message_id, write_hop("cmp-producer", t.compact))] = (D, None)
        later_of_key = newest[key] > at[message_id][1]
        got = sink.received[message_id]
        # read, or removed by compaction: behind a later record of its key, or a tombstone past delete.retention.ms
        verdict = D if got == 1 else S if later_of_key or tombstone else L
        scenario.expected[(message_id, read_hop(t.compact, sink.consumer.group_id))] = (
            verdict, "compacted" if verdict == S else None
        )  # fmt: skip
    return scenario


def compact_delete(broker: BrokerProcess, t: Topics) -> Scenario:
    """compact,delete with a 3 s retention: 10 records on keys c0..c9, left until retention has removed them, then
    (retention raised to an hour) 5 newer ones on c0..c4; a sink reads what is left. c0..c4's first records are
    superseded, c5..c9's expired: the sink never had a value of those keys."""
    source_emitter = emitter(broker, t, "cd-producer")
    producer = TracedProducer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0},
                              emitter=source_emitter, stream="sem.compact-delete")  # fmt: skip
    at: dict[str, tuple[int, int]] = {}

    def write(generation: str, keys: range) -> dict[str, str]:
        ids = {f"cd-{t.run}-{generation}-{i}": f"c{i}" for i in keys}
        for message_id, key in ids.items():
            producer.produce(t.compact_delete, value=generation.encode(), key=key.encode(),
                             on_delivery=delivered_at(at, message_id), message_id=message_id)  # fmt: skip
        producer.flush(10)
        return ids

    first = write("old", range(10))
    last_old = max(offset for _, offset in at.values())
    admin = broker.admin()
    until(lambda: admin.log_starts([(t.compact_delete, 0)]).found[(t.compact_delete, 0)] > last_old, 60,
          "retention removed the first records")  # fmt: skip
    snapshot_offsets(broker, t)  # as the snapshot DAG does every minute: the log start, under a 3 s retention
    # from here on the topic keeps an hour, as a real one keeps days: the newer records are still there when the
    # detector judges the old ones (3 s would take them too, seconds after the sink read them)
    set_retention(broker, t.compact_delete, 3_600_000)
    second = write("new", range(5))
    source_emitter.close()
    sink = Sink(broker, t, "cd-sink", t.group("cd-sink"), t.compact_delete)
    sink.start()
    sink.stop.set()
    sink.join(60)
    assert sink.error is None, sink.error
    facts = {"messages": len(first) + len(second), "rewritten keys": 5, "sink got": len(sink.received)}
    scenario = Scenario("compact,delete topic", facts=facts)
    hop = read_hop(t.compact_delete, sink.consumer.group_id)
    for message_id, key in {**first, **second}.items():
        assert message_id is not None
        scenario.expected[(message_id, write_hop("cd-producer", t.compact_delete))] = (D, None)
        newer_read = any(sink.received[m] for m, k in second.items() if k == key and m != message_id)
        scenario.expected[(message_id, hop)] = (
            (D, None) if sink.received[message_id] == 1 else (S, "compacted") if newer_read else (L, "expired")
        )
    return scenario


def skewed_clocks(broker: BrokerProcess, t: Topics) -> Scenario:
    """A producer whose host clock runs 30 s ahead (its records' CreateTime and its traces) and a sink whose clock
    runs 30 s behind: 40 messages, every one delivered, every latency impossible."""
    source_emitter = emitter(broker, t, "skew-producer", SKEW_MS)
    producer = TracedProducer({"bootstrap.servers": broker.bootstrap_servers}, emitter=source_emitter,
                              stream="sem.skew")  # fmt: skip
    sink = Sink(broker, t, "skew-sink", t.group("skew-sink"), t.skew, skew_ms=-SKEW_MS)
    sink.start()
    ids = []
    for i in range(40):
        ahead = time.time_ns() // 1_000_000 + SKEW_MS  # what the producer's host stamps on its records
        ids.append(producer.produce(t.skew, value=f"s{i}".encode(), timestamp=ahead, message_id=f"skew-{t.run}-{i}"))
        time.sleep(0.02)
    producer.flush(10)
    source_emitter.close()
    time.sleep(2)
    sink.stop.set()
    sink.join(60)
    assert sink.error is None, sink.error
    scenario = Scenario("skewed clocks", facts={"messages": len(ids), "sink got": len(sink.received)})
    for message_id in ids:
        assert message_id is not None
        scenario.expected[(message_id, write_hop("skew-producer", t.skew))] = (D, None)
        got = sink.received[message_id]
        scenario.expected[(message_id, read_hop(t.skew, sink.consumer.group_id))] = (D if got == 1 else L, None)
    return scenario


# -- one detector for all of them -------------------------------------------------------------------------------


@dataclass
class Run:
    scenarios: dict[str, Scenario]
    verdicts: dict[tuple[str, str], dict[str, Any]]
    store: Store
    topics: Topics


@pytest.fixture(scope="module")
def run(broker: BrokerProcess, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("semantics")
    suffix = secrets.token_hex(3)
    t = Topics(suffix, *(f"sem-{name}-{suffix}" for name in
                         ("traces", "txn", "eos-in", "eos-out", "compact", "compact-delete", "skew")))  # fmt: skip
    admin = broker.admin()
    admin.ensure_trace_topic(t.trace, 3)
    compacted = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
                 "delete.retention.ms": "1000", "min.compaction.lag.ms": "0"}  # fmt: skip
    admin.ensure_topics(
        {t.txn: 2, t.eos_in: 2, t.eos_out: 2, t.compact: 1, t.compact_delete: 1, t.skew: 1},
        {
            t.compact: compacted,
            t.compact_delete: {**compacted, "cleanup.policy": "compact,delete", "retention.ms": "3000"},
        },
    )
    registry = t.registry = tmp / "registry.yaml"
    registry.write_text(registry_text(t))
    store_url = t.store_url = f"sqlite:///{tmp / 'store.db'}"
    Store(store_url).migrate()
    job = DetectorJob(registry_path=registry, trace_connection=broker.connection(), store_url=store_url,
                      checkpoint_dir=tmp / "checkpoint", archive_dir=tmp / "archive", verdicts_dir=tmp / "verdicts",
                      trace_topic=t.trace, lost_topic=None, trigger_seconds=1.0, detector=CONFIG)  # fmt: skip
    queries = start_detector(spark, job)
    store = Store(store_url)
    try:
        pipelines = (transactions, exactly_once, compaction, compact_delete, skewed_clocks)
        results = play_at_once([functools.partial(pipeline, broker, t) for pipeline in pipelines], 300)
        yield Run(results, decided(store, job.verdicts_dir, results.values()), store, t)
    finally:
        for query in queries:
            query.stop()
        store.close()


def compare(run: Run, name: str) -> Counter[tuple[str, str, str | None, str, str | None]]:
    """Every expected verdict beside the stored one; prints the counts (expected vs verdicts) of the scenario."""
    scenario = run.scenarios[name]
    pairs: Counter[tuple[str, str, str | None, str, str | None]] = Counter()
    for (message_id, hop), (verdict, cause) in scenario.expected.items():
        stored = run.verdicts.get((message_id, hop), {})
        pairs[(hop.split(" -> ")[-1] if hop.startswith("local/") else hop.split(" -> ")[0], verdict, cause,
               stored.get("verdict"), stored.get("cause"))] += 1  # fmt: skip
    print(f"\n{name}: {scenario.facts}")
    for (message_id, hop), (verdict, cause) in scenario.expected.items():
        stored = run.verdicts.get((message_id, hop), {})
        if (stored.get("verdict"), stored.get("cause")) != (verdict, cause):
            print(f"  differs: {message_id} at {hop}: {stored.get('detail')}")
    for (where, verdict, cause, got, got_cause), number in sorted(pairs.items(), key=str):
        mark = "" if (verdict, cause) == (got, got_cause) else "   <-- differs"
        print(f"  {where:28} expected {verdict}/{cause or '-'}: {number}; stored {got}/{got_cause or '-'}{mark}")
    return pairs


def assert_exact(run: Run, name: str) -> None:
    pairs = compare(run, name)
    wrong = {key: number for key, number in pairs.items() if key[1:3] != key[3:5]}
    assert not wrong, wrong


def stored(run: Run, name: str, hop: str | None = None) -> Counter[tuple[str, str | None]]:
    """(verdict, cause) of the verdicts Khipu stored for the scenario's messages (at one hop, if named)."""
    keys = [key for key in run.scenarios[name].expected if hop is None or key[1] == hop]
    return Counter((run.verdicts[key]["verdict"], run.verdicts[key]["cause"]) for key in keys)


def test_an_aborted_transaction_is_aborted_at_every_hop_and_no_committed_one_is_lost(run: Run) -> None:
    assert_exact(run, "transactions")
    scenario, t = run.scenarios["transactions"], run.topics
    aborted = scenario.facts["aborted"]  # what the producer aborted
    assert stored(run, "transactions", write_hop("txn-producer", t.txn))[(A, None)] == aborted > 0
    for group in ("txn-committed", "txn-uncommitted"):  # the group that never saw them, and the one that did
        assert stored(run, "transactions", read_hop(t.txn, t.group(group)))[(A, None)] == aborted
    assert scenario.facts["read_uncommitted got"] - scenario.facts["read_committed got"] == aborted
    for message_id in scenario.facts["slow"]:  # committed 8 s after its writes: never LOST or PENDING on the way
        said = {entry["to_verdict"] for entry in run.store.verdicts.history(message_id)}
        assert not said & {L, "PENDING"}, (message_id, said)


def test_an_exactly_once_processor_reprocessing_after_an_abort_writes_once_and_is_no_duplicate(run: Run) -> None:
    assert_exact(run, "exactly-once processor")
    reprocessed = run.scenarios["exactly-once processor"].facts["messages reprocessed"]  # the processor's own count
    assert stored(run, "exactly-once processor")[(DUP, "reprocessed_after_abort")] == reprocessed > 0


def test_records_compaction_removed_behind_a_later_record_of_their_key_are_superseded(run: Run) -> None:
    assert_exact(run, "compacted topic")
    facts = run.scenarios["compacted topic"].facts
    got = stored(run, "compacted topic", read_hop(run.topics.compact, run.topics.group("cmp-sink")))
    assert got[(S, "compacted")] == facts["messages"] - facts["sink got"] > 0 and got[(D, None)] == facts["sink got"]


def test_compact_delete_tells_expired_records_from_those_a_newer_record_of_their_key_supersedes(run: Run) -> None:
    assert_exact(run, "compact,delete topic")
    got = stored(run, "compact,delete topic", read_hop(run.topics.compact_delete, run.topics.group("cd-sink")))
    rewritten = run.scenarios["compact,delete topic"].facts["rewritten keys"]  # of the 10 keys that expired
    assert (got[(S, "compacted")], got[(L, "expired")], got[(D, None)]) == (rewritten, 10 - rewritten, rewritten)


def test_skewed_clocks_change_no_verdict_and_their_impossible_latencies_are_counted_as_skew(run: Run) -> None:
    assert_exact(run, "skewed clocks")
    hop = read_hop(run.topics.skew, run.topics.group("skew-sink"))
    latencies = [v["latency_ms"] for (_, h), v in run.verdicts.items() if h == hop]
    assert len(latencies) == 40 and all(ms is not None and ms < -SKEW_MS for ms in latencies)  # -60 s, as measured
    minutes = [m for m in run.store.verdicts.read_metrics("sem.skew") if m["hop"] == hop]
    counts = [MinuteCounts.of_row(m) for m in minutes]
    assert sum(c.skewed for c in counts) == 40 and sum(c.latency_count for c in counts) == 0
    assert {(m["latency_p50_ms"], m["latency_p99_ms"]) for m in minutes} == {(None, None)}  # no negative percentile
    assert run.topics.registry is not None  # Khipu's health page names the two emitters whose clocks disagree
    health = khipu_health(run.store, time.time_ns() // 1_000_000, registry=load_registry(run.topics.registry))
    [line] = [k for k in health.clock_skew if k.hop == hop]
    assert (line.earlier, line.later, line.impossible) == ("skew-producer", "skew-sink", 40)
    assert line.worst_ms < -SKEW_MS and health.skew_by_emitter == {"skew-producer": 40, "skew-sink": 40}
