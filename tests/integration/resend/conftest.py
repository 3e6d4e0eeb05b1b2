"""The resend tests' pipeline: fresh topics on the session broker and a fresh SQLite store per test."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from khipu.localstack.broker import BrokerProcess
from khipu.store import Store
from tests.integration.resend.pipeline import Pipeline, registry


@pytest.fixture
def pipeline(broker: BrokerProcess, tmp_path: Path) -> Iterator[Pipeline]:
    suffix = secrets.token_hex(3)
    inp, out = f"in-{suffix}", f"out-{suffix}"
    broker.admin().ensure_topics({inp: 1, out: 2})
    store = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    store.migrate()
    yield Pipeline(broker, store, registry(inp, out), inp, out)
    store.close()
