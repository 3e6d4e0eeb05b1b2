"""A stream's route as a graph, with what Khipu knows of each hop over a window: the route map's model.

Nodes are the route's producers, its topics (each on its cluster), and its consumer groups; a group that
writes on is a processor. Edges are the hops, drawn as they are: a write hop from a producer or processor to
a topic, a read hop from a topic to a group, so a topic read by several groups fans out and a processor
reading several topics fans in. Each edge carries its hop's figures over the window and a state against
the stream's thresholds; a read hop and its group carry consumer health (the worst status of the group's
partitions on the hop's topic, and on all it reads).

The edge state is decided like consumer health (:mod:`khipu.health.rules`): each rule is a small named
predicate, the rules are ordered by severity, and the first that fires wins:

1. ``LOSS``         the loss rate is above the stream's ``loss_rate`` threshold;
2. ``DUPLICATES``   the duplicate rate is above its ``duplicate_rate`` threshold;
3. ``LOSS_WITHIN``  messages were lost, at or under the threshold (above it is rule 1);
4. ``OK``           verdicts, none of the above;
5. ``IDLE``         otherwise: no judged verdict in the window.

The rates are the overview's (:class:`~khipu.report.overview.WindowFigures`): shares of the judged
verdicts, ABORTED and SUPERSEDED apart; "above" is strictly above, as the alerts and the overview say.
Laying the graph out and drawing it is the view's job (``khipu_airflow.view.routemap``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum, StrEnum

from khipu.health.rules import PartitionStatus
from khipu.registry.model import AlertThresholds, Hop, HopKind, Stream, TopicRef
from khipu.report.overview import WindowFigures


class NodeKind(StrEnum):
    PRODUCER = "producer"  # a location that writes the stream's messages first
    TOPIC = "topic"  # a topic on its cluster
    GROUP = "group"  # a consumer group that only reads
    PROCESSOR = "processor"  # a consumer group that writes on what it reads


class EdgeState(IntEnum):
    """Ordered by severity: a higher value is worse."""

    IDLE = 0  # no judged verdict in the window
    OK = 1
    LOSS_WITHIN = 2  # losses, at or under the stream's loss threshold
    DUPLICATES = 3  # duplicate rate above the stream's threshold
    LOSS = 4  # loss rate above the stream's threshold


def loss_above_threshold(figures: WindowFigures, limits: AlertThresholds) -> bool:
    return figures.verdicts > 0 and figures.loss_rate > limits.loss_rate


def duplicates_above_threshold(figures: WindowFigures, limits: AlertThresholds) -> bool:
    return figures.verdicts > 0 and figures.duplicate_rate > limits.duplicate_rate


def losses_within_threshold(figures: WindowFigures, _limits: AlertThresholds) -> bool:
    return figures.lost + figures.confirmed_lost > 0


def judged(figures: WindowFigures, _limits: AlertThresholds) -> bool:
    return figures.verdicts > 0


EDGE_RULES: tuple[tuple[EdgeState, Callable[[WindowFigures, AlertThresholds], bool]], ...] = (
    (EdgeState.LOSS, loss_above_threshold),
    (EdgeState.DUPLICATES, duplicates_above_threshold),
    (EdgeState.LOSS_WITHIN, losses_within_threshold),
    (EdgeState.OK, judged),
)


def edge_state(figures: WindowFigures, limits: AlertThresholds) -> EdgeState:
    """The state of a hop's figures against the stream's thresholds: the first rule of EDGE_RULES that fires."""
    return next((state for state, fires in EDGE_RULES if fires(figures, limits)), EdgeState.IDLE)


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One partition's consumer-health status, as the last evaluation stored it."""

    cluster: str
    group: str
    topic: str
    partition: int
    status: PartitionStatus


@dataclass(frozen=True, slots=True)
class HealthBadge:
    """The worst consumer-health status over some partitions, and how many of them are in it."""

    status: PartitionStatus
    partitions: int  # partitions in ``status``
    of: int  # partitions with health recorded

    @property
    def label(self) -> str:
        """``STALL 1/3``, ``EXPIRY RISK 1/1`` (``OK`` alone when every partition is OK)."""
        if self.status is PartitionStatus.OK:
            return "OK"
        return f"{self.status.name.replace('_', ' ')} {self.partitions}/{self.of}"


def health_badge(states: Iterable[PartitionState]) -> HealthBadge | None:
    """The worst status among ``states`` (None: no health recorded for them)."""
    statuses = [state.status for state in states]
    if not statuses:
        return None
    worst = max(statuses)
    return HealthBadge(worst, statuses.count(worst), len(statuses))


