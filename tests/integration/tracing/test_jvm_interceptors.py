"""JVM applications traced by configuration alone, end to end on real brokers under one streaming detector.

Every application here is a real JVM process that knows nothing of Khipu: its properties name Khipu's interceptors
(jvm/tracing) and a few ``khipu.*`` settings. Three pipelines:

- (a) a plain Java producer (kafka-clients 4.4) and a plain Java consumer on kafka-clients 3.9.1, which seeks past
  the first records of one partition (they are never fetched: lost at its hop);
- (b) a Kafka Streams 4.4 processor, once at-least-once and once with ``exactly_once_v2``, dropping the records
  whose key ends in 7 by its own rule, with a Java sink behind it;
- (c) MirrorMaker 2 (connect-mirror 4.3.1) replicating a topic from the session's broker to a second one, its
  clients traced by configuration: a route across two clusters with one hop per cluster.

Ground truth is each application's own ledger (what it wrote and had acknowledged, what it took and dropped, what it
received, what it skipped) and the logs themselves (a plain read of a topic: which records carry a message id, which
MirrorMaker wrote), never Khipu's output. Every stored verdict must be the expected one, and no other verdict exists.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from khipu.detector.job import DetectorJob, start_detector
from khipu.detector.model import DetectorConfig
from khipu.localstack.broker import BrokerProcess
from khipu.localstack.processes import stop_process_group
from khipu.settings import project_root
from khipu.store import Store
from khipu.trace import Trace, TraceType
from khipu.trace.keys import key_hash
from khipu.tracing.headers import trace_context
from tests.integration.detector.conftest import decided, play_at_once
from tests.integration.helpers import stream_yaml, traces_of, until

pytestmark = pytest.mark.integration

JVM = project_root() / ".jvm"
TRACING_JAR = JVM / "tracing" / "khipu-tracing.jar"
CONFIG = DetectorConfig(grace_ms=4_000, max_wait_ms=120_000, recheck_ms=1_000)
D, L = "DELIVERED", "LOST"
Expected = dict[tuple[str, str], tuple[str, str | None]]  # (message id, hop) -> (verdict, cause)


@dataclass
class Scenario:
    name: str
    expected: Expected = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    keys: dict[tuple[str, int, int], str] = field(default_factory=dict)  # (topic, partition, offset) -> key written


@dataclass
class Setup:
    run: str
    tmp: Path
    trace_topic: str
    local: BrokerProcess
    mirror: BrokerProcess

    def topic(self, name: str) -> str:
        return f"jvm-{name}-{self.run}"


def write_hop(location: str, cluster: str, topic: str) -> str:
    return f"{location} -> {cluster}/{topic}"


def read_hop(cluster: str, topic: str, group: str) -> str:
    return f"{cluster}/{topic} -> {group}"


# -- running the applications ----------------------------------------------------------------------------------------


def properties(path: Path, settings: dict[str, Any]) -> Path:
    path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
    return path


def java(classpath: list[Path | str], main: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    command = ["java", "-Xmx256m", "-cp", os.pathsep.join(str(p) for p in classpath), main, *args]
    return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def app(args: list[str], log: Path, clients_3: bool = False) -> subprocess.Popen[bytes]:
    """One of jvm/testapps' applications, on kafka-clients 4.4 (with Kafka Streams) or on kafka-clients 3.9.1."""
    libraries = (
        [JVM / "testapps" / "khipu-testapps.jar", JVM / "clients-3" / "*"] if clients_3 else [JVM / "testapps" / "*"]
    )
    return java([*libraries, TRACING_JAR], "io.khipu.testapps.Apps", args, log)


def finish(process: subprocess.Popen[bytes], log: Path, timeout_s: float = 120) -> None:
    try:
        code = process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        stop_process_group(process.pid)
        raise AssertionError(
            f"{log.name} did not finish within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}"
        ) from None
    assert code == 0, f"{log.name} exited {code}:\n{log.read_text()[-3000:]}"


