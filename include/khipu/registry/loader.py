"""Load and validate the registry YAML into typed values; never connects to anything.

Every problem found is collected (not just the first) and reported with the stream, the field
path, the value received and what is allowed. See docs/registry.md for the file format.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from khipu.registry.model import (
    OWNER_PATTERN,
    OWNER_RULE,
    AlertThresholds,
    Cluster,
    ConsumerSpec,
    ProducerSpec,
    Registry,
    ResendMode,
    ResendPolicy,
    Route,
    Stream,
    TopicRef,
)
from khipu.trace.names import NAME_PATTERN, NAME_RULE

REGISTRY_FORMAT_VERSION = 1

_TOP_KEYS = ("version", "clusters", "streams")
_CLUSTER_KEYS = ("connection_id",)
_STREAM_KEYS = ("owner", "sampling_percent", "recovery_attributes", "resend", "alerts", "route")
_RESEND_KEYS = ("mode", "max_attempts", "hook")
_HOOK = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_ALERT_KEYS = ("loss_rate", "duplicate_rate", "latency_p99_ms")
_ROUTE_KEYS = ("producers", "consumers")
_PRODUCER_KEYS = ("location", "writes")
_CONSUMER_KEYS = ("group", "location", "reads", "writes", "commits_offsets")


@dataclass(frozen=True, slots=True)
class RegistryProblem:
    stream: str | None
    field: str
    value: Any
    expected: str

    def __str__(self) -> str:
        where = f"stream {self.stream!r}" if self.stream is not None else "registry"
        return f"{where}: field '{self.field}': got {self.value!r}; expected {self.expected}"


class RegistryError(ValueError):
    """The registry file is invalid; ``problems`` lists every problem found."""

    def __init__(self, source: str, problems: list[RegistryProblem]) -> None:
        self.source = source
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid registry {source}: {len(problems)} problem(s):\n{lines}")


def load_registry(path: str | Path) -> Registry:
    """Read and validate a registry file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RegistryError(
            str(path), [RegistryProblem(None, "<file>", str(path), f"a readable file ({exc.strerror})")]
        ) from None
    return parse_registry(text, source=str(path))


