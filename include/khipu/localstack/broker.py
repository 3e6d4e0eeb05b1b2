"""The local Apache Kafka broker: one KRaft node (broker and controller) on 127.0.0.1.

Runs from the jars `make install` copies from Maven Central into ``.jvm/kafka/``
(``jvm/kafka-broker.pom.xml``); nothing is downloaded at run time. A broker folder holds its
``server.properties``, its Log4j2 settings and its data: storage is formatted once (Kafka's own
``kafka.tools.StorageTool``), so topics, offsets and committed group offsets survive a restart.
This is the standard broker, configured as Kafka's own single-node quick-start is, plus a
retention check every 10 s (the default is 5 minutes) so short retentions act within seconds.
"""

from __future__ import annotations

import base64
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from khipu.files import write_owner_only
from khipu.kafka import KafkaAdmin, KafkaConnection, KafkaUnavailable
from khipu.kafka.admin import one_group_per_coordinator
from khipu.localstack.processes import find_java, free_port, port_open, stop_process_group
from khipu.settings import project_root

KAFKA_MAIN = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
NODE_ID = 1
PROBE_TOPIC = "khipu-coordinator-probe"  # never created: asking a group's offsets of it needs only the coordinator


class BrokerError(RuntimeError):
    """The local broker could not be set up, started or reached."""


def kafka_jars() -> Path:
    """The folder of Kafka's jars; fails with the command that installs them when it is empty."""
    jars = project_root() / ".jvm" / "kafka"
    if not any(jars.glob("kafka_2.13-*.jar")):
        raise BrokerError(f"Apache Kafka's jars are not installed in {jars}; run `make install` (Maven fetches them)")
    return jars


def java_binary() -> str:
    candidate = find_java()
    if candidate is None:
        raise BrokerError("Kafka needs Java 17 or newer: no `java` on PATH and JAVA_HOME is not set")
    return candidate


@dataclass(frozen=True, slots=True)
class BrokerSpec:
    """One single-node broker: its folder, its ports, and an optional SASL/PLAIN listener with users."""

    directory: Path  # server.properties, log4j2.properties and data/ live here
    port: int
    controller_port: int
    host: str = "127.0.0.1"
    heap_mb: int = 512
    sasl_port: int | None = None  # a SASL_PLAINTEXT listener (mechanism PLAIN) besides the plain one
    sasl_users: Mapping[str, str] = field(default_factory=dict, repr=False)  # user -> password; never logged
    settings: Mapping[str, str] = field(default_factory=dict)  # further broker settings

    @classmethod
    def scratch(
        cls, directory: Path, *, sasl_users: Mapping[str, str] | None = None, settings: Mapping[str, str] | None = None
    ) -> BrokerSpec:
        """A throwaway broker for tests and benchmarks: free ports, a small heap, retention checked every second."""
        return cls(
            directory,
            port=free_port(),
            controller_port=free_port(),
            heap_mb=384,
            sasl_port=free_port() if sasl_users else None,
            sasl_users=dict(sasl_users or {}),
            settings={"log.retention.check.interval.ms": "1000", **(settings or {})},
        )

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def sasl_bootstrap_servers(self) -> str | None:
        return f"{self.host}:{self.sasl_port}" if self.sasl_port else None

    def properties(self) -> dict[str, str]:
        listeners = [f"PLAINTEXT://{self.host}:{self.port}", f"CONTROLLER://{self.host}:{self.controller_port}"]
        advertised = [f"PLAINTEXT://{self.host}:{self.port}"]
        protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
        props = {
            "process.roles": "broker,controller",
            "node.id": str(NODE_ID),
            "controller.quorum.voters": f"{NODE_ID}@{self.host}:{self.controller_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "log.retention.check.interval.ms": "10000",
        }
        if self.sasl_port:
            listeners.append(f"SASL_PLAINTEXT://{self.host}:{self.sasl_port}")
            advertised.append(f"SASL_PLAINTEXT://{self.host}:{self.sasl_port}")
            protocols.append("SASL_PLAINTEXT:SASL_PLAINTEXT")
            users = " ".join(f'user_{name}="{password}"' for name, password in self.sasl_users.items())
            props["sasl.enabled.mechanisms"] = "PLAIN"
            props["listener.name.sasl_plaintext.plain.sasl.jaas.config"] = (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
            )
        props.update(
            listeners=",".join(listeners),
            **{"advertised.listeners": ",".join(advertised), "listener.security.protocol.map": ",".join(protocols)},
        )
        props.update(self.settings)
        return props


