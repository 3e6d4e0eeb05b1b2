"""The registry's routes as numbered hops and topics, for judging many messages at once.

A :class:`RoutePlan` numbers a stream's hops (in :attr:`khipu.registry.model.Route.hops` order) and
topics, and lists what the rules of :mod:`khipu.detector.decide` ask of a route: who writes and who
reads each topic, which read hops hold back a write hop, which processor a group is. A
:class:`RoutePlans` numbers every hop of every stream once more, globally, so a trace can be told
its hop by a table lookup in Spark (:meth:`RoutePlans.hop_keys`).

**Simple routes.** The vectorised judge (:mod:`khipu.detector.clean`) handles messages of simple
routes only: one producer writing one topic, every topic written by exactly one location, every
consumer group reading exactly one topic, processors at locations of their own. On such a route
every message is expected at every hop exactly once, so "clean" (each hop's trace exactly once) is
a property of the route. Messages of other routes are judged by :func:`~khipu.detector.decide.decide`
one by one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from khipu.registry.model import Hop, HopKind, Registry, Stream, TopicRef
from khipu.trace.model import Trace, TraceType

MAX_HOPS = 63  # the hops of a route fit one 64-bit mask (which of a message's hops were reported)


class RouteTooLongError(ValueError):
    def __init__(self, stream: str, hops: int) -> None:
        super().__init__(
            f"stream {stream!r}: its route has {hops} hops; the detector judges routes of at most {MAX_HOPS} hops "
            "(split the stream in the registry)"
        )


@dataclass(frozen=True, slots=True)
class ProcessorPlan:
    """A processor of a simple route: the read hop of its one input and, per output, the topic and write hop."""

    group: str
    input_read: int  # local hop index
    input_topic: int  # local topic index
    output_topics: tuple[int, ...]
    output_writes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RoutePlan:
    """One stream's route, numbered (hops and topics are local indexes into :attr:`hops` / :attr:`topics`)."""

    stream: Stream
    first_hop: int  # the global index of local hop 0 (see RoutePlans)
    hops: tuple[Hop, ...]
    topics: tuple[TopicRef, ...]
    hop_topic: tuple[int, ...]  # each hop's topic
    is_read: tuple[bool, ...]
    commits_offsets: tuple[bool, ...]  # per hop: False for a read hop whose group keeps its offsets outside Kafka
    readers: tuple[tuple[int, ...], ...]  # per topic: its read hops
    writers: tuple[tuple[int, ...], ...]  # per topic: its write hops
    write_blockers: tuple[tuple[int, ...], ...]  # per hop (writes only): read hops whose being open holds it back
    processor_of_read: tuple[int, ...]  # per hop: the processor (index into processors) a read hop's group is, or -1
    processors: tuple[ProcessorPlan, ...]  # downstream processors first
    source_writes: tuple[int, ...]  # the producers' write hops
    simple: bool

    @property
    def size(self) -> int:
        return len(self.hops)

    @staticmethod
    def of(stream: Stream, first_hop: int = 0) -> RoutePlan:
        route = stream.route
        hops = route.hops
        if len(hops) > MAX_HOPS:
            raise RouteTooLongError(stream.name, len(hops))
        topics = tuple(dict.fromkeys(hop.topic for hop in hops))
        topic_index = {topic: i for i, topic in enumerate(topics)}
        hop_index = {hop: i for i, hop in enumerate(hops)}
        readers = tuple(tuple(i for i, h in enumerate(hops) if h.kind is HopKind.READ and h.topic == t) for t in topics)
        writers = tuple(
            tuple(i for i, h in enumerate(hops) if h.kind is HopKind.WRITE and h.topic == t) for t in topics
        )
        # the readers of a write hop's topic, and the inputs of the processor writing it, hold it back (decide's
        # write_blocked)
        blockers: list[tuple[int, ...]] = []
        for hop in hops:
            if hop.kind is HopKind.READ:
                blockers.append(())
                continue
            held = list(readers[topic_index[hop.topic]])
            processor = route.processor_writing(hop)
            if processor is not None:
                held += [hop_index[Hop.read(t, processor.group)] for t in processor.reads]
            blockers.append(tuple(dict.fromkeys(held)))
        plans = [
            ProcessorPlan(
                group=c.group,
                input_read=hop_index[Hop.read(c.reads[0], c.group)],
                input_topic=topic_index[c.reads[0]],
                output_topics=tuple(topic_index[t] for t in c.writes),
                output_writes=tuple(hop_index[Hop.write(c.location, t)] for t in c.writes),
            )
            for c in route.consumers
            if c.is_processor and len(c.reads) == 1
        ]
        ordered = _downstream_first(plans)
        processor_of_read = [-1] * len(hops)
        for n, plan in enumerate(ordered):
            processor_of_read[plan.input_read] = n
        sources = tuple(hop_index[Hop.write(p.location, t)] for p in route.producers for t in p.writes)
        return RoutePlan(
            stream=stream,
            first_hop=first_hop,
            hops=hops,
            topics=topics,
            hop_topic=tuple(topic_index[h.topic] for h in hops),
            is_read=tuple(h.kind is HopKind.READ for h in hops),
            commits_offsets=tuple(stream.route.commits_offsets(h) for h in hops),
            readers=readers,
            writers=writers,
            write_blockers=tuple(blockers),
            processor_of_read=tuple(processor_of_read),
            processors=tuple(ordered),
            source_writes=sources,
            simple=_is_simple(stream),
        )