@dataclass(frozen=True, slots=True)
class MapNode:
    id: str  # "producer:<location>", "topic:<cluster>/<topic>", "group:<group>"
    kind: NodeKind
    name: str  # the location, the topic (without its cluster) or the group
    cluster: str | None = None  # a topic's cluster; a group's: the one its topics are on (None: it reads several)
    location: str | None = None  # a group's location when it is not the group's own name
    health: HealthBadge | None = None  # a group's: over every partition it reads
    watched: bool = True  # False: a group that keeps its offsets outside Kafka (no consumer health)


@dataclass(frozen=True, slots=True)
class MapEdge:
    hop: str  # the hop's id
    kind: HopKind
    source: str  # node ids
    target: str
    figures: WindowFigures
    state: EdgeState
    health: HealthBadge | None = None  # a read hop's: its group's partitions of its topic
    enters_route: bool = False  # a producer's write: the message's first trace, no latency is measured there


@dataclass(frozen=True, slots=True)
class RouteMap:
    stream: str
    since_ms: int  # the window's first minute: what every edge's figures count from
    thresholds: AlertThresholds
    clusters: tuple[str, ...]  # the clusters the route's topics are on, in route order (a group's is its topics')
    nodes: tuple[MapNode, ...]  # producers, then topics and groups in route order
    edges: tuple[MapEdge, ...]  # the route's hops, in route order


def producer_id(location: str) -> str:
    return f"producer:{location}"


def topic_id(topic: TopicRef) -> str:
    return f"topic:{topic}"


def group_id(group: str) -> str:
    return f"group:{group}"


def route_map(
    stream: Stream, figures: Mapping[str, WindowFigures], health: Iterable[PartitionState], since_ms: int
) -> RouteMap:
    """The route of ``stream`` as a graph, each hop's edge with its ``figures`` (by hop id; a hop without any has
    none: IDLE) and state against the stream's thresholds, and the consumer ``health`` of its groups."""
    route = stream.route
    states: dict[tuple[str, str, str], list[PartitionState]] = {}
    for state in health:
        states.setdefault((state.cluster, state.group, state.topic), []).append(state)

    def read_health(topic: TopicRef, group: str) -> list[PartitionState]:
        return states.get((topic.cluster, group, topic.topic), [])

    nodes: dict[str, MapNode] = {}
    for producer in route.producers:
        key = producer_id(producer.location)
        nodes.setdefault(key, MapNode(key, NodeKind.PRODUCER, producer.location))

    def add_topic(topic: TopicRef) -> str:
        key = topic_id(topic)
        nodes.setdefault(key, MapNode(key, NodeKind.TOPIC, topic.topic, cluster=topic.cluster))
        return key

    for producer in route.producers:
        for topic in producer.writes:
            add_topic(topic)
    for consumer in route.consumers:
        for topic in consumer.reads:
            add_topic(topic)
        key = group_id(consumer.group)
        badge = health_badge(s for t in consumer.reads for s in read_health(t, consumer.group))
        nodes.setdefault(
            key,
            MapNode(
                key,
                NodeKind.PROCESSOR if consumer.is_processor else NodeKind.GROUP,
                consumer.group,
                cluster=_one({topic.cluster for topic in consumer.reads}),
                location=consumer.location if consumer.location != consumer.group else None,
                health=badge if consumer.commits_offsets else None,
                watched=consumer.commits_offsets,
            ),
        )
        for topic in consumer.writes:
            add_topic(topic)

    edges: dict[str, MapEdge] = {}
    for hop in route.hops:
        if hop.id in edges:
            continue  # a hop the route names twice is drawn once
        shown = figures.get(hop.id, WindowFigures(since_ms))
        source, target, badge = _ends(stream, hop, read_health)
        edges[hop.id] = MapEdge(
            hop.id, hop.kind, source, target, shown, edge_state(shown, stream.alerts), badge, route.is_source(hop)
        )

    clusters = tuple(dict.fromkeys(n.cluster for n in nodes.values() if n.kind is NodeKind.TOPIC and n.cluster))
    return RouteMap(stream.name, since_ms, stream.alerts, clusters, tuple(nodes.values()), tuple(edges.values()))


def _one(values: set[str]) -> str | None:
    return next(iter(values)) if len(values) == 1 else None


def _ends(
    stream: Stream, hop: Hop, read_health: Callable[[TopicRef, str], list[PartitionState]]
) -> tuple[str, str, HealthBadge | None]:
    """A hop's source and target nodes, and (a read hop of a group that commits) its consumer health."""
    route = stream.route
    if hop.kind is HopKind.READ:
        assert hop.group is not None  # a read hop always names its group
        badge = health_badge(read_health(hop.topic, hop.group)) if route.commits_offsets(hop) else None
        return topic_id(hop.topic), group_id(hop.group), badge
    assert hop.location is not None  # a write hop always names its location
    processor = None if route.is_source(hop) else route.processor_writing(hop)
    source = group_id(processor.group) if processor is not None else producer_id(hop.location)
    return source, topic_id(hop.topic), None
