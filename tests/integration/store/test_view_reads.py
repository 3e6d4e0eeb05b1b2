"""What the view, the API, the CLI and the exporter read, the same on SQLite and PostgreSQL: every report and
API answer computed over tests/viewdata.py's store is identical on both databases, and matches what was written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from khipu.registry.loader import load_registry
from khipu.report import service
from khipu.report.plain import plain
from khipu.store import Store
from khipu.verdicts.metrics import MinuteCounts
from tests.viewdata import STORE_READ, a_latency, seed

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
NOW_MS = 1_795_000_000_000
REGISTRY = load_registry(ROOT / "config" / "registry.yaml")
ANSWERS: dict[str, dict[str, Any]] = {}


def answers(store: Store, archive: Path) -> dict[str, Any]:
    """Every report, as the API would serve it (JSON), over the seeded store."""
    pages, cursor = [], None
    while True:
        query = service.VerdictQuery(verdicts=("DELIVERED",), hop=STORE_READ, limit=9, cursor=cursor)
        page = service.verdict_page(store, REGISTRY, archive, query)
        pages.append([r["message_id"] for r in page.rows])
        if (cursor := page.next_cursor) is None:
            break
    found = {
        "overview": service.overview(store, REGISTRY, NOW_MS),
        "losses": service.verdict_page(store, REGISTRY, archive, service.VerdictQuery()),
        "delivered_pages": pages,
        "consumers": service.consumer_report(store, "local", NOW_MS),
        "khipu": service.khipu_health(store, NOW_MS, stale_after_ms=120_000),
        "alerts": service.alerts_report(store, 0),
        "kinds": sorted(store.verdicts.kind_counts(0).items()),
        "minutes": store.verdicts.read_metrics(),
        "parts": store.verdicts.read_parts(),
    }
    return json.loads(json.dumps(plain(found), sort_keys=True))


def test_the_reports_match_what_was_written_and_agree_on_both_databases(store: Store, tmp_path: Path) -> None:
    data = seed(store, tmp_path / "archive", REGISTRY, NOW_MS)
    got = answers(store, tmp_path / "archive")
    delivered = sorted(
        (r for r in data.verdicts if r["verdict"] == "DELIVERED" and r["hop"] == STORE_READ),
        key=lambda r: (r["decided_ms"], r["message_id"]),
        reverse=True,
    )
    assert [m for page in got["delivered_pages"] for m in page] == [r["message_id"] for r in delivered]
    assert {r["message_id"] for r in got["losses"]["rows"]} == {data.skipped, data.dropped}
    assert all(isinstance(g["missing"], int) for g in got["khipu"]["emitters_with_gaps"])
    assert sum(n for _, n in got["kinds"]) == len(data.verdicts)
    latencies = [r["latency_ms"] for r in data.verdicts if a_latency(r)]
    minutes = [MinuteCounts.of_row(minute) for minute in got["minutes"]]
    assert sum(m.verdicts for m in minutes) == len(data.verdicts)
    assert sum(m.latency_count for m in minutes) == len(latencies)
    assert sum(m.latency_sum_ms for m in minutes) == sum(latencies)  # all below a second: exact
    impossible = [r for r in data.verdicts if r["latency_ms"] is not None and not a_latency(r)]
    assert sum(m.skewed for m in minutes) == len(impossible) > 0  # apart, in no percentile
    ANSWERS[store.engine.url.split(":", 1)[0]] = got
    if len(ANSWERS) == 2:  # both databases answered: the same, to the last figure
        sqlite, postgres = ANSWERS["sqlite"], ANSWERS["postgresql+psycopg2"]
        for key in sqlite:
            assert sqlite[key] == postgres[key], key
