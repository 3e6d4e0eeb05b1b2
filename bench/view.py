"""The Khipu view's response times on a store holding a million verdicts (not a test: it prints figures).

    .venv/bin/python bench/view.py [--verdicts 1000000] [--store-url URL] [--requests 20]

Fills a store (a fresh SQLite file by default; ``--store-url`` for PostgreSQL, an empty database)
with ``--verdicts`` verdicts of ``demo.orders`` spread over the last day (1 % lost, 0.3 % confirmed
lost, 0.5 % duplicates), their per-minute metrics counted per chunk as the detector counts a batch,
their history and consumer health, and a trace archive of the same messages (one trace per hop,
Parquet by hour, as the detector writes it: the lost list reads recovery attributes from it, the
message page its traces); then asks the view's app (the same FastAPI app
Airflow mounts, called in-process, so the figures are the app's and the store's, not the network's)
for each page and API answer ``--requests`` times and prints the median and the slowest; no page has a target
(each row says "(no target)").
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from fastapi import HTTPException, Request
from fastapi.testclient import TestClient
from sqlalchemy import insert

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugins")]

from tests.viewdata import GROUP, HOPS, KIND, STREAM, history_change, verdict  # noqa: E402

from figures import NO_TARGET  # noqa: E402
from khipu.registry.loader import load_registry  # noqa: E402
from khipu.store import Store, schema  # noqa: E402
from khipu.trace.archive import HOUR_MS, hour_folder  # noqa: E402
from khipu.verdicts.metrics import counts_by_minute_columns, metrics_of  # noqa: E402
from khipu_airflow.view.app import ViewSources, create_app  # noqa: E402

CHUNK = 20_000


def write_archive(archive: Path, count: int, now_ms: int) -> int:
    """The trace archive of the same messages, as the detector lays it out: one SENT or RECEIVED trace per hop of
    each message (with its order_id), Parquet by UTC hour. Returns the traces written."""
    messages, day = count // len(HOPS), 86_400_000
    by_hour: dict[int, list[dict[str, Any]]] = {}
    for n in range(messages):
        at = now_ms - day + (n * day) // messages - 1_000
        for i, hop in enumerate(HOPS):
            source, target = hop.split(" -> ")
            write = KIND[hop] == "write"
            by_hour.setdefault((at + i) // HOUR_MS, []).append(
                {
                    "message_id": f"bench-{n:08d}", "stream": STREAM, "type": "SENT" if write else "RECEIVED",
                    "location": source if write else GROUP[hop], "cluster": "local",
                    "topic": (target if write else source).split("/", 1)[1], "partition": n % 3, "offset": n,
                    "group": None if write else GROUP[hop], "timestamp_ms": at + i, "emitter_id": f"e-{i}",
                    "emitter_seq": n, "sampling_percent": 100.0, "attributes": f'{{"order_id": "o-{n}"}}',
                }
            )  # fmt: skip
    for hour, traces in by_hour.items():
        folder = archive / hour_folder(hour * HOUR_MS) / "batch_id=0"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(traces), folder / "part-0.parquet")
    return sum(len(traces) for traces in by_hour.values())


def fill(store: Store, count: int, now_ms: int, say: Callable[[str], None]) -> list[str]:
    """``count`` verdicts over the last day; returns some lost message ids (to open their pages)."""
    rng = random.Random(7)
    messages = count // len(HOPS)
    day = 86_400_000
    lost_ids: list[str] = []
    rows: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []
    started = time.monotonic()
    written = 0
    for n in range(messages):
        decided = now_ms - day + (n * day) // messages
        message_id = f"bench-{n:08d}"
        for i, hop in enumerate(HOPS):
            draw = rng.random()
            kind, cause = "DELIVERED", None
            if draw < 0.010:
                kind, cause = "LOST", ("skipped_by_consumer" if KIND[hop] == "read" else "dropped_in_processor")
            elif draw < 0.013:
                kind, cause = "CONFIRMED_LOST", "dropped_in_processor"
            elif draw < 0.018:
                kind, cause = "DUPLICATE", "rewind_replay"
            row = verdict(message_id, hop, kind, decided + i, cause=cause)
            rows.append({**row, "group_id": row.pop("group")})
            if kind == "CONFIRMED_LOST":
                history += [
                    history_change(message_id, hop, None, "LOST", decided, "detector", "lost"),
                    history_change(
                        message_id,
                        hop,
                        "LOST",
                        "CONFIRMED_LOST",
                        decided + 7_200_000,
                        "reconciliation",
                        "confirmed_lost",
                    ),
                ]
            if kind == "LOST" and len(lost_ids) < 50:
                lost_ids.append(message_id)
        if len(rows) >= CHUNK or n == messages - 1:
            with store.engine.begin() as tx:
                tx.execute(insert(schema.verdicts), rows)
                if history:
                    tx.execute(insert(schema.verdict_history), history)
            # each chunk's metrics are a part of their own, counted the way the detector counts a batch
            columns = [[row[name] for row in rows] for name in ("stream", "hop", "verdict", "decided_ms", "latency_ms")]
            store.verdicts.replace_part(f"bench:{written}", counts_by_minute_columns(*columns), metrics_of)
            written += len(rows)
            rows, history = [], []
            if written % 200_000 < CHUNK:
                say(f"  {written:,} verdicts written ({time.monotonic() - started:.0f} s)")
    with store.engine.begin() as tx:
        tx.execute(
            insert(schema.partition_health),
            [
                {
                    "cluster": "local", "group_id": group, "topic": "demo.orders-enriched", "partition": p,
                    "status": "OK", "since_ms": now_ms - 3_600_000, "evaluated_ms": now_ms, "lag": p,
                    "time_lag_ms": 1000 * p, "reason": "keeping up", "evidence": "{}",
                }
                for group in sorted(set(GROUP.values())) for p in range(12)
            ],
        )  # fmt: skip
    return lost_ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verdicts", type=int, default=1_000_000)
    parser.add_argument("--store-url", help="an empty database (default: a fresh SQLite file)")
    parser.add_argument("--requests", type=int, default=20, help="times each page is asked for (default 20)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="khipu-bench-view-"))
    url = args.store_url or f"sqlite:///{work / 'khipu.db'}"
    store = Store(url)
    store.migrate()
    now_ms = time.time_ns() // 1_000_000
    print(f"filling {store.safe_url} with {args.verdicts:,} verdicts over the last day ...")
    started = time.monotonic()
    lost_ids = fill(store, args.verdicts, now_ms, print)
    traces = write_archive(work / "archive", args.verdicts, now_ms)
    print(f"filled in {time.monotonic() - started:.0f} s; {traces:,} traces in the archive ({work / 'archive'})")
    store.close()

    registry = load_registry(ROOT / "config" / "registry.yaml")
    view_store = Store(url)

    async def anyone(_request: Request) -> str:  # the bench measures the app and the store, not Airflow's login
        return "bench"

    app = create_app(
        ViewSources(lambda: view_store, lambda: registry, work / "archive", "local", lambda: now_ms),
        anyone,
        lambda _next: "/login",
    )
    client = TestClient(app)
    first = client.get("/api/v1/verdicts", params={"limit": 50}).json()
    deep_cursor = first["next_cursor"]
    for _ in range(19):  # the 21st page of losses
        deep_cursor = client.get("/api/v1/verdicts", params={"limit": 50, "cursor": deep_cursor}).json()["next_cursor"]
    asks: list[tuple[str, str, dict[str, Any]]] = [
        ("streams page (route maps; the last hour)", "/", {}),
        ("streams page, the last 15 minutes", "/", {"window": "15m"}),
        ("streams page, the last day", "/", {"window": "1d"}),
        ("streams page, the last week", "/", {"window": "1w"}),
        ("lost messages page (newest 50)", "/lost", {}),
        ("lost messages, 21st page", "/api/v1/verdicts", {"cursor": deep_cursor}),
        ("lost messages of one hop and cause", "/lost", {"hop": HOPS[-1], "cause": "skipped_by_consumer"}),
        ("lost messages of one hour, a day ago", "/lost", {"since": str(now_ms - 86_000_000),
                                                           "until": str(now_ms - 82_400_000)}),
        ("message page", f"/messages/{lost_ids[0]}", {}),
        ("consumer health page", "/consumers", {}),
        ("API: streams", "/api/v1/streams", {}),
        ("API: 60 minutes of metrics", f"/api/v1/streams/{STREAM}/metrics", {}),
    ]  # fmt: skip
    print(f"\n{args.verdicts:,} verdicts in {store.safe_url}; each page asked {args.requests} times\n")
    print(f"| {'page':40} | median ms | slowest ms | target |")
    print(f"|{'-' * 42}|-----------|------------|--------|")
    for name, path, params in asks:
        times = []
        for _ in range(args.requests):
            t0 = time.perf_counter()
            answer = client.get(path, params=params)
            times.append((time.perf_counter() - t0) * 1000)
            if answer.status_code != 200:
                raise HTTPException(answer.status_code, f"{path}: {answer.text[:300]}")
        print(f"| {name:40} | {statistics.median(times):9.1f} | {max(times):10.1f} | {NO_TARGET} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
