"""Typed, immutable registry values. Built only by :mod:`khipu.registry.loader`, which validates."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from khipu.trace.model import Trace, TraceType

# A stream's owner names a team: Airflow's rule for a team's name, which the team's manual resend DAG's id and its DAG
# bundle's name hold too (khipu.access.dags); the registry refuses any other at load.
OWNER_PATTERN = re.compile(r"^[A-Za-z0-9_-]{3,50}$")
OWNER_RULE = "an Airflow team name: 3-50 letters, digits, '-' or '_' (a team's DAG id and DAG bundle name hold it)"


class UnknownStreamError(KeyError):
    """A stream name that the registry does not define."""

    def __init__(self, name: str, known: tuple[str, ...]) -> None:
        super().__init__(name)
        self.name = name
        self.known = known

    def __str__(self) -> str:
        known = ", ".join(self.known) or "none"
        return f"unknown stream {self.name!r}; the registry defines: {known}"


@dataclass(frozen=True, slots=True)
class TopicRef:
    """A topic on a named cluster, written ``cluster/topic`` in the registry."""

    cluster: str
    topic: str

    def __str__(self) -> str:
        return f"{self.cluster}/{self.topic}"


class HopKind(StrEnum):
    WRITE = "write"  # a location writes to a topic; evidenced by SENT traces
    READ = "read"  # a consumer group reads a topic; evidenced by RECEIVED traces


@dataclass(frozen=True, slots=True)
class Hop:
    """One edge of a route.

    A write hop is ``location -> cluster/topic``; a read hop is ``cluster/topic -> group``.
    """

    kind: HopKind
    topic: TopicRef
    location: str | None = None
    group: str | None = None

    @staticmethod
    def write(location: str, topic: TopicRef) -> Hop:
        return Hop(HopKind.WRITE, topic, location=location)

    @staticmethod
    def read(topic: TopicRef, group: str) -> Hop:
        return Hop(HopKind.READ, topic, group=group)

    @staticmethod
    def of_trace(trace: Trace) -> Hop:
        """The hop a trace is evidence for."""
        topic = TopicRef(trace.cluster, trace.topic)
        if trace.type is TraceType.SENT:
            return Hop.write(trace.location, topic)
        assert trace.group is not None  # decode_trace guarantees a group on RECEIVED traces
        return Hop.read(topic, trace.group)

    @property
    def id(self) -> str:
        if self.kind is HopKind.WRITE:
            return f"{self.location} -> {self.topic}"
        return f"{self.topic} -> {self.group}"

    def __str__(self) -> str:
        return self.id


@dataclass(frozen=True, slots=True)
class ProducerSpec:
    """A source application location that writes the stream's messages."""

    location: str
    writes: tuple[TopicRef, ...]


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    """A consumer group reading topics of the route; with ``writes`` it is a processor. ``commits_offsets`` false:
    the group keeps its offsets outside Kafka (MirrorMaker 2's source consumer, a Flink job that does not commit on
    checkpoints), so no committed offset ever passes what it read: a receipt passes its record instead."""

    group: str
    location: str
    reads: tuple[TopicRef, ...]
    writes: tuple[TopicRef, ...] = ()
    commits_offsets: bool = True

    @property
    def is_processor(self) -> bool:
        return bool(self.writes)


