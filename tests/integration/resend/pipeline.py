"""What the resend tests share: a pipeline's topics on the session broker, a store, and the stream's registry.

Route: producer p writes in; processor proc reads in and writes out (2 partitions); sinks s1 and s2
read out. Confirmed losses are stored as reconciliation leaves them; the originals are real records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from khipu.kafka.records import StoredRecord, produce_record
from khipu.localstack.broker import BrokerProcess
from khipu.registry import parse_registry
from khipu.registry.model import Registry
from khipu.resend.run import Resender
from khipu.store import Store
from khipu.tracing.headers import TraceContext, resend_mark, trace_context
from khipu.verdicts.book import verdict_row
from khipu.verdicts.model import Verdict, VerdictKind

NOW = 1_790_000_000_000


@dataclass
class Pipeline:
    broker: BrokerProcess
    store: Store
    registry: Registry
    inp: str
    out: str

    @property
    def hops(self) -> dict[str, str]:
        return {
            "read_in": f"local/{self.inp} -> proc",
            "write_out": f"proc -> local/{self.out}",
            "s1": f"local/{self.out} -> s1",
            "s2": f"local/{self.out} -> s2",
        }

    def resender(self, wait_ms: int = 600_000, now: int = NOW) -> Resender:
        connections = {"local": self.broker.connection()}
        return Resender(self.store, self.registry, connections, lambda: now, wait_ms=wait_ms)

    def write(self, topic: str, partition: int, message_id: str, value: bytes) -> int:
        headers = list(TraceContext(message_id, "orders", 100.0).as_headers())
        return produce_record(self.broker.connection(), topic, partition, StoredRecord(b"k-" + value, value, headers))

    def verdict(self, message_id: str, hop: str, kind: VerdictKind, **extra: Any) -> None:
        read = " -> local/" not in hop
        topic = hop.split(" -> ")[0].split("/", 1)[1] if read else hop.split("/", 1)[1]
        row = verdict_row(
            Verdict(
                message_id=message_id, stream="orders", hop=hop, hop_kind="read" if read else "write", kind=kind,
                cause=extra.pop("cause", None), count=0, topic=topic, partition=extra.pop("partition", None),
                offset=extra.pop("offset", None), group=hop.split(" -> ")[1] if read else None,
                location=None if read else hop.split(" -> ")[0], observed_ms=None, latency_ms=None,
                e2e_latency_ms=None, decided_ms=NOW - 3_600_000, detail=f"{kind.value} at {hop}",
                first_seen_ms=NOW - 3_700_000, decided_by="reconciliation",
            )
        )  # fmt: skip
        self.store.verdicts.upsert([row])

    def records(self, topic: str) -> list[Any]:
        """Every record of the topic, read from the start without a group."""
        reader = Consumer(
            {**self.broker.connection().client_config(), "group.id": "t-reader", "enable.partition.eof": True}
        )
        partitions = len(reader.list_topics(topic, timeout=10).topics[topic].partitions)
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        found, ended = [], 0
        deadline = time.monotonic() + 20
        while ended < partitions and time.monotonic() < deadline:
            msg = reader.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                ended += 1
                continue
            found.append(msg)
        reader.close()
        return found


def registry_text(inp: str, out: str, hook: str | None = None, mode: str = "auto") -> str:
    hook_line = f"\n      hook: {hook}" if hook else ""
    return f"""
version: 1
clusters: {{local: {{connection_id: khipu_kafka}}}}
streams:
  orders:
    owner: team-orders
    resend:
      mode: {mode}
      max_attempts: 2{hook_line}
    route:
      producers: [{{location: p, writes: [local/{inp}]}}]
      consumers:
        - {{group: proc, location: proc, reads: [local/{inp}], writes: [local/{out}]}}
        - {{group: s1, reads: [local/{out}]}}
        - {{group: s2, reads: [local/{out}]}}
"""


def registry(inp: str, out: str, hook: str | None = None, mode: str = "auto") -> Registry:
    return parse_registry(registry_text(inp, out, hook, mode))


def resent_copies(pipeline: Pipeline) -> list[Any]:
    return [m for m in pipeline.records(pipeline.out) if resend_mark(m.headers()) is not None]


def message_id_of(message: Any) -> str:
    """The message id a traced record's headers carry."""
    context = trace_context(message.headers())
    assert context is not None, f"record at {message.partition()}@{message.offset()} carries no trace context"
    return context.message_id
