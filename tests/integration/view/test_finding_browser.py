"""Finding messages in Airflow's own api-server, behind its login, in Debian's Chromium: the search box (by id and by
recovery attribute, across the store, the verdict archive and many hours of the trace archive) and the messages at
risk on a real topic whose retention is seconds.

The api-server is test_view_browser.py's (tests/viewdata.py's store and trace archive); what the tests add is
written through Khipu's own writers (the archives' ``write_batch``, the store's repositories) or, for the topic at
risk, produced to and consumed from a real broker. Every expectation is computed from what the test wrote,
produced or consumed, never from Khipu's answers.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from playwright.sync_api import Browser, Page

from khipu.alerting.cluster import evaluate_cluster
from khipu.health.evaluate import HealthConfig
from khipu.localstack.broker import BrokerProcess
from khipu.offsets.collect import collect_snapshot
from khipu.trace.archive import HOUR_MS, SCHEMA, hour_of, write_batch
from khipu.verdicts.archive import VerdictArchive, verdict_table
from tests.archived import seed_archived
from tests.integration.helpers import consume_all, consumer_config, log_offsets, until
from tests.integration.view.test_view_browser import Server, _log_in, _now_ms, server
from tests.viewdata import AUDIT_READ, HOPS, STORE_READ, STREAM, verdict

pytestmark = pytest.mark.integration
__all__ = ["server"]  # test_view_browser.py's api-server

ARCHIVED_HOURS = 72  # of synthetic traffic in the trace archive
TRACES_AN_HOUR = 20_000
RETENTION_MS = 20_000  # the topic at risk's retention.ms


def state_dir(server: Server) -> Path:
    return Path(server.store_url.removeprefix("sqlite:///")).parent / "state"


def sent_rows(message_ids: list[str], at_ms: list[int], order_ids: list[str], **where: Any) -> list[dict[str, Any]]:
    """SENT traces as the detector archives them (the trace archive's columns)."""
    base = {name: None for name in SCHEMA.names} | {
        "stream": STREAM, "location": "demo-producer", "cluster": "local", "type": "SENT", "topic": "demo.orders",
        "partition": 0, "emitter_id": "bench-producer", "sampling_percent": 100.0, "prev_offsets": [],
    } | where  # fmt: skip
    return [
        base | {"message_id": m, "timestamp_ms": at, "kafka_timestamp_ms": at + 3, "offset": i, "emitter_seq": i,
                "attributes": json.dumps({"order_id": o}, separators=(",", ":"))}
        for i, (m, at, o) in enumerate(zip(message_ids, at_ms, order_ids, strict=True))
    ]  # fmt: skip


def archive_traces(archive: Path, batch_id: int, rows: list[dict[str, Any]]) -> None:
    write_batch(archive, batch_id, pa.Table.from_pylist(rows, schema=SCHEMA))


def search_from_the_box(page: Page, server: Server, term: str) -> float:
    """Type the term into the search box of the streams page and press Enter; the seconds until results show."""
    page.goto(f"{server.base}/khipu/")
    page.get_by_test_id("search-box").fill(term)
    started = time.monotonic()
    page.get_by_test_id("search-box").press("Enter")
    page.wait_for_url(f"**/khipu/search?q={quote(term, safe='')}*")
    page.locator("[data-testid=search-summary], [data-testid=problem]").first.wait_for()  # results, or a refusal
    return time.monotonic() - started


def found(page: Page) -> list[str]:
    return page.locator("table[data-testid=found] tr[data-message]").evaluate_all(
        "rows => rows.map(r => r.dataset.message)"
    )


def verdicts_shown(page: Page, message_id: str) -> dict[str, str]:
    cells = page.locator(f'tr[data-message="{message_id}"] [data-field="verdicts"] div')
    shown = {}
    for text in cells.all_inner_texts():
        kind, hop = text.split(" ", 1)
        shown[hop.strip()] = kind
    return shown


def test_search_by_id_and_by_attribute_across_the_store_and_the_archives(
    server: Server, browser: Browser, shots: Path
) -> None:
    now = _now_ms()
    state = state_dir(server)
    store = server.store()
    # the verdict archive: two messages' DELIVERED hops (one lost at the audit sink, one read twice: the store's)
    archived = seed_archived(store, state / "verdicts", now)
    # 72 hours of the trace archive, 20,000 traces an hour; order 226 in an hour three days back and in the
    # newest one, 2260 beside them (holds 226, is not 226)
    hour = now // HOUR_MS * HOUR_MS
    old_226, new_226, decoy = "bench-226-old", "bench-226-new", "bench-2260"
    for h in range(ARCHIVED_HOURS):
        start = hour - h * HOUR_MS
        ids = [f"bench-{h}-{i}" for i in range(TRACES_AN_HOUR)]
        orders = [str(100_000 + h * TRACES_AN_HOUR + i) for i in range(TRACES_AN_HOUR)]
        at = [start + i * (HOUR_MS // TRACES_AN_HOUR) for i in range(TRACES_AN_HOUR)]
        if h == ARCHIVED_HOURS - 1:
            ids[7], orders[7] = old_226, "226"
        if h == 0:
            ids[5], orders[5], ids[6], orders[6] = new_226, "226", decoy, "2260"
            at = [min(a, now - 1_000) for a in at]
        archive_traces(state / "archive", 1_000 + h, sent_rows(ids, at, orders))
    old_at = hour - (ARCHIVED_HOURS - 1) * HOUR_MS + 7 * (HOUR_MS // TRACES_AN_HOUR)
    old_delivered = [verdict(old_226, hop, "DELIVERED", old_at + 2_000 + j) for j, hop in enumerate(HOPS)]
    with VerdictArchive(state / "verdicts", store) as verdicts:  # the old one: delivered everywhere, archived
        verdicts.write_batch(77, verdict_table(old_delivered))
        verdicts.index.record(77, [(old_226, old_at, hour_of(old_at + 2_000))])
    store.verdicts.upsert([verdict(new_226, AUDIT_READ, "LOST", now - 500, cause="skipped_by_consumer")])

    page = browser.new_page(viewport={"width": 1500, "height": 900})
    try:
        _log_in(page, server, f"{server.base}/khipu/")

        # by attribute: both orders 226, newest first, across the three days; never 2260
        took_s = search_from_the_box(page, server, "order_id=226")
        assert found(page) == [new_226, old_226], page.inner_text("main")[:2000]
        assert verdicts_shown(page, new_226) == {AUDIT_READ: "LOST"}
        assert verdicts_shown(page, old_226) == {r["hop"]: "DELIVERED" for r in old_delivered}
        sources = page.locator('tr[data-message] [data-field="sources"]').all_inner_texts()
        assert sources == ["store, trace archive", "verdict archive, trace archive"]
        summary = page.get_by_test_id("search-summary").inner_text()
        hours_on_disk = len(list((state / "archive").glob("hour=*")))
        assert f"{hours_on_disk} trace-archive hour(s) read" in summary and hours_on_disk >= ARCHIVED_HOURS
        page.screenshot(path=str(shots / "search.png"), full_page=True)
        print(f"\nsearch by attribute over {hours_on_disk} archived hours ({ARCHIVED_HOURS * TRACES_AN_HOUR:,} "
              f"traces): {took_s:.2f} s from Enter to results")  # fmt: skip

        # the seed's order: its traces in the archive, its loss in the store; one click to its message
        search_from_the_box(page, server, f"order_id={server.seeded.order_id}")
        assert found(page) == [server.seeded.skipped]
        stored = {r["hop"]: r["verdict"] for r in store.verdicts.read_messages([server.seeded.skipped])}
        assert verdicts_shown(page, server.seeded.skipped) == stored
        page.get_by_role("link", name=server.seeded.skipped).click()
        page.wait_for_url(f"**/khipu/messages/{server.seeded.skipped}")
        assert f"order_id={server.seeded.order_id}" in page.inner_text("main")

        # by id: a message whose DELIVERED hops are in the verdict archive and whose read again is in the store
        took_id_s = search_from_the_box(page, server, archived.changed)
        assert found(page) == [archived.changed]
        written = {r["hop"]: r["verdict"] for r in archived.archived if r["message_id"] == archived.changed}
        written |= {r["hop"]: r["verdict"] for r in archived.sql if r["message_id"] == archived.changed}
        assert verdicts_shown(page, archived.changed) == written and written[STORE_READ] == "DUPLICATE"
        assert page.locator('[data-field="sources"]').inner_text() == "store, verdict archive"
        print(f"search by id over the same archive: {took_id_s:.2f} s")

        # by id: one only the trace archive knows (no verdict yet), and one nobody knows
        search_from_the_box(page, server, "bench-40-123")
        assert found(page) == ["bench-40-123"]
        assert page.locator('[data-field="sources"]').inner_text() == "trace archive"
        search_from_the_box(page, server, "never-sent-1")
        assert found(page) == [] and page.get_by_test_id("nothing-found").is_visible()

        # a recovery attribute no stream declares is refused, naming those declared
        search_from_the_box(page, server, "orderid=226")
        assert "order_id" in page.get_by_test_id("problem").inner_text()
    finally:
        page.close()
        store.close()


def test_the_at_risk_page_names_the_unconsumed_messages_of_a_real_topic_before_retention_takes_them(
    server: Server, broker: BrokerProcess, browser: Browser, shots: Path
) -> None:
    tag = secrets.token_hex(3)
    topic, group = f"at-risk-{tag}", f"at-risk-sink-{tag}"
    broker.admin().ensure_topics({topic: 1}, configs={topic: {"retention.ms": str(RETENTION_MS), "segment.ms": "1000"}})
    produced: list[tuple[str, int, int]] = []  # (message id, offset, record timestamp) as the broker acknowledged

    def acknowledged(error: Any, message: Any) -> None:
        assert error is None, error
        produced.append((message.key().decode(), message.offset(), message.timestamp()[1]))

    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for i in range(8):
        producer.produce(topic, key=f"risk-{tag}-{i}".encode(), value=b"{}", on_delivery=acknowledged)
        producer.poll(0)
        time.sleep(0.2)
    assert producer.flush(10) == 0 and len(produced) == 8
    consumer = Consumer(consumer_config(broker, group))  # reads three, commits, goes away
    consumer.assign([TopicPartition(topic, 0, 0)])
    read = consume_all(consumer, 3)[:3]
    consumer.commit(offsets=[TopicPartition(topic, 0, read[-1].offset() + 1)], asynchronous=False)
    consumer.close()
    consumed = {m.key().decode() for m in read}
    unconsumed = [(m, offset, at) for m, offset, at in produced if m not in consumed]
    assert [offset for _, offset, _ in unconsumed] == [3, 4, 5, 6, 7]

    # the SENT traces, as the producer's wrapper would send them, in the archive the view reads
    state = state_dir(server)
    ids, offsets, stamps = zip(*produced, strict=True)
    rows = sent_rows(list(ids), list(stamps), ["-"] * len(ids), topic=topic, stream="risk.stream", attributes="{}")
    rows = [row | {"offset": offset} for row, offset in zip(rows, offsets, strict=True)]
    archive_traces(state / "archive", 5_000, rows)
    store = server.store()

    def snapshot_and_judge() -> None:
        run, snapshots = collect_snapshot(broker.connection(), {group: frozenset({topic})}, _now_ms())
        store.snapshots.write(run, snapshots)
        evaluate_cluster(store, "local", HealthConfig())

    page = browser.new_page(viewport={"width": 1500, "height": 900})
    try:
        snapshot_and_judge()
        time.sleep(1.1)
        snapshot_and_judge()
        _log_in(page, server, f"{server.base}/khipu/at-risk")
        before_ms = _now_ms()
        page.reload()
        after_ms = _now_ms()
        rows_shown = page.locator(f'table[data-testid=at-risk] tr[data-group="{group}"]')
        assert rows_shown.evaluate_all("rows => rows.map(r => r.dataset.message)") == [m for m, _, _ in unconsumed]
        lefts = [
            int(v) for v in rows_shown.locator('[data-field="time_left"]').evaluate_all("c => c.map(e => e.dataset.ms)")
        ]
        for (message_id, _, written_ms), left in zip(unconsumed, lefts, strict=True):
            assert written_ms + RETENTION_MS - after_ms <= left <= written_ms + RETENTION_MS - before_ms, message_id
        positions = rows_shown.locator('[data-field="position"]').all_inner_texts()
        assert positions == [f"{topic}[0]@{offset}" for _, offset, _ in unconsumed]
        assert all(t == "not moving" for t in rows_shown.locator("td:last-child").all_inner_texts())
        page.screenshot(path=str(shots / "at-risk.png"), full_page=True)

        # the broker really removes them before the group reads them (what a plain consumer finds in the log)
        until(lambda: not set(log_offsets(broker, topic)) & {o for _, o, _ in unconsumed}, 90, "retention removed them")
        snapshot_and_judge()
        page.reload()
        gone = page.locator(f'table[data-testid=at-risk] tr[data-group="{group}"] [data-field="time_left"]')
        assert gone.all_inner_texts() == ["gone unread"] * len(unconsumed)
    finally:
        page.close()
        store.close()
