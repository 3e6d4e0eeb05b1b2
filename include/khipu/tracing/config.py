"""Settings of a trace emitter, validated at construction; loading never connects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from khipu.errors import InvalidSetting
from khipu.trace.names import DEFAULT_TRACE_TOPIC, NAME_PATTERN, NAME_RULE


class TracingConfigError(InvalidSetting):
    """A tracing setting is invalid; the message names the setting, the value and what is allowed."""

    kind = "tracing setting"


@dataclass(frozen=True, slots=True)
class TraceEmitterConfig:
    """Where traces go and how much an emitter may buffer.

    ``location`` names the application (or processor) emitting; ``cluster`` names the Kafka
    cluster its traced clients talk to, as the registry spells it. ``producer_config`` passes
    further librdkafka settings (TLS, SASL) to the trace producer; it is never logged.
    """

    bootstrap_servers: str
    location: str
    cluster: str
    topic: str = DEFAULT_TRACE_TOPIC
    queue_max_traces: int = 100_000
    batch_linger_ms: int = 50  # how long a trace may wait for others to share its trace-topic record
    delivery_timeout_ms: int = 60_000
    commit_flush_timeout_s: float = 2.0
    close_timeout_s: float = 5.0
    mark_interval_s: float = 2.0  # how often, while tracing, the emitter publishes its sequence number
    mark_memory_s: float = 10.0  # marks list the partitions received from this recently, and go on this long
    producer_config: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.bootstrap_servers, str) or not self.bootstrap_servers.strip():
            raise TracingConfigError("bootstrap_servers", self.bootstrap_servers, "'host:port[,host:port...]'")
        for name in ("location", "cluster", "topic"):
            value = getattr(self, name)
            if not isinstance(value, str) or not NAME_PATTERN.match(value):
                raise TracingConfigError(name, value, NAME_RULE)
        if not isinstance(self.queue_max_traces, int) or not 1 <= self.queue_max_traces <= 10_000_000:
            raise TracingConfigError("queue_max_traces", self.queue_max_traces, "an integer in [1, 10000000]")
        if (
            isinstance(self.batch_linger_ms, bool)
            or not isinstance(self.batch_linger_ms, int)
            or not (1 <= self.batch_linger_ms <= 5_000)
        ):
            raise TracingConfigError("batch_linger_ms", self.batch_linger_ms, "an integer of milliseconds in [1, 5000]")
        if not isinstance(self.delivery_timeout_ms, int) or self.delivery_timeout_ms < 1000:
            raise TracingConfigError("delivery_timeout_ms", self.delivery_timeout_ms, "an integer >= 1000")
        if (
            isinstance(self.mark_interval_s, bool)
            or not isinstance(self.mark_interval_s, (int, float))
            or not 0.1 <= self.mark_interval_s <= 3600
        ):
            raise TracingConfigError("mark_interval_s", self.mark_interval_s, "a number of seconds in [0.1, 3600]")
        if (
            isinstance(self.mark_memory_s, bool)
            or not isinstance(self.mark_memory_s, (int, float))
            or not 0 <= self.mark_memory_s <= 3600
        ):
            raise TracingConfigError("mark_memory_s", self.mark_memory_s, "a number of seconds in [0, 3600]")
        for name in ("commit_flush_timeout_s", "close_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 300:
                raise TracingConfigError(name, value, "a number of seconds in [0, 300]")
        reserved = {"bootstrap.servers", "acks", "enable.idempotence", "on_delivery", "error_cb"}
        clash = sorted(reserved & set(self.producer_config))
        if clash:
            raise TracingConfigError(f"producer_config.{clash[0]}", "<set>", "not set here; the emitter owns it")

    @classmethod
    def from_env(cls, location: str, environ: Mapping[str, str] | None = None) -> TraceEmitterConfig:
        """An emitter at ``location`` sending to ``KHIPU_TRACE_BOOTSTRAP_SERVERS`` (or ``KHIPU_BOOTSTRAP_SERVERS``:
        one of them must be set, the trace cluster is never guessed), ``KHIPU_CLUSTER`` and ``KHIPU_TRACE_TOPIC``,
        from the environment (``os.environ`` unless given) and the settings file. The variables are declared in
        :mod:`khipu.config.model`; pydantic is loaded here, when an application asks, not on import."""
        from khipu.config import KhipuSection, Source, TracingSection, load, load_with_sources

        tracing = load(TracingSection, environ, TracingConfigError)
        khipu, sources = load_with_sources(KhipuSection, environ, TracingConfigError)
        bootstrap = tracing.bootstrap_servers
        if bootstrap is None and sources["KHIPU_BOOTSTRAP_SERVERS"] is not Source.DEFAULT:
            bootstrap = khipu.bootstrap_servers
        if not bootstrap:
            raise TracingConfigError(
                "KHIPU_TRACE_BOOTSTRAP_SERVERS", None, "the trace cluster's 'host:port' in the environment"
            )
        return cls(bootstrap_servers=bootstrap, location=location, cluster=khipu.cluster, topic=khipu.trace_topic)


__all__ = ["DEFAULT_TRACE_TOPIC", "TraceEmitterConfig", "TracingConfigError"]