def parse_registry(text: str, *, source: str = "<string>") -> Registry:
    """Validate registry YAML text."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RegistryError(source, [RegistryProblem(None, "<file>", _short(str(exc)), "valid YAML")]) from None
    checker = _Checker()
    registry = checker.registry(document)
    if checker.problems or registry is None:
        raise RegistryError(source, checker.problems)
    return registry


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Checker:
    def __init__(self) -> None:
        self.problems: list[RegistryProblem] = []
        self.stream: str | None = None
        self.clusters: Mapping[str, Cluster] = {}

    def fail(self, field: str, value: Any, expected: str) -> None:
        self.problems.append(RegistryProblem(self.stream, field, value, expected))

    # -- generic shapes ------------------------------------------------------------------

    def mapping(self, value: Any, field: str, allowed: tuple[str, ...]) -> Mapping[str, Any] | None:
        if not isinstance(value, Mapping):
            self.fail(field, value, "a mapping with keys: " + ", ".join(allowed))
            return None
        for key in value:
            if key not in allowed:
                self.fail(_join(field, str(key)), value[key], "no such key; allowed keys: " + ", ".join(allowed))
        return value

    def name(self, value: Any, field: str) -> str | None:
        if not isinstance(value, str) or not NAME_PATTERN.match(value):
            self.fail(field, value, NAME_RULE)
            return None
        return value

    def number(self, value: Any, field: str, low: float, high: float, *, low_open: bool) -> float | None:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if ok and (value > low if low_open else value >= low) and value <= high:
            return float(value)
        bracket = "(" if low_open else "["
        self.fail(field, value, f"a number in {bracket}{low:g}, {high:g}]")
        return None

    def positive_int(self, value: Any, field: str) -> int | None:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        self.fail(field, value, "an integer >= 1")
        return None

    def topic_refs(self, value: Any, field: str, *, required: bool) -> tuple[TopicRef, ...]:
        if value is None and not required:
            return ()
        if not isinstance(value, list) or (required and not value):
            self.fail(field, value, "a non-empty list of 'cluster/topic'" if required else "a list of 'cluster/topic'")
            return ()
        refs = []
        for index, item in enumerate(value):
            ref = self.topic_ref(item, f"{field}[{index}]")
            if ref is not None:
                refs.append(ref)
        return tuple(refs)

    def topic_ref(self, value: Any, field: str) -> TopicRef | None:
        if not isinstance(value, str) or value.count("/") != 1:
            self.fail(field, value, "'cluster/topic'")
            return None
        cluster, topic = value.split("/")
        if cluster not in self.clusters:
            known = ", ".join(sorted(self.clusters)) or "none declared"
            self.fail(field, value, f"a cluster declared under 'clusters' ({known})")
            return None
        if not NAME_PATTERN.match(topic):
            self.fail(field, value, f"a topic name of {NAME_RULE}")
            return None
        return TopicRef(cluster, topic)

    # -- the document ----------------------------------------------------------------------

    def registry(self, document: Any) -> Registry | None:
        top = self.mapping(document, "<top>", _TOP_KEYS)
        if top is None:
            return None
        if top.get("version") != REGISTRY_FORMAT_VERSION:
            self.fail("version", top.get("version"), str(REGISTRY_FORMAT_VERSION))
        self.clusters = self.cluster_map(top.get("clusters"))
        streams_doc = top.get("streams")
        if not isinstance(streams_doc, Mapping):
            self.fail("streams", streams_doc, "a mapping of stream name to stream definition")
            return None
        streams: dict[str, Stream] = {}
        for name, body in streams_doc.items():
            self.stream = str(name)
            if self.name(name, "<name>") is not None:
                stream = self.stream_def(str(name), body)
                if stream is not None:
                    streams[stream.name] = stream
            self.stream = None
        return Registry(clusters=self.clusters, streams=streams)

    def cluster_map(self, value: Any) -> dict[str, Cluster]:
        if not isinstance(value, Mapping) or not value:
            self.fail("clusters", value, "a non-empty mapping of cluster name to {connection_id}")
            return {}
        clusters = {}
        for name, body in value.items():
            field = f"clusters.{name}"
            if self.name(name, field) is None:
                continue
            body = body if body is not None else {}
            spec = self.mapping(body, field, _CLUSTER_KEYS)
            if spec is None:
                continue
            connection_id = spec.get("connection_id", f"khipu_kafka_{name}")
            if self.name(connection_id, f"{field}.connection_id") is not None:
                clusters[str(name)] = Cluster(str(name), connection_id)
        return clusters

    def stream_def(self, name: str, value: Any) -> Stream | None:
        body = self.mapping(value, "<stream>", _STREAM_KEYS)
        if body is None:
            return None
        before = len(self.problems)
        owner = body.get("owner")
        if not isinstance(owner, str) or not OWNER_PATTERN.match(owner):
            self.fail("owner", owner, OWNER_RULE)
        sampling = self.number(body.get("sampling_percent", 100), "sampling_percent", 0, 100, low_open=True)
        recovery = body.get("recovery_attributes", [])
        if not isinstance(recovery, list) or not all(isinstance(a, str) and a for a in recovery):
            self.fail("recovery_attributes", recovery, "a list of attribute names (strings)")
            recovery = []
        resend = self.resend(body.get("resend"))
        alerts = self.alerts(body.get("alerts"))
        route = self.route(body.get("route"))
        if len(self.problems) > before or sampling is None or route is None:
            return None
        return Stream(
            name=name,
            owner=str(owner),
            sampling_percent=sampling,
            recovery_attributes=tuple(recovery),
            resend=resend,
            alerts=alerts,
            route=route,
        )

    def resend(self, value: Any) -> ResendPolicy:
        default = ResendPolicy()
        if value is None:
            return default
        body = self.mapping(value, "resend", _RESEND_KEYS)
        if body is None:
            return default
        mode_value = body.get("mode", default.mode.value)
        try:
            mode = ResendMode(mode_value)
        except ValueError:
            self.fail("resend.mode", mode_value, "one of: " + ", ".join(m.value for m in ResendMode))
            mode = default.mode
        attempts = self.positive_int(body.get("max_attempts", default.max_attempts), "resend.max_attempts")
        hook = body.get("hook")
        if hook is not None and (not isinstance(hook, str) or not _HOOK.match(hook)):
            self.fail("resend.hook", hook, "'module:function', a Python callable importable by the resend task")
            hook = None
        return ResendPolicy(mode=mode, max_attempts=attempts or default.max_attempts, hook=hook)

    def alerts(self, value: Any) -> AlertThresholds:
        default = AlertThresholds()
        if value is None:
            return default
        body = self.mapping(value, "alerts", _ALERT_KEYS)
        if body is None:
            return default
        loss = self.number(body.get("loss_rate", default.loss_rate), "alerts.loss_rate", 0, 1, low_open=False)
        dup = self.number(
            body.get("duplicate_rate", default.duplicate_rate), "alerts.duplicate_rate", 0, 1, low_open=False
        )
        latency = body.get("latency_p99_ms")
        if latency is not None:
            latency = self.positive_int(latency, "alerts.latency_p99_ms")
        return AlertThresholds(
            loss_rate=default.loss_rate if loss is None else loss,
            duplicate_rate=default.duplicate_rate if dup is None else dup,
            latency_p99_ms=latency,
        )

    def route(self, value: Any) -> Route | None:
        body = self.mapping(value, "route", _ROUTE_KEYS)
        if body is None:
            return None
        producers = self.producers(body.get("producers"))
        consumers = self.consumers(body.get("consumers"))
        route = Route(producers=producers, consumers=consumers)
        self.check_reachability(route)
        self.check_acyclic(route)
        return route

    def producers(self, value: Any) -> tuple[ProducerSpec, ...]:
        if not isinstance(value, list) or not value:
            self.fail("route.producers", value, "a non-empty list of {location, writes}")
            return ()
        specs = []
        for index, item in enumerate(value):
            field = f"route.producers[{index}]"
            body = self.mapping(item, field, _PRODUCER_KEYS)
            if body is None:
                continue
            location = self.name(body.get("location"), f"{field}.location")
            writes = self.topic_refs(body.get("writes"), f"{field}.writes", required=True)
            if location is not None and writes:
                specs.append(ProducerSpec(location=location, writes=writes))
        return tuple(specs)

    def consumers(self, value: Any) -> tuple[ConsumerSpec, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            self.fail("route.consumers", value, "a list of {group, location, reads, writes}")
            return ()
        specs: list[ConsumerSpec] = []
        seen_groups: set[str] = set()
        for index, item in enumerate(value):
            field = f"route.consumers[{index}]"
            body = self.mapping(item, field, _CONSUMER_KEYS)
            if body is None:
                continue
            group = self.name(body.get("group"), f"{field}.group")
            if group is not None and group in seen_groups:
                self.fail(f"{field}.group", group, "a group listed once per route (merge its reads and writes)")
                group = None
            location = self.name(body.get("location", group), f"{field}.location") if group else None
            reads = self.topic_refs(body.get("reads"), f"{field}.reads", required=True)
            writes = self.topic_refs(body.get("writes"), f"{field}.writes", required=False)
            commits = body.get("commits_offsets", True)
            if not isinstance(commits, bool):
                self.fail(f"{field}.commits_offsets", commits, "true or false (false: the group keeps its offsets "
                          "outside Kafka, as MirrorMaker 2 does)")  # fmt: skip
                commits = True
            if group is not None and location is not None and reads:
                seen_groups.add(group)
                specs.append(
                    ConsumerSpec(group=group, location=location, reads=reads, writes=writes, commits_offsets=commits)
                )
        return tuple(specs)

    def check_reachability(self, route: Route) -> None:
        written = {t for p in route.producers for t in p.writes} | {t for c in route.consumers for t in c.writes}
        for index, consumer in enumerate(route.consumers):
            for read_index, topic in enumerate(consumer.reads):
                if topic not in written:
                    self.fail(
                        f"route.consumers[{index}].reads[{read_index}]",
                        str(topic),
                        "a topic that a producer or processor of this route writes",
                    )

    def check_acyclic(self, route: Route) -> None:
        edges: dict[TopicRef, set[TopicRef]] = {}
        for consumer in route.consumers:
            for topic in consumer.reads:
                edges.setdefault(topic, set()).update(consumer.writes)
        visiting: set[TopicRef] = set()
        done: set[TopicRef] = set()

        def visit(topic: TopicRef, path: list[TopicRef]) -> bool:
            if topic in visiting:
                cycle = " -> ".join(str(t) for t in [*path[path.index(topic) :], topic])
                self.fail("route", cycle, "a route without cycles (a processor must not feed its own input)")
                return True
            if topic in done:
                return False
            visiting.add(topic)
            found = any(visit(nxt, [*path, topic]) for nxt in sorted(edges.get(topic, ()), key=str))
            visiting.discard(topic)
            done.add(topic)
            return found

        for start in sorted(edges, key=str):
            if visit(start, []):
                return


def _join(field: str, key: str) -> str:
    return key if field.startswith("<") else f"{field}.{key}"
