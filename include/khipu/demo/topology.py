"""The demo's shape, read from a registry stream: source -> processor -> one or more sinks."""

from __future__ import annotations

from dataclasses import dataclass

from khipu.demo.faults import DemoConfigError
from khipu.registry.model import ConsumerSpec, Hop, ProducerSpec, Stream, TopicRef

DEMO_STREAM = "demo.orders"  # the continuously running demo of the local stack
BURST_STREAM = "demo.bursts"  # on-demand bursts (DAG khipu_demo_burst), on their own topics and groups


@dataclass(frozen=True, slots=True)
class DemoTopology:
    stream: Stream
    source: ProducerSpec
    processor: ConsumerSpec
    sinks: tuple[ConsumerSpec, ...]

    @property
    def source_topic(self) -> TopicRef:
        return self.source.writes[0]

    @property
    def output_topic(self) -> TopicRef:
        return self.processor.writes[0]

    @property
    def source_hop(self) -> Hop:
        return Hop.write(self.source.location, self.source_topic)

    @property
    def processor_read_hop(self) -> Hop:
        return Hop.read(self.source_topic, self.processor.group)

    @property
    def processor_write_hop(self) -> Hop:
        return Hop.write(self.processor.location, self.output_topic)

    @property
    def skip_group(self) -> str:
        """The sink whose consumer skips records (consumer_skip)."""
        return self.sinks[0].group

    @property
    def rewind_group(self) -> str:
        """The sink whose consumer rewinds (offset_rewind); a different sink when there are several."""
        return self.sinks[-1].group

    @staticmethod
    def from_stream(stream: Stream) -> DemoTopology:
        route = stream.route
        if len(route.producers) != 1 or len(route.producers[0].writes) != 1:
            raise DemoConfigError(
                f"stream {stream.name}.route.producers",
                len(route.producers),
                "exactly one producer writing exactly one topic",
            )
        source = route.producers[0]
        processors = route.readers_of(source.writes[0])
        if len(processors) != 1 or len(processors[0].writes) != 1 or len(processors[0].reads) != 1:
            raise DemoConfigError(
                f"stream {stream.name}.route.consumers",
                [c.group for c in processors],
                f"exactly one processor reading {source.writes[0]} and writing one topic",
            )
        processor = processors[0]
        sinks = route.readers_of(processor.writes[0])
        if not sinks or any(s.is_processor for s in sinks):
            raise DemoConfigError(
                f"stream {stream.name}.route.consumers",
                [s.group for s in sinks],
                f"one or more sink groups (no writes) reading {processor.writes[0]}",
            )
        clusters = {source.writes[0].cluster, processor.writes[0].cluster}
        if len(clusters) != 1:
            raise DemoConfigError(f"stream {stream.name}.route", sorted(clusters), "all demo topics on one cluster")
        return DemoTopology(stream=stream, source=source, processor=processor, sinks=sinks)