def _is_simple(stream: Stream) -> bool:
    """One producer writing one topic; every topic one writer; every group one input; processors at
    locations of their own; group names unique."""
    route = stream.route
    if len(route.producers) != 1 or len(route.producers[0].writes) != 1:
        return False
    if any(len(c.reads) != 1 for c in route.consumers):
        return False
    groups = [c.group for c in route.consumers]
    if len(groups) != len(set(groups)):
        return False
    processor_locations = [c.location for c in route.consumers if c.is_processor]
    if len(processor_locations) != len(set(processor_locations)):
        return False
    if route.producers[0].location in processor_locations:
        return False
    writers: dict[TopicRef, int] = {}
    for hop in route.hops:
        if hop.kind is HopKind.WRITE:
            writers[hop.topic] = writers.get(hop.topic, 0) + 1
    return all(count == 1 for count in writers.values())


def _downstream_first(plans: list[ProcessorPlan]) -> list[ProcessorPlan]:
    """Processors ordered so that every processor comes before those upstream of it (reading what feeds it)."""
    by_input: dict[int, list[ProcessorPlan]] = {}
    for plan in plans:
        by_input.setdefault(plan.input_topic, []).append(plan)
    ordered: list[ProcessorPlan] = []
    placed: set[str] = set()

    def place(plan: ProcessorPlan, path: frozenset[str]) -> None:
        if plan.group in placed or plan.group in path:
            return
        for out in plan.output_topics:
            for downstream in by_input.get(out, []):
                place(downstream, path | {plan.group})
        placed.add(plan.group)
        ordered.append(plan)

    for plan in plans:
        place(plan, frozenset())
    return ordered