def ledger(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def traced(settings: dict[str, Any], s: Setup, location: str, cluster: str = "local") -> dict[str, Any]:
    """``settings`` plus what tracing needs: the interceptor and the khipu.* settings (traces to the session broker)."""
    return {
        **settings,
        "khipu.location": location,
        "khipu.cluster": cluster,
        "khipu.trace.topic": s.trace_topic,
        "khipu.trace.bootstrap.servers": s.local.bootstrap_servers,
        "khipu.mark.interval.ms": 1000,
    }


def producer_properties(s: Setup, location: str, stream: str, percent: float) -> dict[str, Any]:
    return traced(
        {
            "bootstrap.servers": s.local.bootstrap_servers,
            "interceptor.classes": "io.khipu.tracing.KhipuProducerInterceptor",
            "khipu.stream": stream,
            "khipu.sampling.percent": percent,
            "linger.ms": 5,
        },
        s,
        location,
    )


def consumer_properties(
    on: BrokerProcess, s: Setup, group: str, cluster: str = "local", **extra: Any
) -> dict[str, Any]:
    return traced(
        {
            "bootstrap.servers": on.bootstrap_servers,
            "interceptor.classes": "io.khipu.tracing.KhipuConsumerInterceptor",
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": "false",
            "session.timeout.ms": 6000,
            **extra,
        },
        s,
        group,
        cluster,
    )


def produce(
    s: Setup, name: str, topic: str, stream: str, percent: float, count: int, own_ids: bool = False
) -> dict[tuple[int, int], str]:
    """Run the Java producer (``own_ids``: it names its messages itself, order-N); its ledger's acknowledged writes, as
    (partition, offset) -> key."""
    props = properties(s.tmp / f"{name}-producer.properties", producer_properties(s, "java-producer", stream, percent))
    book, log = s.tmp / f"{name}-producer.jsonl", s.tmp / f"{name}-producer.log"
    finish(app(["produce", str(props), topic, str(count), str(book), *(["ids"] if own_ids else [])], log), log)
    written = ledger(book)
    assert len(written) == count and all(entry["acknowledged"] for entry in written)
    return {(entry["partition"], entry["offset"]): entry["key"] for entry in written}


def message_ids_in_log(on: BrokerProcess, topic: str, partitions: int) -> dict[tuple[int, int], str | None]:
    """What the log holds: each record's (partition, offset) and the message id of a traced record (its headers carry a
    stream: it is in the sample), None for an untraced one."""
    consumer = Consumer({"bootstrap.servers": on.bootstrap_servers, "group.id": f"peek-{secrets.token_hex(3)}",
                         "enable.partition.eof": True, "isolation.level": "read_committed"})  # fmt: skip
    found: dict[tuple[int, int], str | None] = {}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        ended: set[int] = set()
        while len(ended) < partitions:
            message = consumer.poll(10)
            assert message is not None, f"no answer reading {topic}"
            if message.error() is not None:
                ended.add(message.partition())
                continue
            context = trace_context(message.headers())
            found[(message.partition(), message.offset())] = None if context is None else context.message_id
    finally:
        consumer.close()
    return found


# -- the three pipelines -----------------------------------------------------------------------------------------------


def plain_clients(s: Setup) -> Scenario:
    """(a) A Java producer at 50 % sampling that names its messages itself (so which are sampled is the same on every
    run), and a Java consumer on kafka-clients 3.9.1 that seeks partition 0 from 0 to 10 when it is assigned: records
    0-9 there are never fetched, and the group commits past them."""
    topic, group = s.topic("plain"), "java-sink"
    s.local.admin().ensure_topics({topic: 2})
    acknowledged = produce(s, "plain", topic, "jvm.plain", 50, 120, own_ids=True)
    ids = message_ids_in_log(s.local, topic, 2)
    props = properties(
        s.tmp / "plain-sink.properties", consumer_properties(s.local, s, group, **{"max.poll.records": 20})
    )
    book, log = s.tmp / "plain-sink.jsonl", s.tmp / "plain-sink.log"
    finish(app(["consume", str(props), topic, "110", str(book), "0:0:10"], log, clients_3=True), log)
    entries = ledger(book)
    skipped = {  # (a rebalance before its first commit makes it seek again: the same records)
        (e["skipped_partition"], o)
        for e in entries
        if "skipped_from" in e
        for o in range(e["skipped_from"], e["skipped_to"])
    }
    received = {(e["partition"], e["offset"]) for e in entries if "offset" in e}
    scenario = Scenario("plain clients", keys={(topic, *where): key for where, key in acknowledged.items()})
    for where in acknowledged:
        message_id = ids[where]
        if message_id is None:
            continue  # not in the sample: untraced everywhere
        scenario.expected[(message_id, write_hop("java-producer", "local", topic))] = (D, None)
        if where in received:
            scenario.expected[(message_id, read_hop("local", topic, group))] = (D, None)
        else:
            assert where in skipped, where
            scenario.expected[(message_id, read_hop("local", topic, group))] = (L, "skipped_by_consumer")
    sampled = sum(1 for where in acknowledged if ids[where] is not None)
    lost = sum(1 for where in skipped if ids[where] is not None)
    scenario.facts = {
        "written": len(acknowledged),
        "sampled": sampled,
        "skipped": len(skipped),
        "sampled skipped": lost,
    }
    assert 30 < sampled < 90 and len(received) == len(acknowledged) - len(skipped)
    return scenario


def kafka_streams(s: Setup, guarantee: str) -> Scenario:
    """(b) Java producer -> Kafka Streams processor (drops keys ending in 7) -> Java sink."""
    short = "eos" if guarantee == "exactly_once_v2" else "alos"
    source, output = s.topic(f"streams-{short}-in"), s.topic(f"streams-{short}-out")
    app_id, sink = f"streams-{short}", f"streams-{short}-sink"
    s.local.admin().ensure_topics({source: 2, output: 2})
    acknowledged = produce(s, f"streams-{short}", source, f"jvm.streams-{short}", 100, 60)
    settings = {
        "application.id": app_id,
        "bootstrap.servers": s.local.bootstrap_servers,
        "processing.guarantee": guarantee,
        "consumer.interceptor.classes": "io.khipu.tracing.KhipuConsumerInterceptor",
        "producer.interceptor.classes": "io.khipu.tracing.KhipuProducerInterceptor",
        "consumer.session.timeout.ms": 6000,
    }
    for prefix in ("consumer.", "producer."):
        settings.update({prefix + key: value for key, value in traced({}, s, app_id).items()})
    props = properties(s.tmp / f"{app_id}.properties", settings)
    book, log = s.tmp / f"{app_id}.jsonl", s.tmp / f"{app_id}.log"
    processor = app(["streams", str(props), source, output, str(len(acknowledged)), str(book)], log)
    isolation = {"isolation.level": "read_committed"} if short == "eos" else {}
    sink_props = properties(s.tmp / f"{sink}.properties", consumer_properties(s.local, s, sink, **isolation))
    sink_book, sink_log = s.tmp / f"{sink}.jsonl", s.tmp / f"{sink}.log"
    finish(processor, log)
    taken_by_processor = ledger(book)
    kept = [e for e in taken_by_processor if not e["dropped"]]
    finish(app(["consume", str(sink_props), output, str(len(kept)), str(sink_book)], sink_log), sink_log)
    sink_got = {e["message_id"] for e in ledger(sink_book)}
    scenario = Scenario(f"Kafka Streams {guarantee}")
    hops = (write_hop("java-producer", "local", source), read_hop("local", source, app_id),
            write_hop(app_id, "local", output), read_hop("local", output, sink))  # fmt: skip
    by_position = {(e["partition"], e["offset"]): e for e in taken_by_processor}
    for where in acknowledged:
        taken = by_position[where]  # the processor took every record written (its ledger says which it dropped)
        message_id = taken["message_id"]
        scenario.expected[(message_id, hops[0])] = (D, None)
        scenario.expected[(message_id, hops[1])] = (D, None)
        if taken["dropped"]:
            scenario.expected[(message_id, hops[2])] = (L, "dropped_in_processor")
        else:
            assert message_id in sink_got, message_id
            scenario.expected[(message_id, hops[2])] = (D, None)
            scenario.expected[(message_id, hops[3])] = (D, None)
    dropped = len(taken_by_processor) - len(kept)
    scenario.facts = {"written": len(acknowledged), "processor took": len(taken_by_processor), "dropped": dropped,
                      "sink got": len(sink_got)}  # fmt: skip
    assert len(taken_by_processor) == len(acknowledged) and dropped == 6 and len(sink_got) == len(kept)
    return scenario


def mirror_maker(s: Setup) -> Scenario:
    """(c) Java producer on the session's cluster ("local") -> MirrorMaker 2 -> "mirror"'s local.<topic> -> Java sink
    there. MirrorMaker's source consumer has no group: khipu.group names its read hop."""
    topic = s.topic("mirrored")
    target, sink = f"local.{topic}", "mirror-sink"
    s.local.admin().ensure_topics({topic: 2})
    s.mirror.admin().ensure_topics({target: 2})
    acknowledged = produce(s, "mirrored", topic, "jvm.mirror", 100, 40)
    ids = message_ids_in_log(s.local, topic, 2)
    settings: dict[str, Any] = {
        "clusters": "local, mirror",
        "local.bootstrap.servers": s.local.bootstrap_servers,
        "mirror.bootstrap.servers": s.mirror.bootstrap_servers,
        "local->mirror.enabled": "true",
        "local->mirror.topics": topic,
        "mirror->local.enabled": "false",
        "replication.factor": 1,
        "sync.topic.configs.enabled": "false",
        "sync.topic.acls.enabled": "false",
        "refresh.topics.interval.seconds": 1,
        # the replication flow's consumer (MirrorSourceTask's) takes the flow's consumer.* settings
        "local->mirror.consumer.interceptor.classes": "io.khipu.tracing.KhipuConsumerInterceptor",
        "mirror.producer.interceptor.classes": "io.khipu.tracing.KhipuProducerInterceptor",
    }
    for name in ("offset-syncs", "checkpoints", "heartbeats", "offset.storage", "status.storage", "config.storage"):
        settings[f"{name}.topic.replication.factor" if "." not in name else f"{name}.replication.factor"] = 1
    flow_consumer = traced({"khipu.group": "mm2"}, s, "mm2", "local")
    settings.update({f"local->mirror.consumer.{k}": v for k, v in flow_consumer.items()})
    settings.update({f"mirror.producer.{k}": v for k, v in traced({}, s, "mm2", "mirror").items()})
    props = properties(s.tmp / "mm2.properties", settings)
    log = s.tmp / "mm2.log"
    mm2 = java([JVM / "mirror" / "*", TRACING_JAR], "org.apache.kafka.connect.mirror.MirrorMaker", [str(props)], log)
    try:
        until(lambda: len(message_ids_in_log(s.mirror, target, 2)) >= len(acknowledged), 120,
              "MirrorMaker 2 replicated every record")  # fmt: skip
    finally:
        stop_process_group(mm2.pid)
        mm2.wait(30)
    replicated = message_ids_in_log(s.mirror, target, 2)
    props_sink = consumer_properties(s.mirror, s, sink, cluster="mirror")
    sink_props = properties(s.tmp / "mirror-sink.properties", props_sink)
    book, sink_log = s.tmp / "mirror-sink.jsonl", s.tmp / "mirror-sink.log"
    finish(app(["consume", str(sink_props), target, str(len(replicated)), str(book)], sink_log), sink_log)
    sink_got = Counter(e["message_id"] for e in ledger(book))
    scenario = Scenario("MirrorMaker 2")
    in_target = Counter(replicated.values())
    for where in acknowledged:
        message_id = ids[where]
        assert message_id is not None and in_target[message_id] == 1 and sink_got[message_id] == 1, message_id
        scenario.expected[(message_id, write_hop("java-producer", "local", topic))] = (D, None)
        scenario.expected[(message_id, read_hop("local", topic, "mm2"))] = (D, None)
        scenario.expected[(message_id, write_hop("mm2", "mirror", target))] = (D, None)
        scenario.expected[(message_id, read_hop("mirror", target, sink))] = (D, None)
    scenario.facts = {"written": len(acknowledged), "replicated": len(replicated), "sink got": sum(sink_got.values())}
    return scenario


def registry_text(s: Setup) -> str:
    def stream(name: str, producer: str, topic: str, consumers: list[str]) -> str:
        return stream_yaml(name, "team-jvm", producer, topic, consumers)

    def streams(short: str) -> str:
        source, output = s.topic(f"streams-{short}-in"), s.topic(f"streams-{short}-out")
        return stream(f"jvm.streams-{short}", "java-producer", source, [
            f"{{group: streams-{short}, location: streams-{short}, reads: [local/{source}], writes: [local/{output}]}}",
            f"{{group: streams-{short}-sink, location: streams-{short}-sink, reads: [local/{output}]}}",
        ])  # fmt: skip

    mirrored = s.topic("mirrored")
    return "version: 1\nclusters: {local: {}, mirror: {}}\nstreams:\n" + "".join(
        [
            stream("jvm.plain", "java-producer", s.topic("plain"), [
                f"{{group: java-sink, location: java-sink, reads: [local/{s.topic('plain')}]}}",
            ]),
            streams("alos"),
            streams("eos"),
            stream("jvm.mirror", "java-producer", mirrored, [
                f"{{group: mm2, location: mm2, reads: [local/{mirrored}], writes: [mirror/local.{mirrored}], "
                "commits_offsets: false}",
                f"{{group: mirror-sink, location: mirror-sink, reads: [mirror/local.{mirrored}]}}",
            ]),
        ]
    )  # fmt: skip


# -- one detector for all of them -----------------------------------------------------------------------------------


@dataclass
class Run:
    scenarios: dict[str, Scenario]
    verdicts: dict[tuple[str, str], dict[str, Any]]
    traces: list[Trace]
    setup: Setup


@pytest.fixture(scope="module")
def run(
    broker: BrokerProcess, second_broker: BrokerProcess, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Run]:
    missing = [p for p in (TRACING_JAR, JVM / "testapps" / ".installed", JVM / "clients-3" / ".installed",
                           JVM / "mirror" / ".installed") if not p.exists()]  # fmt: skip
    assert not missing, f"run `make test` (it builds them): missing {missing}"
    tmp = tmp_path_factory.mktemp("jvm")
    s = Setup(secrets.token_hex(3), tmp, f"jvm-traces-{secrets.token_hex(3)}", broker, second_broker)
    broker.admin().ensure_trace_topic(s.trace_topic, 3)
    registry = tmp / "registry.yaml"
    registry.write_text(registry_text(s))
    store_url = f"sqlite:///{tmp / 'store.db'}"
    Store(store_url).migrate()
    job = DetectorJob(registry_path=registry, trace_connection=broker.connection(), store_url=store_url,
                      checkpoint_dir=tmp / "checkpoint", archive_dir=tmp / "archive", verdicts_dir=tmp / "verdicts",
                      trace_topic=s.trace_topic, lost_topic=None, trigger_seconds=1.0, detector=CONFIG,
                      cluster_connections={"local": broker.connection("local"),
                                           "mirror": second_broker.connection("mirror")})  # fmt: skip
    queries = start_detector(spark, job)
    store = Store(store_url)
    try:
        pipelines = [
            functools.partial(plain_clients, s),
            functools.partial(kafka_streams, s, "at_least_once"),
            functools.partial(kafka_streams, s, "exactly_once_v2"),
            functools.partial(mirror_maker, s),
        ]
        results = play_at_once(pipelines, 400)
        verdicts = decided(store, job.verdicts_dir, results.values())
        yield Run(results, verdicts, traces_of(broker, s.trace_topic), s)
    finally:
        for query in queries:
            query.stop()
        store.close()


def assert_exact(run: Run, name: str) -> Counter[tuple[str, str, str | None]]:
    """Every expected verdict is stored, and no other verdict of the scenario's messages; returns the counts."""
    scenario = run.scenarios[name]
    ids = {message_id for message_id, _ in scenario.expected}
    got = {key: (v["verdict"], v["cause"]) for key, v in run.verdicts.items() if key[0] in ids}
    print(f"\n{name}: {scenario.facts}")
    counts: Counter[tuple[str, str, str | None]] = Counter()
    for (message_id, hop), want in sorted(scenario.expected.items()):
        counts[(hop, *want)] += 1
        if got.get((message_id, hop)) != want:
            stored = run.verdicts.get((message_id, hop), {})
            print(f"  differs: {message_id} at {hop}: expected {want}, stored {got.get((message_id, hop))}: "
                  f"{stored.get('detail')}")  # fmt: skip
    for (hop, verdict, cause), number in sorted(counts.items(), key=str):
        print(f"  {hop:60} {verdict}/{cause or '-'}: {number}")
    assert got == scenario.expected
    return counts


def test_a_plain_java_producer_and_a_kafka_clients_3_consumer_are_traced_by_configuration_alone(run: Run) -> None:
    counts = assert_exact(run, "plain clients")
    facts = run.scenarios["plain clients"].facts
    lost = sum(n for (_, verdict, cause), n in counts.items() if (verdict, cause) == (L, "skipped_by_consumer"))
    assert lost == facts["sampled skipped"] > 0  # what the consumer's own ledger says it skipped, sampled


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
def test_a_kafka_streams_processor_is_a_traced_hop_and_its_own_drops_are_lost_in_it(run: Run, guarantee: str) -> None:
    name = f"Kafka Streams {guarantee}"
    counts = assert_exact(run, name)
    dropped = sum(n for (_, verdict, cause), n in counts.items() if (verdict, cause) == (L, "dropped_in_processor"))
    assert dropped == run.scenarios[name].facts["dropped"] == 6


def test_mirror_maker_2_replicating_between_two_clusters_is_a_route_with_one_hop_per_cluster(run: Run) -> None:
    counts = assert_exact(run, "MirrorMaker 2")
    mirrored = run.scenarios["MirrorMaker 2"].facts["written"]
    mm2_hops = {hop: n for (hop, verdict, _), n in counts.items() if "mm2" in hop and verdict == D}
    assert sorted(mm2_hops) == sorted(h for h in mm2_hops if h.startswith("local/") or h.startswith("mm2 -> mirror/"))
    assert list(mm2_hops.values()) == [mirrored, mirrored]  # its read on one cluster, its write on the other


def test_the_jvm_traces_say_what_kafkas_semantics_need_of_each_record(run: Run) -> None:
    """Beyond the verdicts: each SENT trace's key hash is the hash of the key the producer's ledger says it wrote there,
    an exactly-once processor's writes say transactional (an at-least-once one's do not), and a sink says it reads
    uncommitted exactly when its configuration does (the Java client's default; the exactly-once sink reads
    committed)."""
    s, plain = run.setup, run.scenarios["plain clients"]
    sent = [
        t
        for t in run.traces
        if t.type is TraceType.SENT and t.location == "java-producer" and t.topic == s.topic("plain")
    ]
    assert len(sent) == plain.facts["sampled"]
    assert all(t.key_hash == key_hash(plain.keys[(t.topic, t.partition, t.offset)].encode()) for t in sent)
    assert not any(t.tombstone or t.transactional for t in sent)

    def flags(location: str, kind: TraceType, flag: str) -> set[bool]:
        return {getattr(t, flag) for t in run.traces if t.location == location and t.type is kind}

    assert flags("streams-eos", TraceType.SENT, "transactional") == {True}
    assert flags("streams-alos", TraceType.SENT, "transactional") == {False}
    assert flags("streams-eos-sink", TraceType.RECEIVED, "read_uncommitted") == {False}
    assert flags("streams-alos-sink", TraceType.RECEIVED, "read_uncommitted") == {True}
    assert flags("java-sink", TraceType.RECEIVED, "read_uncommitted") == {True}  # kafka-clients 3.9.1's default
