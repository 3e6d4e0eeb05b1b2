"""One message laid out along its route; the page cursor; the archive reader."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from khipu.reconcile.window import changes_for
from khipu.registry.loader import load_registry
from khipu.report.message import lay_out
from khipu.report.service import ReportQueryError, decode_cursor, encode_cursor, message_report
from khipu.store import Store
from khipu.trace.archive import HOUR_MS, ArchivedTrace, hour_folder, read_traces
from khipu.verdicts.book import VerdictBook
from khipu.verdicts.model import Cause, Verdict, VerdictKind

ROOT = Path(__file__).resolve().parents[3]
STREAM = load_registry(ROOT / "config" / "registry.yaml").stream("demo.orders")


def trace(kind: str, location: str, topic: str, group: str | None, at: int, **attributes: str) -> ArchivedTrace:
    return ArchivedTrace(
        "m1", "demo.orders", kind, location, "local", topic, 0, 7, group, at, f"{location}-e", at, dict(attributes)
    )


def test_every_route_hop_in_order_with_its_traces_verdict_and_history_then_hops_off_the_route() -> None:
    traces = [
        trace("SENT", "demo-producer", "demo.orders", None, 1, order_id="9"),
        trace("RECEIVED", "demo-enricher", "demo.orders", "demo-enricher", 2),
        trace("RECEIVED", "stray", "demo.orders", "stray-group", 3),
    ]
    verdicts = [{"hop": "demo-producer -> local/demo.orders", "hop_kind": "write", "verdict": "DELIVERED"}]
    history = [{"hop": "demo-producer -> local/demo.orders", "at_ms": 5, "to_verdict": "DELIVERED"}]
    report = lay_out("m1", STREAM, verdicts, history, traces)
    route = [hop.id for hop in STREAM.route.hops]
    assert [hop.hop for hop in report.hops] == [*route, "local/demo.orders -> stray-group"]
    assert [hop.on_route for hop in report.hops] == [True] * len(route) + [False]
    first = report.hops[0]
    assert (first.verdict or {}).get("verdict") == "DELIVERED" and [t.type for t in first.traces] == ["SENT"]
    assert [h["to_verdict"] for h in first.history] == ["DELIVERED"]
    assert report.hops[1].verdict is None and [t.group for t in report.hops[1].traces] == ["demo-enricher"]
    assert report.attributes == {"order_id": "9"} and report.found


def test_a_hop_past_a_loss_says_where_the_message_was_lost_instead_of_no_verdict_yet() -> None:
    """demo-producer -> demo.orders -> demo-enricher -> demo.orders-enriched -> (demo-sink-store, demo-sink-audit)."""
    enrich, into_enriched = "local/demo.orders -> demo-enricher", "demo-enricher -> local/demo.orders-enriched"
    store, audit = "local/demo.orders-enriched -> demo-sink-store", "local/demo.orders-enriched -> demo-sink-audit"
    dropped = [
        {"hop": "demo-producer -> local/demo.orders", "verdict": "DELIVERED"},
        {"hop": enrich, "verdict": "DELIVERED"},
        {"hop": into_enriched, "verdict": "LOST"},
    ]
    said = {hop.hop: hop.not_reached for hop in lay_out("m1", STREAM, dropped, [], []).hops}
    assert said[store] == said[audit] == f"not reached: lost at {into_enriched}"
    assert said[enrich] is None  # it has a verdict
    aborted = [{"hop": "demo-producer -> local/demo.orders", "verdict": "ABORTED"}]
    said = {hop.hop: hop.not_reached for hop in lay_out("m1", STREAM, aborted, [], []).hops}
    assert said[store] == "not reached: aborted at demo-producer -> local/demo.orders"  # through hops with none
    on_its_way = [{"hop": "demo-producer -> local/demo.orders", "verdict": "DELIVERED"}]
    assert {hop.not_reached for hop in lay_out("m1", STREAM, on_its_way, [], []).hops} == {None}  # still going


def test_nothing_known_is_not_found() -> None:
    assert not lay_out("m1", STREAM, [], [], []).found


def test_a_cursor_round_trips_and_anything_else_is_refused() -> None:
    row = {"decided_ms": 123, "message_id": "a/b c", "hop": "x -> y"}
    assert decode_cursor(encode_cursor(row)) == (123, "a/b c", "x -> y")
    assert decode_cursor(None) is None
    too_far = base64.urlsafe_b64encode(json.dumps([10**30, "m", "h"]).encode()).decode()
    for bad in ("%%%", "bm90IGpzb24", too_far):
        with pytest.raises(ReportQueryError, match="next_cursor of a previous page"):
            decode_cursor(bad)


def test_the_archive_reader_reads_only_the_asked_hours_and_drops_replayed_duplicates(tmp_path: Path) -> None:
    columns = ("message_id", "stream", "type", "location", "cluster", "topic", "partition", "offset", "group")
    rows = [
        dict(zip(columns, ("m1", "s", "SENT", "p", "local", "t", 0, 1, None), strict=True)),
        dict(zip(columns, ("m2", "s", "SENT", "p", "local", "t", 0, 2, None), strict=True)),
    ]
    for batch, hour in ((0, 5), (1, 5), (2, 9)):  # batch 1 replays batch 0's traces; hour 9 is outside
        folder = tmp_path / hour_folder(hour * HOUR_MS) / f"batch_id={batch}"
        folder.mkdir(parents=True)
        table = [
            {
                **r,
                "timestamp_ms": hour * HOUR_MS + i,
                "emitter_id": "e",
                "emitter_seq": 10 * hour + i,
                "attributes": '{"k":"v"}',
            }
            for i, r in enumerate(rows)
        ]
        pq.write_table(pa.Table.from_pylist(table), folder / "part-0.parquet")
    found = read_traces(tmp_path, ["m1"], 4 * HOUR_MS, 6 * HOUR_MS)
    assert [(t.message_id, t.timestamp_ms, t.attributes) for t in found] == [("m1", 5 * HOUR_MS, {"k": "v"})]
    assert read_traces(tmp_path / "missing", ["m1"], 0, 10 * HOUR_MS) == []
    assert [t.timestamp_ms for t in read_traces(tmp_path, ["m1"], 0, 10 * HOUR_MS)] == [5 * HOUR_MS, 9 * HOUR_MS]


def test_each_hop_says_one_time_for_each_decision_the_judgements_not_the_writers(tmp_path: Path) -> None:
    """The detector judges a batch on its executors at ``decided_ms``; its writer stores the batch seconds later and
    stamped the history's first line with its own clock (09:44:16 against 09:44:19 in issue 38). Reconciliation
    confirms the loss an hour on; the verdict keeps its first minute (its metrics') and the history the change."""
    store = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    store.migrate()
    book = VerdictBook(store.verdicts)
    hop = STREAM.route.hops[-1]
    judged_ms, written_ms, reconciled_ms = 1_795_000_000_000, 1_795_000_003_000, 1_795_003_600_000

    def lost(at_ms: int, by: str) -> Verdict:
        return Verdict(
            message_id="m1", stream=STREAM.name, hop=hop.id, hop_kind=hop.kind.value, kind=VerdictKind.LOST,
            cause=Cause.SKIPPED_BY_CONSUMER, count=0, topic=hop.topic.topic, partition=0, offset=7, group=hop.group,
            location=None, observed_ms=None, latency_ms=None, e2e_latency_ms=None, decided_ms=at_ms,
            detail="skipped", first_seen_ms=at_ms - 5_000, decided_by=by,
        )  # fmt: skip

    book.record([lost(judged_ms, "detector")], written_ms)  # as the detector's writer does
    stored = book.stored_verdicts(["m1"])["m1"]
    book.apply(changes_for(stored, [lost(reconciled_ms, "reconciliation")]), reconciled_ms)  # as reconciliation does
    report = message_report(store, load_registry(ROOT / "config" / "registry.yaml"), None, "m1", reconciled_ms)
    (line,) = [h for h in report.hops if h.verdict is not None]
    assert [(c["to_verdict"], c["at_ms"]) for c in line.history] == [
        ("LOST", judged_ms),  # when the detector judged it, as the verdict's decided_ms says
        ("CONFIRMED_LOST", reconciled_ms),
    ]
    assert (line.verdict or {})["verdict"] == "CONFIRMED_LOST" and line.decided_ms == reconciled_ms
    assert line.first_decided_ms == judged_ms
    store.close()