@dataclass(frozen=True, slots=True)
class BrokerProcess:
    pid: int
    spec: BrokerSpec

    @property
    def host(self) -> str:
        return self.spec.host

    @property
    def port(self) -> int:
        return self.spec.port

    @property
    def bootstrap_servers(self) -> str:
        return self.spec.bootstrap_servers

    def connection(self, cluster: str = "local") -> KafkaConnection:
        return KafkaConnection(self.bootstrap_servers, cluster=cluster)

    def admin(self, cluster: str = "local") -> KafkaAdmin:
        return KafkaAdmin(self.connection(cluster))


_LOG4J2 = """\
# Kafka's log, to the broker's stdout (the local stack sends it to <state>/logs/broker.log)
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = INFO
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
"""


def write_config(spec: BrokerSpec) -> Path:
    """Write ``server.properties`` (owner-only: it may hold SASL users) and the Log4j2 settings."""
    spec.directory.mkdir(parents=True, exist_ok=True)
    path = spec.directory / "server.properties"
    text = "# Written by khipu on every start; edit BrokerSpec, not this file.\n" + "".join(
        f"{key}={value}\n" for key, value in spec.properties().items()
    )
    write_owner_only(path, text)
    (spec.directory / "log4j2.properties").write_text(_LOG4J2)
    return path


def _jvm(spec: BrokerSpec) -> list[str]:
    return [
        java_binary(),
        f"-Xms{max(64, spec.heap_mb // 2)}m",
        f"-Xmx{spec.heap_mb}m",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={spec.directory / 'log4j2.properties'}",
        "-cp",
        f"{kafka_jars()}/*",
    ]


def formatted(spec: BrokerSpec) -> bool:
    return (spec.data_dir / "meta.properties").exists()


def format_storage(spec: BrokerSpec, log_path: Path) -> None:
    """Format the KRaft storage of a new broker folder (once; a formatted folder is left alone)."""
    if formatted(spec):
        return
    config = write_config(spec)
    cluster_id = _new_cluster_id()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        result = subprocess.run(
            [*_jvm(spec), STORAGE_TOOL, "format", "-t", cluster_id, "-c", str(config)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=120,
            check=False,
        )
    if result.returncode != 0:
        raise BrokerError(
            f"formatting the broker's storage in {spec.data_dir} failed (exit {result.returncode}); see {log_path}"
        )


def _new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding, not starting with '-'."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def start_broker(spec: BrokerSpec, log_path: Path, ready_timeout_s: float = 90.0) -> BrokerProcess:
    """Format the folder if new, start the broker in its own process group, wait until it answers."""
    for port in (spec.port, spec.controller_port, spec.sasl_port):
        if port and port_open(spec.host, port):
            raise BrokerError(f"cannot start the broker on {spec.host}:{port}: something already listens there")
    format_storage(spec, log_path)
    config = write_config(spec)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            [*_jvm(spec), KAFKA_MAIN, str(config)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    broker = BrokerProcess(process.pid, spec)
    deadline = time.monotonic() + ready_timeout_s
    while True:
        if process.poll() is not None:
            raise BrokerError(f"the broker exited with code {process.returncode} at start; see {log_path}")
        if port_open(spec.host, spec.port) and _answers(broker):
            break
        if time.monotonic() > deadline:
            stop_process_group(process.pid)
            raise BrokerError(
                f"the broker did not answer on {spec.bootstrap_servers} within {ready_timeout_s:.0f}s; see {log_path}"
            )
        time.sleep(0.1)

    _wait_for_group_coordinators(broker, deadline, log_path)
    return broker


def _wait_for_group_coordinators(broker: BrokerProcess, deadline: float, log_path: Path) -> None:
    """A broker answers metadata before its group coordinators have loaded ``__consumer_offsets`` (created on
    the first group request, or read back after a restart); a commit then fails with "Coordinator load in
    progress", which librdkafka does not retry. Ask one group of each of its partitions for its offsets, which
    waits out the load, so a started broker takes commits at once."""
    partitions = int(broker.spec.properties()["offsets.topic.num.partitions"])
    admin = KafkaAdmin(broker.connection(), timeout_s=max(1.0, deadline - time.monotonic()))
    try:
        for group in one_group_per_coordinator(partitions):
            admin.committed_offsets(group, [(PROBE_TOPIC, 0)])
    except KafkaUnavailable as exc:
        stop_process_group(broker.pid)
        raise BrokerError(f"the broker's group coordinators did not load: {exc}; see {log_path}") from None


def _answers(broker: BrokerProcess) -> bool:
    try:
        KafkaAdmin(broker.connection(), timeout_s=2).partitions()
        return True
    except KafkaUnavailable:
        return False
