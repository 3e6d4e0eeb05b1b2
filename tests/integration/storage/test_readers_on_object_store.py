"""Every reader of Khipu's archives reads them in an object store (S3Proxy: a real S3 API) as in a local folder.

Each test runs twice: with the archives in a local folder, and under a prefix of the session's S3Proxy bucket
(``s3a://khipu/readers-<random>/…``), reached as a deployment reaches it (KHIPU_S3_ENDPOINT and the AWS
credentials in the environment). The archives are written by Khipu's own writers
(:func:`khipu.trace.archive.write_batch`, :meth:`VerdictArchive.write_batch` and its index); what every reader
returns is checked against what the test wrote: search (by id, by recovery attribute, the hours' sizes), the
at-risk scan of SENT traces, a message's report, the health page's storage, retention (the hours it removes,
exactly, and what it keeps) and a resend (its source from the verdict archive, its hook's attributes from the
trace archive). Sizes are checked against the same batches written to a local folder, measured on disk.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

from khipu.localstack.broker import BrokerProcess
from khipu.offsets.model import PartitionKey
from khipu.registry.loader import load_registry
from khipu.report.at_risk import Backlog, scan_sent
from khipu.report.exporter import KhipuCollector
from khipu.report.search import TRACE_ARCHIVE, VERDICT_ARCHIVE, archive_hours, search
from khipu.report.service import message_report
from khipu.resend.run import Resender, ResendSelection
from khipu.retention.policy import RetentionPolicy, plan_retention
from khipu.retention.run import run_retention
from khipu.storage.location import Location
from khipu.store import Store
from khipu.trace import archive
from khipu.trace.archive import HOUR_MS, hour_folder, hour_of
from khipu.verdicts.archive import VerdictArchive, verdict_table
from khipu.verdicts.book import verdict_row
from khipu.verdicts.metrics import metrics_of
from khipu.verdicts.model import Cause, Verdict, VerdictKind
from khipu_airflow.view.app import ViewSources, create_app
from tests.integration.resend.pipeline import NOW as RESEND_NOW
from tests.integration.resend.pipeline import Pipeline, message_id_of, registry, resent_copies
from tests.viewdata import ENRICH_READ, ENRICH_WRITE, PRODUCE, STREAM, verdict

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
REGISTRY = load_registry(ROOT / "config" / "registry.yaml")  # demo.orders declares the attribute order_id
HOUR = 1_796_000_000_000 // HOUR_MS * HOUR_MS  # the hour "now" is in
NOW_MS = HOUR + 30 * 60_000
AGES_H = (1, 5, 30, 50, 80, 100)  # hours back from HOUR: one batch of three messages each, in both archives
SHARED = "o-shared"  # the order id of m1-0 and m30-0: a search for it finds both, newest first
PINNED = "m100-0"  # a confirmed loss still waiting for its resend: retention keeps its traces and verdicts
LIMITS = {  # a 60 s horizon reaches 3 h back; + 24 backfill hours = 27 <= 48 (as the retention DAG's test)
    "trace_archive_hours": 48, "verdict_archive_hours": 72, "verdict_days": 5, "quarantine_days": 2,
    "heartbeat_days": 1, "minute_metrics_days": 2, "metrics_days": 8, "backfill_hours": 24,
}  # fmt: skip


@dataclass
class Written:
    """The archives (where this run of the test keeps them) and what the test wrote there."""

    traces: Location
    verdicts: Location
    store: Store
    trace_rows: list[dict[str, Any]]
    verdict_rows: list[dict[str, Any]]
    reference: Path  # the same batches written to a local folder: the sizes on disk a reader must find


@pytest.fixture(params=["local folder", "object store"])
def place(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Location:
    """Where this run keeps its archives: a local folder, or a fresh prefix of the session's S3Proxy bucket."""
    if request.param == "local folder":
        return Location.of(tmp_path / "data")
    store = request.getfixturevalue("object_store")
    for name, value in store.environment().items():
        monkeypatch.setenv(name, value)
    return Location.of(f"s3a://{store.bucket}/readers-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def written(place: Location, tmp_path: Path) -> Iterator[Written]:
    store = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    store.migrate()
    traces, verdicts = place / "archive", place / "verdicts"
    reference = tmp_path / "reference"
    trace_rows: list[dict[str, Any]] = []
    verdict_rows: list[dict[str, Any]] = []
    with VerdictArchive(verdicts, store) as verdict_archive, VerdictArchive(reference / "verdicts", store) as copy:
        for batch, age in enumerate(AGES_H):
            rows = traces_of(age, offset=10 * batch)
            decided = [
                verdict(t["message_id"], hop, "DELIVERED", t["timestamp_ms"] + 3_000,
                        offset=t["offset"], first_seen_ms=t["timestamp_ms"])
                for t in rows if t["type"] == "SENT" for hop in (PRODUCE, ENRICH_READ)
            ]  # fmt: skip
            table = pa.Table.from_pylist(rows, schema=archive.SCHEMA)
            archive.write_batch(traces, batch, table)
            archive.write_batch(reference / "archive", batch, table)
            verdict_archive.write_batch(batch, verdict_table(decided))
            copy.write_batch(batch, verdict_table(decided))  # files only: the index is the archive's under test
            verdict_archive.index.record(
                batch, {(r["message_id"], r["first_seen_ms"], hour_of(r["decided_ms"])) for r in decided}
            )
            trace_rows += rows
            verdict_rows += decided
    pinned_at = HOUR - 100 * HOUR_MS + 600_000
    store.verdicts.upsert([verdict(PINNED, ENRICH_WRITE, "CONFIRMED_LOST", pinned_at + 5_000, first_seen_ms=pinned_at)])
    yield Written(traces, verdicts, store, trace_rows, verdict_rows, reference)
    store.close()


def traces_of(age_h: int, offset: int) -> list[dict[str, Any]]:
    """Three messages of demo.orders, ``age_h`` hours back: each SENT by demo-producer at its offset and RECEIVED
    by demo-enricher, with its order id."""
    at = HOUR - age_h * HOUR_MS + 600_000
    rows = []
    for i in range(3):
        order = SHARED if age_h in (1, 30) and i == 0 else f"o-{age_h}-{i}"
        base = dict.fromkeys(archive.SCHEMA.names) | {
            "message_id": f"m{age_h}-{i}", "stream": STREAM, "cluster": "local", "topic": "demo.orders",
            "partition": 0, "offset": offset + i, "sampling_percent": 100.0, "emitter_seq": offset + i,
            "attributes": json.dumps({"order_id": order}),
        }  # fmt: skip
        sent_ms, received_ms = at + 10 * i, at + 10 * i + 200
        rows.append(base | {"type": "SENT", "location": "demo-producer", "emitter_id": "producer-e1",
                            "timestamp_ms": sent_ms, "kafka_timestamp_ms": sent_ms + 5})  # fmt: skip
        rows.append(base | {"type": "RECEIVED", "location": "demo-enricher", "group": "demo-enricher",
                            "emitter_id": "enricher-e1", "timestamp_ms": received_ms,
                            "kafka_timestamp_ms": received_ms + 5})  # fmt: skip
    return rows


def on_disk(folder: Path, pattern: str = "**/*") -> int:
    """The bytes of the files under a local folder, as the file system measures them."""
    return sum(f.stat().st_size for f in folder.glob(pattern) if f.is_file())


def hour_number(age_h: int) -> int:
    return (HOUR - age_h * HOUR_MS) // HOUR_MS


# -- search, at-risk, a message's report ---------------------------------------------------------------------


def test_search_finds_a_message_by_id_and_by_attribute_and_sizes_each_hour(written: Written) -> None:
    w = written
    sizes = {h.hour: h.bytes for h in archive_hours(w.traces)}
    assert sizes == {
        hour_number(age): on_disk(w.reference / "archive" / hour_folder(hour_number(age) * HOUR_MS), "*/part-0.parquet")
        for age in AGES_H
    }  # every hour written, each its Parquet files' bytes (the same files measured on a local disk)
    assert all(sizes.values())

    by_id = search(w.store, REGISTRY, w.traces, w.verdicts, "m5-1", since_ms=None, until_ms=None)
    (found,) = by_id.messages
    assert set(found.sources) == {VERDICT_ARCHIVE, TRACE_ARCHIVE} and by_id.complete
    assert found.verdicts == {r["hop"]: r["verdict"] for r in w.verdict_rows if r["message_id"] == "m5-1"}
    assert found.traces == sum(1 for t in w.trace_rows if t["message_id"] == "m5-1") == 2
    assert found.attributes == {"order_id": "o-5-1"}

    shared = search(w.store, REGISTRY, w.traces, w.verdicts, f"order_id={SHARED}", since_ms=None, until_ms=None)
    holding = sorted(
        {t["message_id"]: t["timestamp_ms"] for t in w.trace_rows if SHARED in t["attributes"]}.items(),
        key=lambda item: -item[1],
    )
    assert [m.message_id for m in shared.messages] == [m for m, _ in holding] == ["m1-0", "m30-0"]


def test_the_at_risk_scan_reads_the_sent_traces_of_a_backlogs_unconsumed_offsets(written: Written) -> None:
    w = written
    backlog = Backlog(
        PartitionKey("local", "demo-enricher", "demo.orders", 0), committed=12, log_start=0, log_end=31,
        retention_ms=7 * 24 * HOUR_MS, observed_ms=NOW_MS, pace_per_ms=0.0,
    )  # fmt: skip
    found = scan_sent(w.traces, [hour_number(age) for age in AGES_H], [backlog])
    expected = sorted(
        (t["message_id"], t["offset"], t["timestamp_ms"])
        for t in w.trace_rows
        if t["type"] == "SENT" and 12 <= t["offset"] < 31
    )
    assert sorted((r.message_id, r.offset, r.timestamp_ms) for r in found) == expected
    assert {m for m, _, _ in expected} == {"m5-2", "m30-0", "m30-1", "m30-2", "m50-0"}  # the offsets 12..30


def test_a_messages_report_shows_its_archived_verdicts_and_traces_per_hop(written: Written) -> None:
    w = written
    report = message_report(w.store, REGISTRY, w.traces, "m30-2", NOW_MS, w.verdicts)
    verdicts = {h.hop: h.verdict["verdict"] for h in report.hops if h.verdict is not None}
    assert verdicts == {r["hop"]: r["verdict"] for r in w.verdict_rows if r["message_id"] == "m30-2"}
    traces = {h.hop: len(h.traces) for h in report.hops if h.traces}
    assert traces == {PRODUCE: 1, ENRICH_READ: 1}  # its SENT and its RECEIVED, as written
    assert report.stream == STREAM and report.attributes == {"order_id": "o-30-2"} and report.verdicts_note is None


def test_the_health_page_and_api_show_each_archives_storage_and_the_view_searches_it(written: Written) -> None:
    w = written
    view_store = Store(w.store.url)

    async def anyone(_request: Any) -> str:
        return "tester"

    sources = ViewSources(lambda: view_store, lambda: REGISTRY, w.traces, "local", lambda: NOW_MS, w.verdicts)
    client = TestClient(create_app(sources, anyone, lambda next_url: next_url))
    storage = client.get("/api/v1/health/khipu").json()["storage"]
    shown = {a["name"]: a for a in storage["archives"]}
    for name, location, folder in (("trace archive", w.traces, "archive"), ("verdict archive", w.verdicts, "verdicts")):
        assert shown[name]["bytes"] == on_disk(w.reference / folder)  # every file: its commit record too
        assert (shown[name]["path"], shown[name]["local"]) == (str(location), location.is_local)
    assert shown["trace archive"]["hours"] == len(AGES_H) and shown["trace archive"]["oldest_hour"] == hour_of(
        HOUR - 100 * HOUR_MS
    )
    page = client.get("/self").text
    if w.traces.is_local:
        assert storage["disk"]["total_bytes"] > 0 and storage["disk_note"] is None and "% free" in page
    else:
        assert storage["disk"] is None and "% free" not in page
        assert w.traces.url in storage["disk_note"] and "in an object store, on no local disk" in page
    found = client.get("/api/v1/search", params={"q": f"order_id={SHARED}"}).json()
    assert [m["message_id"] for m in found["messages"]] == ["m1-0", "m30-0"]
    view_store.close()


def test_the_exporter_serves_each_archives_bytes_and_a_disk_only_for_a_local_one(
    written: Written, caplog: pytest.LogCaptureFixture
) -> None:
    w = written
    caplog.set_level(logging.INFO, logger="khipu.report.exporter")
    archives = {"trace archive": w.traces, "verdict archive": w.verdicts}
    collector = KhipuCollector(lambda: Store(w.store.url), "local", lambda: NOW_MS, archives=archives)
    found = {(f.name, tuple(s.labels.values())): s.value for f in collector.collect() for s in f.samples}
    for label, folder in (("trace_archive", "archive"), ("verdict_archive", "verdicts")):
        assert found[("khipu_archive_bytes", (label,))] == on_disk(w.reference / folder)
        assert found[("khipu_archive_hours", (label,))] == len(AGES_H)
        assert found[("khipu_archive_local", (label,))] == int(w.traces.is_local)
    disk_gauges = {name for name, _ in found if name.startswith("khipu_state_disk_")}
    if w.traces.is_local:
        assert disk_gauges == {"khipu_state_disk_free_bytes", "khipu_state_disk_size_bytes", "khipu_state_disk_low"}
    else:  # no local disk holds them: no disk figure, and the exporter's log says why
        assert disk_gauges == set()
        assert f"the trace archive ({w.traces.url}) and the verdict archive ({w.verdicts.url})" in caplog.text
        assert "in an object store, on no local disk" in caplog.text


# -- retention ---------------------------------------------------------------------------------------------------


def test_retention_removes_exactly_the_hours_past_its_limits_and_keeps_the_newer_and_the_pinned(
    written: Written,
) -> None:
    w = written
    plan = plan_retention(RetentionPolicy(**LIMITS), NOW_MS, 60_000)
    dry = run_retention(w.store, w.traces, w.verdicts, REGISTRY, plan, metrics_of, dry_run=True, progress=print)
    assert archive_hours(w.traces) and len(archive_hours(w.traces)) == len(AGES_H)  # the dry run removed nothing
    done = run_retention(w.store, w.traces, w.verdicts, REGISTRY, plan, metrics_of, progress=print)

    hours = {age: hour_of(HOUR - age * HOUR_MS) for age in AGES_H}
    kept_traces = sorted(hours[age] for age in AGES_H if age <= LIMITS["trace_archive_hours"] or age == 100)
    assert [hour_of(h.hour * HOUR_MS) for h in sorted(archive_hours(w.traces), key=lambda h: h.hour)] == kept_traces
    young = [t for t in w.trace_rows if int(t["message_id"][1:].split("-")[0]) <= LIMITS["trace_archive_hours"]]
    expected = sorted(
        (t["message_id"], t["type"]) for t in [*young, *(t for t in w.trace_rows if t["message_id"] == PINNED)]
    )
    every_id = {t["message_id"] for t in w.trace_rows}
    left = archive.read_traces_in_hours(w.traces, every_id, [hour_number(age) for age in AGES_H])
    assert sorted((t.message_id, t.type) for t in left) == expected  # the newer hours whole, of 100 h the pinned
    with VerdictArchive(w.verdicts, w.store) as verdicts:
        assert verdicts.hours() == sorted(hours[age] for age in AGES_H if age <= LIMITS["verdict_archive_hours"])
    copied = {(r["hop"], r["verdict"]) for r in w.store.verdicts.read_messages([PINNED]) if r["verdict"] == "DELIVERED"}
    assert copied == {(r["hop"], r["verdict"]) for r in w.verdict_rows if r["message_id"] == PINNED}

    assert dry.removed == done.removed  # a dry run's counts and sizes are the run's
    assert done.removed["trace_archive_hours"] == 2 and done.removed["verdict_archive_hours"] == 2
    ref = w.reference
    kept_file = w.traces / hour_folder(HOUR - 100 * HOUR_MS) / "batch_id=-1" / "part-0.parquet"
    assert done.removed["trace_archive_bytes"] == (
        sum(on_disk(ref / "archive" / hour_folder(HOUR - age * HOUR_MS)) for age in (50, 80, 100))
        - kept_file.info().size
    )
    assert done.removed["verdict_archive_bytes"] == sum(
        on_disk(ref / "verdicts" / hour_folder(HOUR - age * HOUR_MS)) for age in (80, 100)
    )
    again = run_retention(w.store, w.traces, w.verdicts, REGISTRY, plan, metrics_of, progress=print)
    assert (again.removed["trace_archive_hours"], again.removed["verdict_archive_hours"]) == (0, 0)


# -- resend -----------------------------------------------------------------------------------------------------


def test_a_resend_takes_its_source_from_the_verdict_archive_and_its_hooks_attributes_from_the_trace_archive(
    place: Location, broker: BrokerProcess, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:6]
    inp, out = f"in-{suffix}", f"out-{suffix}"
    broker.admin().ensure_topics({inp: 1, out: 2})
    store = Store(f"sqlite:///{tmp_path / 'resend.db'}")
    store.migrate()
    hook = "tests.integration.resend.hooks:order_from_database"
    pipeline = Pipeline(broker, store, registry(inp, out, hook=hook), inp, out)
    hops = pipeline.hops
    traces, verdicts = place / "archive", place / "verdicts"

    # m-drop: proc read it (its DELIVERED is archived, not in the store) and wrote nothing on
    at_in = pipeline.write(inp, 0, "m-drop", b"order-1")
    read = archived_read("m-drop", hops["read_in"], inp, at_in)
    with VerdictArchive(verdicts, store) as verdict_archive:
        verdict_archive.write_batch(3, verdict_table([read]))
        verdict_archive.index.record(3, [("m-drop", read["first_seen_ms"], hour_of(read["decided_ms"]))])
    pipeline.verdict("m-drop", hops["write_out"], VerdictKind.CONFIRMED_LOST, cause=Cause.DROPPED_IN_PROCESSOR)
    # m-h: its record left the log; its order id is known only from its trace
    at = pipeline.write(out, 1, "m-h", b"m-h")
    broker.admin().delete_records({(out, 1): at + 1})
    pipeline.verdict("m-h", hops["s1"], VerdictKind.CONFIRMED_LOST, cause=Cause.TRUNCATED, partition=1, offset=at)
    sent = dict.fromkeys(archive.SCHEMA.names) | {
        "message_id": "m-h", "stream": "orders", "type": "SENT", "location": "proc", "cluster": "local",
        "topic": out, "partition": 1, "offset": at, "timestamp_ms": RESEND_NOW - 3_650_000, "emitter_id": "proc-e1",
        "emitter_seq": 1, "attributes": json.dumps({"order_id": "o-77"}), "kafka_timestamp_ms": RESEND_NOW - 3_650_000,
    }  # fmt: skip
    archive.write_batch(traces, 3, pa.Table.from_pylist([sent], schema=archive.SCHEMA))

    def resender() -> Resender:
        connections = {"local": broker.connection()}
        return Resender(store, pipeline.registry, connections, lambda: RESEND_NOW, traces, verdict_archive_dir=verdicts)

    dry = {o.message_id: o for o in resender().run(ResendSelection(dry_run=True)).outcomes}
    assert dry["m-drop"].source == f"local/{inp}[0]@{at_in}"  # the position only the archived DELIVERED names
    run = resender().run(ResendSelection())
    assert run.counts() == {"produced": 2}, run.as_dict()
    copies = {message_id_of(m): m.value() for m in resent_copies(pipeline)}
    assert copies == {"m-drop": b"order-1", "m-h": json.dumps({"order_id": "o-77", "rebuilt_for": "m-h"}).encode()}
    store.close()


def archived_read(message_id: str, hop: str, topic: str, offset: int) -> dict[str, Any]:
    """The read hop's DELIVERED as the detector archives it (a plain first-time DELIVERED)."""
    return verdict_row(
        Verdict(
            message_id=message_id, stream="orders", hop=hop, hop_kind="read", kind=VerdictKind.DELIVERED, cause=None,
            count=1, topic=topic, partition=0, offset=offset, group=hop.split(" -> ")[1], location=None,
            observed_ms=RESEND_NOW - 3_600_500, latency_ms=40, e2e_latency_ms=None, decided_ms=RESEND_NOW - 3_600_000,
            detail="delivered", first_seen_ms=RESEND_NOW - 3_700_000, decided_by="detector",
        )
    )  # fmt: skip
