"""Finding a message: the search box's term, the archive hours a search reads under its bound, newest first; and
a search over a real store, verdict archive and trace archive (tests/viewdata.py, tests/archived.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from khipu.reconcile.window import hour_start_ms
from khipu.registry.loader import load_registry
from khipu.report.search import (
    STORE,
    TRACE_ARCHIVE,
    VERDICT_ARCHIVE,
    ArchiveHour,
    SearchTerm,
    Sighting,
    archive_hours,
    gather,
    parse_term,
    plan_scan,
    search,
)
from khipu.report.service import ReportQueryError
from khipu.storage.location import Location
from khipu.store import Store
from khipu.trace.archive import HOUR_MS, SCHEMA, hour_folder, write_batch
from tests.archived import seed_archived
from tests.viewdata import AUDIT_READ, STREAM, seed

ROOT = Path(__file__).resolve().parents[3]
REGISTRY = load_registry(ROOT / "config" / "registry.yaml")
DECLARED = {"order_id": ("demo.bursts", "demo.orders"), "row": ("other",)}
NOW_MS = 1_795_000_000_000
H = 490_000  # an hour number (ms // HOUR_MS)


# -- the term ------------------------------------------------------------------------------------------------

TERMS = [
    # 1. a plain id is an id
    ("m-1", SearchTerm("m-1", message_id="m-1")),
    # 2. a declared attribute's name=value is an attribute search; spaces around the value go
    ("order_id= 226 ", SearchTerm("order_id= 226 ", attribute="order_id", value="226")),
    # 3. an id that is not name=value (base64 padding, a colon) stays an id
    ("YWJj==", SearchTerm("YWJj==", message_id="YWJj==")),
    # 4. id: says "this is an id" even when it looks like name=value
    ("id:order_id=226", SearchTerm("id:order_id=226", message_id="order_id=226")),
    # 5. surrounding blanks are not part of an id
    ("  m-2\t", SearchTerm("  m-2\t", message_id="m-2")),
]


@pytest.mark.parametrize(("text", "expected"), TERMS, ids=[t for t, _ in TERMS])
def test_the_search_box_takes_an_id_or_a_declared_recovery_attribute(text: str, expected: SearchTerm) -> None:
    assert parse_term(text, DECLARED) == expected


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("orderid=226", "order_id, row"),  # a typo'd attribute: the declared ones are named, and the id: way out
        ("orderid=226", "id:orderid=226"),
        ("   ", "name=value"),  # nothing to look for
    ],
)
def test_a_term_that_is_neither_is_refused_naming_what_would_do(text: str, named: str) -> None:
    with pytest.raises(ReportQueryError) as refused:
        parse_term(text, DECLARED)
    assert named in str(refused.value)


# -- the scan's bound ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanCase:
    name: str
    hours: list[tuple[int, int]]  # (hour, bytes)
    since_h: int
    until_h: int
    max_bytes: int
    read: tuple[int, ...]
    left_out: tuple[int, ...]


PLANS = [
    PlanCase("1. all fits: every hour of the range, newest first", [(H, 10), (H + 1, 10), (H + 2, 10)], H, H + 2, 100,
             (H + 2, H + 1, H), ()),
    PlanCase("2. hours outside the range are not counted", [(H - 5, 10**9), (H, 10), (H + 9, 10**9)], H, H + 1, 100,
             (H,), ()),
    PlanCase("3. the newest part that fits is read; older hours are left out", [(H, 40), (H + 1, 40), (H + 2, 40)],
             H, H + 2, 90, (H + 2, H + 1), (H,)),
    PlanCase("4. no gap: a small older hour after one that did not fit is left out too",
             [(H, 1), (H + 1, 80), (H + 2, 40)], H, H + 2, 90, (H + 2,), (H + 1, H)),
    PlanCase("5. a newest hour bigger than the bound alone: nothing read", [(H, 1), (H + 1, 500)], H, H + 1, 90,
             (), (H + 1, H)),
    PlanCase("6. a range starting inside an hour includes that hour", [(H, 10), (H + 1, 10)], H, H + 1, 100,
             (H + 1, H), ()),
    PlanCase("7. exactly the bound fits", [(H, 45), (H + 1, 45)], H, H + 1, 90, (H + 1, H), ()),
]  # fmt: skip


@pytest.mark.parametrize("case", PLANS, ids=[c.name for c in PLANS])
def test_a_search_reads_the_newest_hours_that_fit_its_bound(case: PlanCase) -> None:
    hours = [ArchiveHour(h, size) for h, size in case.hours]
    since = case.since_h * HOUR_MS + (HOUR_MS // 2 if "inside" in case.name else 0)
    plan = plan_scan(hours, since, case.until_h * HOUR_MS + 1, case.max_bytes)
    assert (plan.hours, plan.left_out) == (case.read, case.left_out)
    sizes = dict(case.hours)
    assert plan.scanned_bytes == sum(sizes[h] for h in case.read) <= case.max_bytes
    assert plan.complete == (not case.left_out)


def test_the_note_of_a_range_too_big_states_the_bound_what_was_read_and_how_to_go_on() -> None:
    plan = plan_scan([ArchiveHour(H + i, 40 * 1024**2) for i in range(5)], 0, (H + 5) * HOUR_MS, 100 * 1024**2)
    assert plan.hours == (H + 4, H + 3) and plan.left_out == (H + 2, H + 1, H)
    note = plan.note or ""
    assert "at most 100.0 MiB" in note and "5 trace-archive hours, 200.0 MiB" in note
    assert "(2 hours, 80.0 MiB)" in note and "(3 hours)" in note
    assert plan.older_until_ms == (H + 3) * HOUR_MS and "until=" in note
    nothing = plan_scan([ArchiveHour(H, 10**12)], 0, (H + 1) * HOUR_MS, 100)
    assert nothing.hours == () and "alone holds more than the bound" in (nothing.note or "")
    assert plan_scan([ArchiveHour(H, 1)], 0, (H + 1) * HOUR_MS, 100).note is None


# -- newest first ----------------------------------------------------------------------------------------------


def test_sightings_gather_per_message_newest_first_the_stores_verdict_winning() -> None:
    sightings = [
        Sighting("old", "s", 1_000, TRACE_ARCHIVE, attributes={"order_id": "1"}),
        Sighting("new", "s", 5_000, TRACE_ARCHIVE, attributes={"order_id": "1"}),
        Sighting("new", "s", 6_000, VERDICT_ARCHIVE, hop="h", verdict="DELIVERED"),
        Sighting("new", "s", 6_500, STORE, hop="h", verdict="DUPLICATE"),
        Sighting("mid", "s", 3_000, STORE, hop="h", verdict="LOST"),
    ]
    found, more = gather(sightings, limit=2)
    assert [m.message_id for m in found] == ["new", "mid"] and more
    newest = found[0]
    assert newest.verdicts == {"h": "DUPLICATE"} and newest.sources == (STORE, VERDICT_ARCHIVE, TRACE_ARCHIVE)
    assert (newest.first_ms, newest.last_ms, newest.traces, newest.attributes) == (5_000, 6_500, 1, {"order_id": "1"})
    assert gather(sightings, limit=3)[1] is False


# -- over a real store and archives ----------------------------------------------------------------------------


Archive = Path | Location


@pytest.fixture(params=["path", "location"])
def places(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Store, Archive, Archive]:
    """A store and the two archives, given to the search as folders' paths or as storage Locations (as the
    settings give them): read alike."""
    store = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    store.migrate()
    seed(store, tmp_path / "archive", REGISTRY, NOW_MS)
    if request.param == "path":
        return store, tmp_path / "archive", tmp_path / "verdicts"
    return store, Location.of(tmp_path / "archive"), Location.of(tmp_path / "verdicts")


def sent(message_id: str, at_ms: int, order_id: str, stream: str = STREAM, offset: int = 0) -> dict[str, object]:
    return {
        "message_id": message_id, "stream": stream, "location": "demo-producer", "cluster": "local", "type": "SENT",
        "timestamp_ms": at_ms, "topic": "demo.orders", "partition": 0, "offset": offset, "group": None,
        "emitter_id": "p-1", "emitter_seq": offset, "sampling_percent": 100.0,
        "attributes": json.dumps({"order_id": order_id}, separators=(",", ":")), "prev_offsets": [],
        "kafka_timestamp_ms": at_ms + 5,
    }  # fmt: skip


def archive(folder: Archive, batch: int, rows: list[dict[str, object]]) -> None:
    full = [{name: row.get(name) for name in SCHEMA.names} for row in rows]
    write_batch(folder, batch, pa.Table.from_pylist(full, schema=SCHEMA))


def test_an_id_is_found_in_the_store_the_verdict_archive_and_the_trace_archive(
    places: tuple[Store, Archive, Archive],
) -> None:
    store, traces, verdicts = places
    data = seed_archived(store, verdicts, NOW_MS)
    lost = search(store, REGISTRY, traces, verdicts, "view-skip-1", since_ms=None, until_ms=None)
    (found,) = lost.messages
    stored = {r["hop"]: r["verdict"] for r in store.verdicts.read_messages(["view-skip-1"])}
    assert found.verdicts == stored and found.verdicts[AUDIT_READ] == "LOST"
    assert found.sources == (STORE, TRACE_ARCHIVE) and found.attributes == {"order_id": "order-4711"}
    assert found.traces == 4 and lost.complete and lost.kind == "message id"

    both = search(store, REGISTRY, traces, verdicts, data.partly_lost, since_ms=None, until_ms=None)
    (found,) = both.messages
    expected = {r["hop"]: r["verdict"] for r in data.archived + data.sql if r["message_id"] == data.partly_lost}
    assert found.verdicts == expected and found.sources == (STORE, VERDICT_ARCHIVE)

    in_flight = "in-flight-1"  # no verdict yet: only its trace knows it
    archive(traces, 3, [sent(in_flight, NOW_MS - 60_000, "9")])
    (found,) = search(store, REGISTRY, traces, verdicts, in_flight, since_ms=None, until_ms=None).messages
    assert (found.sources, found.verdicts, found.stream) == ((TRACE_ARCHIVE,), {}, STREAM)
    nothing = search(store, REGISTRY, traces, verdicts, "never-1", since_ms=None, until_ms=None)
    assert nothing.messages == [] and nothing.complete


def test_an_attribute_finds_every_message_holding_it_newest_first_within_the_range(
    places: tuple[Store, Archive, Archive],
) -> None:
    store, traces, verdicts = places
    hour = NOW_MS // HOUR_MS * HOUR_MS
    rows = [
        sent("a-old", hour - 5 * HOUR_MS, "226", offset=1),
        sent("a-new", hour + 10, "226", offset=2),
        sent("a-other", hour + 20, "2260", offset=3),  # holds 226 as a substring, not as its value
        sent("a-bursts", hour + 30, "226", stream="demo.bursts", offset=4),
        sent("a-undeclared", hour + 40, "226", stream="not.declared", offset=5),  # its stream declares no order_id
    ]
    archive(traces, 5, rows)
    answer = search(store, REGISTRY, traces, verdicts, "order_id=226", since_ms=None, until_ms=None)
    assert [m.message_id for m in answer.messages] == ["a-bursts", "a-new", "a-old"]
    assert answer.kind == "recovery attribute" and answer.complete and not answer.more
    recent = search(store, REGISTRY, traces, verdicts, "order_id=226", since_ms=hour - HOUR_MS, until_ms=None)
    assert [m.message_id for m in recent.messages] == ["a-bursts", "a-new"]
    limited = search(store, REGISTRY, traces, verdicts, "order_id=226", since_ms=None, until_ms=None, limit=1)
    assert [m.message_id for m in limited.messages] == ["a-bursts"] and limited.more
    seeded = search(store, REGISTRY, traces, verdicts, "order_id=order-4711", since_ms=None, until_ms=None)
    (found,) = seeded.messages  # the seed's skipped message: its traces name it, the store holds its verdicts
    assert found.message_id == "view-skip-1" and found.verdicts[AUDIT_READ] == "LOST"


def test_a_range_holding_more_than_the_bound_is_searched_newest_first_and_says_so(
    places: tuple[Store, Archive, Archive],
) -> None:
    store, traces, verdicts = places
    hour = NOW_MS // HOUR_MS * HOUR_MS
    for i in range(4):  # four more hours, one message each
        archive(traces, 10 + i, [sent(f"h-{i}", hour - i * HOUR_MS + 1_000, "77", offset=i)])
    sizes = {h.hour: h.bytes for h in archive_hours(traces)}
    newest_two = sizes[hour // HOUR_MS] + sizes[hour // HOUR_MS - 1]
    answer = search(
        store, REGISTRY, traces, verdicts, "order_id=77", since_ms=None, until_ms=None,
        max_scan_bytes=newest_two,
    )  # fmt: skip
    assert [m.message_id for m in answer.messages] == ["h-0", "h-1"]
    assert not answer.complete and answer.hours_searched == 2 and answer.bytes_searched == newest_two
    assert answer.older_until_ms == hour - HOUR_MS and "not searched" in answer.notes[0]
    older = search(
        store, REGISTRY, traces, verdicts, "order_id=77", since_ms=None, until_ms=answer.older_until_ms,
        max_scan_bytes=newest_two,
    )  # fmt: skip
    assert [m.message_id for m in older.messages] == ["h-2", "h-3"]


def test_an_hours_size_is_its_parquet_files_not_a_write_in_progress_nor_bookkeeping(
    places: tuple[Store, Archive, Archive],
) -> None:
    _, traces, _ = places
    hour = NOW_MS // HOUR_MS * HOUR_MS
    archive(traces, 20, [sent("s-1", hour - 2 * HOUR_MS + 5, "1"), sent("s-2", hour + 5, "2", offset=1)])
    folder = Path(str(traces))
    in_progress = folder / hour_folder(hour) / "batch_id=21"
    in_progress.mkdir()
    (in_progress / ".part-0.parquet.0123.tmp").write_bytes(b"x" * 999)  # a write not finished
    (folder / hour_folder(hour) / "_marker.parquet").write_bytes(b"x" * 77)  # bookkeeping, not data
    on_disk: dict[int, int] = {}  # what the writers left: each hour's part files, by their size on disk
    for part in folder.glob("hour=*/batch_id=*/part-0.parquet"):
        start = hour_start_ms(part.parent.parent.name.removeprefix("hour="))
        on_disk[start // HOUR_MS] = on_disk.get(start // HOUR_MS, 0) + part.stat().st_size
    assert len(on_disk) == 3  # the seed's hour and the two written here
    assert {h.hour: h.bytes for h in archive_hours(traces)} == on_disk


def test_a_reversed_range_or_a_limit_out_of_bounds_is_refused(places: tuple[Store, Archive, Archive]) -> None:
    store, traces, verdicts = places
    with pytest.raises(ReportQueryError, match="a time after since"):
        search(store, REGISTRY, traces, verdicts, "m", since_ms=NOW_MS, until_ms=NOW_MS - 1)
    with pytest.raises(ReportQueryError, match="1 to 500 messages"):
        search(store, REGISTRY, traces, verdicts, "m", since_ms=None, until_ms=None, limit=501)