@dataclass(frozen=True, slots=True)
class RoutePlans:
    """Every stream's :class:`RoutePlan`, with its hops numbered globally (stream after stream)."""

    plans: tuple[RoutePlan, ...]

    @staticmethod
    def of(registry: Registry) -> RoutePlans:
        plans: list[RoutePlan] = []
        first = 0
        for name in sorted(registry.streams):
            plan = RoutePlan.of(registry.streams[name], first)
            plans.append(plan)
            first += plan.size
        return RoutePlans(tuple(plans))

    @property
    def by_stream(self) -> Mapping[str, RoutePlan]:
        return {plan.stream.name: plan for plan in self.plans}

    def hop_keys(self) -> dict[str, int]:
        """A trace's hop key (:func:`hop_key`) -> global hop index: how a trace finds its hop."""
        keys: dict[str, int] = {}
        for plan in self.plans:
            for local, hop in enumerate(plan.hops):
                kind = "RECEIVED" if hop.kind is HopKind.READ else "SENT"
                actor = trace_actor(kind, hop.location, hop.group)
                keys[hop_key(plan.stream.name, kind, hop.topic.cluster, hop.topic.topic, actor)] = (
                    plan.first_hop + local
                )
        return keys

    def described(self) -> dict[str, list[Any]]:
        """Per global hop number, what a verdict row says of its hop: stream, hop (id), hop_kind, topic, group,
        location, and the detail of a plain DELIVERED (verdicts travel with the number only); and the topic's
        cluster and a read hop's pointing location (:func:`khipu.detector.outputs.held_back`)."""
        rows = [(plan.stream.name, hop) for plan in self.plans for hop in plan.hops]
        return {
            "stream": [stream for stream, _ in rows],
            "hop": [hop.id for _, hop in rows],
            "hop_kind": [hop.kind.value for _, hop in rows],
            "topic": [hop.topic.topic for _, hop in rows],
            "group": [hop.group for _, hop in rows],
            "location": [hop.location for _, hop in rows],
            "cluster": [hop.topic.cluster for _, hop in rows],
            # where a read hop's group runs: the location its emitter's back-pointers and marks name
            "pointer_location": [
                plan.stream.route.location_of(hop.group) if hop.kind is HopKind.READ and hop.group else None
                for plan in self.plans
                for hop in plan.hops
            ],
            "delivered_detail": ["received once" if hop.kind is HopKind.READ else "written once" for _, hop in rows],
        }

    def feeders(self) -> dict[tuple[str, str], tuple[str, ...]]:
        """(stream, a processor's write hop id) -> the ids of its input read hops: what the settle rules need to
        tell a processor's replay from a retry when its write comes late
        (:func:`khipu.verdicts.settle.settle_batch`)."""
        return {
            (plan.stream.name, hop.id): tuple(feeder.id for feeder in plan.stream.route.feeders_of(hop))
            for plan in self.plans
            for hop in plan.hops
            if hop.kind is HopKind.WRITE and plan.stream.route.processor_writing(hop) is not None
        }

    def numbers(self) -> dict[tuple[str, str], int]:
        """(stream, hop id) -> the hop's global number."""
        return {
            (plan.stream.name, hop.id): plan.first_hop + n for plan in self.plans for n, hop in enumerate(plan.hops)
        }


# A trace's hop key: these of its fields, joined by HOP_KEY_SEPARATOR; the actor is the writing location of a SENT
# trace and the reading group of a RECEIVED one. Spelt here only: the detector's decoder builds the same string a
# column at a time from the same fields (khipu.detector.parse.RecordDecoder), and tests/unit/detector/test_parse.py
# holds the two to it.
HOP_KEY_FIELDS = ("stream", "type", "cluster", "topic", "actor")
HOP_KEY_SEPARATOR = "|"


def hop_key(stream: str, trace_type: str, cluster: str, topic: str, actor: str) -> str:
    return HOP_KEY_SEPARATOR.join((stream, trace_type, cluster, topic, actor))


def trace_actor(trace_type: str, location: str | None, group: str | None) -> str:
    """Who a trace's hop is named by: the writing location (SENT) or the reading group (RECEIVED)."""
    return (location if trace_type == "SENT" else group) or ""


TRACE_KEY_COLUMNS = ("stream", "type", "cluster", "topic", "location", "group")  # the trace columns a hop key reads


def trace_hop_key(trace: Trace | Mapping[str, Any]) -> str:
    """The hop key of a trace, or of a trace row (its columns by name)."""
    row: Mapping[str, Any] = trace._asdict() if isinstance(trace, Trace) else trace
    trace_type = str(row["type"].value if isinstance(row["type"], TraceType) else row["type"])
    actor = trace_actor(trace_type, row["location"], row["group"])
    return hop_key(str(row["stream"]), trace_type, str(row["cluster"]), str(row["topic"]), actor)
