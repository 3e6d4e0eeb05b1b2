"""A real SQLite store seeded with what the Khipu view shows, and exporters served over it on free ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.registry import CollectorRegistry

from khipu.localstack.processes import free_port
from khipu.registry.loader import load_registry
from khipu.report.exporter import ExportWindows, KhipuCollector, MetricsServer, serve_metrics
from khipu.store import Store
from tests.viewdata import Seeded, seed

ROOT = Path(__file__).resolve().parents[3]
NOW_MS = 1_795_000_000_000
CLUSTER = "local"
REGISTRY = ROOT / "config" / "registry.yaml"


@dataclass(frozen=True, slots=True)
class SeededStore:
    url: str
    store: Store
    data: Seeded


StartExporter = Callable[..., MetricsServer]


@pytest.fixture
def seeded(tmp_path: Path) -> Iterator[SeededStore]:
    url = f"sqlite:///{tmp_path / 'khipu.db'}"
    store = Store(url)
    store.migrate()
    data = seed(store, tmp_path / "archive", load_registry(ROOT / "config" / "registry.yaml"), NOW_MS)
    yield SeededStore(url, store, data)
    store.close()


@pytest.fixture
def start_exporter() -> Iterator[StartExporter]:
    """Serve an exporter over the store at a URL, on a free port; every one started is closed after the test."""
    servers: list[MetricsServer] = []

    def start(url: str, token: str | None = None, windows: ExportWindows | None = None) -> MetricsServer:
        registry = CollectorRegistry()
        limits = {name: stream.alerts for name, stream in load_registry(REGISTRY).streams.items()}
        registry.register(KhipuCollector(lambda: Store(url), CLUSTER, lambda: NOW_MS, windows, thresholds=limits))
        server = serve_metrics(registry, "127.0.0.1", free_port(), token)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()
