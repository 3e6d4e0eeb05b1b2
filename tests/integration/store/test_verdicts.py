"""Verdicts and their per-minute metrics in the store (SQLite and PostgreSQL), the way the verdict writer
drives them: upsert the batch, read the touched minutes' outcomes, compute, upsert the metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from khipu.store import Store
from khipu.verdicts.metrics import MINUTE_MS, minute_metrics, minutes_touched

pytestmark = pytest.mark.integration


def verdict(
    message_id: str, kind: str, decided_ms: int, latency_ms: int | None = None, hop: str = "h"
) -> dict[str, Any]:
    return {
        "message_id": message_id,
        "hop": hop,
        "stream": "orders",
        "hop_kind": "read",
        "verdict": kind,
        "cause": None,
        "count": 1,
        "topic": "orders",
        "partition": 0,
        "offset": 1,
        "group": "sink",
        "location": "sink",
        "observed_ms": decided_ms,
        "latency_ms": latency_ms,
        "e2e_latency_ms": latency_ms,
        "decided_ms": decided_ms,
        "detail": "",
    }


def write_batch(store: Store, rows: Sequence[dict[str, Any]]) -> None:
    store.verdicts.upsert(rows)
    minutes = minutes_touched(rows)
    outcomes = store.verdicts.read_outcomes([minute.span for minute in minutes])
    store.verdicts.upsert_metrics([minute_metrics(minute, outcomes[minute.span]) for minute in minutes])


def test_a_replayed_batch_stores_each_verdict_once_and_leaves_the_same_metrics(store: Store) -> None:
    batch = [
        verdict("m1", "DELIVERED", 1_000, 10),
        verdict("m2", "LOST", 2_000),
        verdict("m3", "DELIVERED", 70_000, 30),
    ]
    write_batch(store, batch)
    first = store.verdicts.read_metrics()
    write_batch(store, batch)
    assert [v["message_id"] for v in store.verdicts.read()] == ["m1", "m2", "m3"]
    assert store.verdicts.read_metrics() == first
    assert [(m["minute_ms"], m["delivered"], m["lost"], m["loss_rate"], m["latency_p50_ms"]) for m in first] == [
        (0, 1, 1, 0.5, 10),
        (MINUTE_MS, 1, 0, 0.0, 30),
    ]


def test_a_verdict_decided_again_replaces_the_first_and_its_minute_is_recomputed(store: Store) -> None:
    write_batch(store, [verdict("m1", "LOST", 1_000), verdict("m2", "DELIVERED", 2_000, 4)])
    write_batch(store, [verdict("m1", "DELIVERED", 3_000, 8)])  # the same message and hop, decided again
    [row] = [v for v in store.verdicts.read() if v["message_id"] == "m1"]
    assert (row["verdict"], row["decided_ms"], row["group_id"]) == ("DELIVERED", 3_000, "sink")
    [minute] = store.verdicts.read_metrics("orders")
    assert (minute["delivered"], minute["lost"], minute["latency_p99_ms"]) == (2, 0, 8)


def test_outcomes_are_read_per_stream_hop_and_span_only(store: Store) -> None:
    store.verdicts.upsert(
        [
            verdict("m1", "DELIVERED", 59_999, 5),
            verdict("m2", "LOST", 60_000),  # the next minute
            verdict("m3", "DUPLICATE", 10, 7, hop="other"),
        ]
    )
    span = ("orders", "h", 0, MINUTE_MS)
    found = store.verdicts.read_outcomes([span, span])
    assert [(o.verdict, o.latency_ms) for o in found[span]] == [("DELIVERED", 5)]
    assert store.verdicts.read_outcomes([("payments", "h", 0, MINUTE_MS)]) == {("payments", "h", 0, MINUTE_MS): []}
    assert store.verdicts.read(stream="payments") == [] and len(store.verdicts.read(since_ms=60_000)) == 1
