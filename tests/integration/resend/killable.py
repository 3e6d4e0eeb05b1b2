"""The resend task as the kill-at-random test runs it: a process of its own (forked from a server that has
imported Khipu, so that a hundred of them start in a second or two), killed by SIGKILL wherever it is."""

from __future__ import annotations

from multiprocessing.connection import Connection

from khipu.clock import now_ms
from khipu.kafka.connection import KafkaConnection
from khipu.registry import parse_registry
from khipu.registry.model import ResendMode
from khipu.resend.run import Resender, ResendSelection
from khipu.store import Store


def resend(store_url: str, registry_text: str, bootstrap: str, message_ids: list[str], started: Connection) -> None:
    """Resend these confirmed losses, as the resend task does; say when the run begins."""
    store = Store(store_url)
    registry = parse_registry(registry_text)
    resender = Resender(store, registry, {"local": KafkaConnection(bootstrap, "local")}, now_ms)
    started.send("started")
    resender.run(ResendSelection(frozenset({ResendMode.AUTO}), message_ids=tuple(message_ids)), progress=str)
    started.send("done")
