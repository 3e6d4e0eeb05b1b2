"""A stream crossing its registry loss-rate threshold raises exactly one alert through the notifiers, and one
resolve when it falls back (real store, real webhook receiver; the verdicts go in as the detector's writer
stores them)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from khipu.store import Store
from khipu.verdicts.book import VerdictBook
from khipu.verdicts.model import Cause, Verdict, VerdictKind

pytestmark = pytest.mark.integration
HOP = "local/out -> s1"


def verdict(n: int, kind: VerdictKind, decided_ms: int) -> Verdict:
    return Verdict(
        message_id=f"m{n}", stream="orders", hop=HOP, hop_kind="read", kind=kind,
        cause=Cause.SKIPPED_BY_CONSUMER if kind is VerdictKind.LOST else None,
        count=1 if kind is VerdictKind.DELIVERED else 0, topic="out", partition=0, offset=n, group="s1",
        location=None, observed_ms=None, latency_ms=50, e2e_latency_ms=None, decided_ms=decided_ms, detail="",
        first_seen_ms=decided_ms - 5_000,
    )  # fmt: skip


def test_crossing_the_loss_threshold_alerts_once_and_resolves_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, webhook: tuple[str, list[dict[str, Any]]]
) -> None:
    from khipu_airflow import offsets

    url, received = webhook
    registry = tmp_path / "registry.yaml"
    registry.write_text(
        "version: 1\nclusters: {local: {}}\nstreams:\n  orders:\n    owner: t\n"
        "    alerts: {loss_rate: 0.01}\n    route:\n      producers: [{location: p, writes: [local/out]}]\n"
        "      consumers: [{group: s1, reads: [local/out]}]\n"
    )
    store_path = tmp_path / "khipu.db"
    for variable, value in {
        "KHIPU_REGISTRY": str(registry),
        "KHIPU_ALERT_WINDOW_MS": "120000",
        "KHIPU_ALERT_MIN_VERDICTS": "10",
        "AIRFLOW_CONN_KHIPU_STORE": json.dumps({"conn_type": "sqlite", "host": str(store_path)}),
        "AIRFLOW_CONN_KHIPU_ALERT_WEBHOOK": json.dumps({"conn_type": "http", "extra": {"url": url}}),
    }.items():
        monkeypatch.setenv(variable, value)
    store = Store(f"sqlite:///{store_path}")
    store.migrate()
    book = VerdictBook(store.verdicts)
    now = int(time.time() * 1000)
    book.record(
        [verdict(n, VerdictKind.LOST if n < 3 else VerdictKind.DELIVERED, now - 30_000) for n in range(50)], now
    )

    first = offsets.check_verdict_thresholds("khipu_store")
    second = offsets.check_verdict_thresholds("khipu_store")  # the next minute, still above: nothing new
    offsets.send_alerts("khipu_store")
    assert (first["alerts"], second["alerts"]) == (1, 0)
    assert [(body["state"], body["details"]["metric"], body["details"]["value"]) for body in received] == [
        ("firing", "loss_rate", 0.06)
    ]
    assert received[0]["details"]["top_causes"] == {"skipped_by_consumer": 3}

    # the losses were retracted by late traces: the rate falls back to zero
    book.record([verdict(n, VerdictKind.DELIVERED, now + 1_000) for n in range(3)], now + 1_000)
    assert offsets.check_verdict_thresholds("khipu_store")["alerts"] == 1
    assert offsets.check_verdict_thresholds("khipu_store")["alerts"] == 0
    offsets.send_alerts("khipu_store")
    assert [body["state"] for body in received] == ["firing", "resolved"]
    store.close()