@dataclass(frozen=True, slots=True)
class Route:
    producers: tuple[ProducerSpec, ...]
    consumers: tuple[ConsumerSpec, ...]

    @property
    def hops(self) -> tuple[Hop, ...]:
        """Every hop of the route: producer writes, then each group's reads and writes."""
        hops = [Hop.write(p.location, t) for p in self.producers for t in p.writes]
        for consumer in self.consumers:
            hops.extend(Hop.read(t, consumer.group) for t in consumer.reads)
            hops.extend(Hop.write(consumer.location, t) for t in consumer.writes)
        return tuple(hops)

    def readers_of(self, topic: TopicRef) -> tuple[ConsumerSpec, ...]:
        """The groups that read ``topic`` (several: fan-out)."""
        return tuple(c for c in self.consumers if topic in c.reads)

    def reader(self, topic: TopicRef, group: str) -> ConsumerSpec | None:
        """The consumer of ``group`` reading ``topic``, if the route has it."""
        return next((c for c in self.consumers if c.group == group and topic in c.reads), None)

    def commits_offsets(self, hop: Hop) -> bool:
        """Whether the group of read ``hop`` commits its offsets to Kafka (a write hop: True, there is nothing to
        commit)."""
        reader = self.reader(hop.topic, hop.group) if hop.kind is HopKind.READ and hop.group else None
        return reader is None or reader.commits_offsets

    def writers_of(self, topic: TopicRef) -> tuple[Hop, ...]:
        """The write hops into ``topic``: the producers' first, then the processors' (several: fan-in)."""
        hops = [Hop.write(p.location, topic) for p in self.producers if topic in p.writes]
        hops += [Hop.write(c.location, topic) for c in self.consumers if topic in c.writes]
        return tuple(hops)

    def is_source(self, hop: Hop) -> bool:
        """A producer's write: where the message enters the route."""
        return any(p.location == hop.location and hop.topic in p.writes for p in self.producers)

    def processor_writing(self, hop: Hop) -> ConsumerSpec | None:
        """The processor whose write ``hop`` is (a consumer at the hop's location that writes its topic)."""
        return next((c for c in self.consumers if c.location == hop.location and hop.topic in c.writes), None)

    def feeders_of(self, hop: Hop) -> tuple[Hop, ...]:
        """The hops a message passes right before ``hop``: a read hop's topic's writes; a processor's write, its
        input reads (a producer's write: none)."""
        if hop.kind is HopKind.READ:
            return self.writers_of(hop.topic)
        processor = self.processor_writing(hop)
        return tuple(Hop.read(t, processor.group) for t in processor.reads) if processor else ()

    def hops_before(self, hop: Hop) -> frozenset[Hop]:
        """Every hop a message passes before ``hop``: its feeders, theirs, and so on up to the producers' writes
        (the registry rejects cycles)."""
        seen: set[Hop] = set()
        todo = [hop]
        while todo:
            for feeder in self.feeders_of(todo.pop()):
                if feeder not in seen:
                    seen.add(feeder)
                    todo.append(feeder)
        return frozenset(seen)

    def location_of(self, group: str) -> str | None:
        """Where ``group``'s consumers run (their emitter's location)."""
        return next((c.location for c in self.consumers if c.group == group), None)

    def hops_after(self, write_hop: Hop) -> tuple[Hop, ...]:
        """All hops a message written at ``write_hop`` is expected to take afterwards, in route order.

        Each reader of the written topic gets a read hop; a reader that is a processor then
        writes every topic it lists, and so on downstream (the registry rejects cycles).
        """
        expected: list[Hop] = []
        frontier = [write_hop.topic]
        while frontier:
            topic = frontier.pop(0)
            for reader in self.readers_of(topic):
                expected.append(Hop.read(topic, reader.group))
                for out in reader.writes:
                    expected.append(Hop.write(reader.location, out))
                    frontier.append(out)
        return tuple(expected)


class ResendMode(StrEnum):
    AUTO = "auto"  # confirmed losses are re-produced without a human
    MANUAL = "manual"  # confirmed losses wait for an operator's trigger
    OFF = "off"  # never resend this stream


@dataclass(frozen=True, slots=True)
class ResendPolicy:
    mode: ResendMode = ResendMode.MANUAL
    max_attempts: int = 3
    hook: str | None = None  # "module:function" given (message id, recovery attributes), returning the payload


@dataclass(frozen=True, slots=True)
class AlertThresholds:
    loss_rate: float = 0.0
    duplicate_rate: float = 0.01
    latency_p99_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Stream:
    name: str
    owner: str
    sampling_percent: float
    recovery_attributes: tuple[str, ...]
    resend: ResendPolicy
    alerts: AlertThresholds
    route: Route


@dataclass(frozen=True, slots=True)
class Cluster:
    name: str
    connection_id: str


@dataclass(frozen=True, slots=True)
class Registry:
    clusters: Mapping[str, Cluster]
    streams: Mapping[str, Stream]

    @property
    def owners(self) -> frozenset[str]:
        """The teams the streams belong to, each once (a DAG bundle, an Airflow team, a manual resend DAG each)."""
        return frozenset(stream.owner for stream in self.streams.values())

    def stream(self, name: str) -> Stream:
        try:
            return self.streams[name]
        except KeyError:
            raise UnknownStreamError(name, tuple(sorted(self.streams))) from None
