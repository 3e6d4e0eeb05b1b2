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
        "version: 1\nclusters: {local: {}}\nstreams:\n  orders:\n    owner: team-t\n"
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


BURST_REGISTRY = (
    "version: 1\nclusters: {local: {}}\nstreams:\n  orders:\n    owner: team-t\n"
    "    alerts: {loss_rate: 0.05, duplicate_rate: 0.10}\n    route:\n"
    "      producers: [{location: p, writes: [local/in]}]\n"
    "      consumers:\n"
    "        - {group: enrich, reads: [local/in], writes: [local/out]}\n"
    "        - {group: store, reads: [local/out]}\n"
    "        - {group: audit, reads: [local/out]}\n"
)
ENRICH_READ, ENRICH_WRITE = "local/in -> enrich", "enrich -> local/out"
STORE_READ, AUDIT_READ = "local/out -> store", "local/out -> audit"


def burst_verdict(n: int, hop: str, copies: bool, decided_ms: int) -> Verdict:
    """Message n at ``hop`` as the detector judges it when the enricher read its input again after a rebalance
    and wrote it again (docs/detector.md): its read and write DUPLICATE rewind/replay, each sink's read DUPLICATE
    producer retry (the id at two offsets)."""
    read = hop != ENRICH_WRITE
    cause = Cause.REWIND_REPLAY if hop in (ENRICH_READ, ENRICH_WRITE) else Cause.PRODUCER_RETRY
    return Verdict(
        message_id=f"b{n}", stream="orders", hop=hop, hop_kind="read" if read else "write",
        kind=VerdictKind.DUPLICATE if copies else VerdictKind.DELIVERED, cause=cause if copies else None,
        count=2 if copies else 1, topic="in" if hop == ENRICH_READ else "out", partition=0, offset=n,
        group=hop.split(" -> ")[1] if read else None, location=None if read else "enrich", observed_ms=None,
        latency_ms=50, e2e_latency_ms=None, decided_ms=decided_ms, detail="", first_seen_ms=decided_ms - 5_000,
    )  # fmt: skip


def test_a_burst_of_duplicates_downstream_of_one_cause_is_one_alert_that_resolves_saying_the_window_emptied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, webhook: tuple[str, list[dict[str, Any]]]
) -> None:
    """Issue 38: one burst raised an alert per hop downstream of one cause. The enricher replays 20 of 100
    messages: 20 % duplicates at its read, its write and both sinks (threshold 10 %). One alert names the four
    hops and starts at the enricher's read; ten minutes on, no verdict is left in the 2-minute window, and the
    resolve says the window emptied, not that the rate fell."""
    from khipu_airflow import offsets

    url, received = webhook
    registry = tmp_path / "registry.yaml"
    registry.write_text(BURST_REGISTRY)
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
    now = int(time.time() * 1000)
    hops = (ENRICH_READ, ENRICH_WRITE, STORE_READ, AUDIT_READ)
    VerdictBook(store.verdicts).record(
        [burst_verdict(n, hop, n < 20, now - 30_000) for hop in hops for n in range(100)], now
    )

    assert offsets.check_verdict_thresholds("khipu_store")["alerts"] == 1
    offsets.send_alerts("khipu_store")
    (fired,) = received
    assert (fired["state"], fired["subject"]) == ("firing", "orders duplicate_rate")
    assert fired["details"]["hops"] == list(hops) and fired["details"]["starts_at"] == [ENRICH_READ]
    assert fired["details"]["top_causes"] == {"rewind_replay": 20}

    monkeypatch.setattr(offsets, "now_ms", lambda: now + 600_000)  # the check ten minutes on: the burst left
    assert offsets.check_verdict_thresholds("khipu_store")["alerts"] == 1
    offsets.send_alerts("khipu_store")
    resolved = received[-1]
    assert (resolved["state"], resolved["subject"]) == ("resolved", "orders duplicate_rate")
    assert resolved["details"]["resolved_because"] == "window_emptied"
    assert [h["verdicts"] for h in resolved["details"]["per_hop"]] == [0, 0, 0, 0]
    store.close()
