"""The verdict archive's index of decided messages, kept in the store (``store.decided``, reached through
khipu.verdicts.archive.DecidedIndex) on SQLite and PostgreSQL: a batch recorded once however often it is replayed,
found in one call, forgotten, pruned by its newest hour; and the SQLite file of the release before brought in once,
whichever process finds it first."""

from __future__ import annotations

import shutil
import sqlite3
import threading
from contextlib import closing
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError

from khipu.store import Store, schema
from khipu.trace.archive import HOUR_MS, hour_of
from khipu.verdicts.archive import DecidedIndex, Decision, VerdictArchive, VerdictArchiveError

pytestmark = pytest.mark.integration

T0 = 1_795_000_000_000 // HOUR_MS * HOUR_MS  # an hour boundary
# ids a COPY stream or a JSON array must carry as they are: CSV's quote, separator and line ends, JSON's escapes
AWKWARD_IDS = ['m,"quoted"', "back\\slash", "new\nline", "tab\there", "\\N", "ünïcødé ✓", ""]


def test_the_index_records_finds_replaces_forgets_and_prunes(store: Store) -> None:
    index = DecidedIndex(store)
    assert index.find(["m1"]) == {} and index.count() == 0
    assert index.record(1, [("m1", 100, hour_of(T0)), ("m2", 100, hour_of(T0))]) == 2
    assert index.record(2, [("m1", 900, hour_of(T0 + HOUR_MS))]) == 1  # seen again, by a fresh state
    assert index.record(1, [("m1", 100, hour_of(T0))]) == 1  # batch 1 replayed without m2
    assert index.count() == 2
    assert index.find(["m1", "m2", "m3"]) == {
        "m1": [Decision(1, 100, hour_of(T0)), Decision(2, 900, hour_of(T0 + HOUR_MS))]
    }
    assert index.forget_batch(2) == 1 and index.find(["m1"]) == {"m1": [Decision(1, 100, hour_of(T0))]}
    assert index.forget_batch(2) == 0
    index.record(3, [("m4", None, hour_of(T0 + 2 * HOUR_MS))])
    index.record(4, [("m5", 7, hour_of(T0)), ("m6", 7, hour_of(T0 + HOUR_MS))])  # a batch across an hour's end
    assert index.prune(T0 + HOUR_MS) == 1  # the hour before T0 + 1 h ended: batch 1's row goes, batch 4's stay
    assert index.find(["m1", "m4", "m5"]) == {
        "m4": [Decision(3, None, hour_of(T0 + 2 * HOUR_MS))],
        "m5": [Decision(4, 7, hour_of(T0))],
    }
    assert index.prune(T0 + 2 * HOUR_MS) == 2 and index.count() == 1  # batch 4's newest hour has ended now
    with pytest.raises(VerdictArchiveError, match="'hour': got '2026-11-23T10'; expected an archive hour"):
        index.record(5, [("m7", 1, hour_of(T0)), ("m8", 1, "2026-11-23T10")])
    assert index.find(["m7"]) == {} and index.count() == 1  # nothing of the refused batch


def test_a_25000_message_batch_among_200000_rows_goes_in_and_is_found_in_one_call_each(store: Store) -> None:
    index = DecidedIndex(store)
    for batch in range(8):  # 200,000 rows held
        assert index.record(batch, [(f"m-{batch}-{n}", T0, hour_of(T0)) for n in range(25_000)]) == 25_000
    ids = [*AWKWARD_IDS, *(f"m-9-{n}" for n in range(25_000 - len(AWKWARD_IDS)))]
    unknown = [f"m-{n}-never" for n in range(12_500)]
    rows = [(m, None if n % 2 else T0 + n, hour_of(T0 + HOUR_MS)) for n, m in enumerate(ids)]
    assert index.record(9, rows) == 25_000
    assert index.record(9, rows) == 25_000  # replayed: the same rows, once
    assert index.count() == 225_000
    found = index.find(ids[:12_500] + [f"m-3-{n}" for n in range(12_500)] + unknown)
    assert len(found) == 25_000
    assert [found[m] for m in AWKWARD_IDS] == [
        [Decision(9, None if n % 2 else T0 + n, hour_of(T0 + HOUR_MS))] for n in range(len(AWKWARD_IDS))
    ]
    assert found["m-3-7"] == [Decision(3, T0, hour_of(T0))]
    assert not set(found) & set(unknown)


@pytest.mark.parametrize("store", ["postgresql"], indirect=True)  # SQLite keeps a NUL; PostgreSQL's text cannot
def test_a_replay_the_database_refuses_leaves_the_batch_as_first_recorded(store: Store) -> None:
    """The batch's rows are deleted and written again in one transaction, COPY included: a replay refused halfway
    (a NUL in a message id, which PostgreSQL's text cannot hold) leaves what the first run recorded."""
    index = DecidedIndex(store)
    first = [(f"m{n}", T0, hour_of(T0)) for n in range(1_000)]
    index.record(7, first)
    with pytest.raises(DBAPIError, match="0x00"):
        index.record(7, [*first[:10], ("nul\x00id", T0, hour_of(T0 + HOUR_MS))])
    assert index.count() == 1_000
    assert index.find(["m3", "m999"]) == {m: [Decision(7, T0, hour_of(T0))] for m in ("m3", "m999")}
    assert index.prune(T0 + HOUR_MS) == 1_000  # its batch entry too was left as it was: its newest hour, T0


# -- the index file of the release before ---------------------------------------------------------------------------

# The release before's index (include/khipu/verdicts/archive.py at 1e96a77, _create_tables), as it made its file.
PREVIOUS_TABLES = (
    "PRAGMA journal_mode = WAL",
    "CREATE TABLE IF NOT EXISTS decided (message_id TEXT NOT NULL, batch_id INTEGER NOT NULL, "
    "first_seen_ms INTEGER, hour TEXT NOT NULL, PRIMARY KEY (message_id, batch_id)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS decided_batch ON decided (batch_id)",
    "CREATE TABLE IF NOT EXISTS batches (batch_id INTEGER PRIMARY KEY, last_hour TEXT NOT NULL)",
)
PREVIOUS_BATCHES = {  # batch -> its rows (message id, first_seen_ms, hour): one across an hour's end
    11: [("a", 100, hour_of(T0)), ("b", None, hour_of(T0))],
    12: [("a", 900, hour_of(T0 + HOUR_MS)), ("c", 900, hour_of(T0)), ("d", 900, hour_of(T0 + HOUR_MS))],
    13: [(f"e{n}", 5, hour_of(T0 + 2 * HOUR_MS)) for n in range(3_000)],
}


def write_previous_index(path: Path, batches: dict[int, list[tuple[str, int | None, str]]], scratch: Path) -> int:
    """The file the release before left beside a verdict archive, as its writer was killed (the last batch only in
    the write-ahead log, not yet folded into the file); returns its rows. Written in ``scratch``, then copied."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(parents=True, exist_ok=True)
    live = scratch / path.name
    db = sqlite3.connect(live)
    db.execute("PRAGMA wal_autocheckpoint = 0")  # folded into the file only when this says so
    for statement in PREVIOUS_TABLES:
        db.execute(statement)
    last = max(batches)
    for batch, rows in sorted(batches.items()):
        if batch == last:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every batch before the last in the file itself
        with db:  # as its DecidedIndex.record did: a batch's rows and its newest hour, one transaction
            db.executemany("INSERT OR REPLACE INTO decided VALUES (?, ?, ?, ?)", [(m, batch, f, h) for m, f, h in rows])
            db.execute("INSERT INTO batches VALUES (?, ?)", (batch, max(h for _, _, h in rows)))
    for suffix in ("", "-wal"):  # copied while its writer still has it open: what a killed writer leaves
        shutil.copyfile(f"{live}{suffix}", f"{path}{suffix}")
    db.close()
    return sum(len(rows) for rows in batches.values())


def decisions_of(batches: dict[int, list[tuple[str, int | None, str]]]) -> dict[str, list[Decision]]:
    found: dict[str, list[Decision]] = {}
    for batch, rows in sorted(batches.items()):
        for message_id, first_seen_ms, hour in rows:
            found.setdefault(message_id, []).append(Decision(batch, first_seen_ms, hour))
    return found


def imports_of(store: Store) -> list[tuple[str, int]]:
    with store.engine.sql.connect() as connection:
        table = schema.decided_imports
        return [(r.source, r.rows) for r in connection.execute(select(table.c.source, table.c.rows))]


def rows_of(path: Path) -> int:
    """The rows of an index file, read from the file alone (a write-ahead log beside it is not read)."""
    with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro&immutable=1", uri=True)) as db:
        return int(db.execute("SELECT count(*) FROM decided").fetchone()[0])


def test_the_previous_releases_index_file_is_brought_in_once_and_renamed_aside(store: Store, tmp_path: Path) -> None:
    root = tmp_path / "verdicts"
    previous = root / "_index" / "decided.sqlite"
    held = write_previous_index(previous, PREVIOUS_BATCHES, tmp_path / "writer")
    archive = VerdictArchive(root, store)
    assert previous.is_file()  # opening the archive reads nothing: the first call brings it in
    expected = decisions_of(PREVIOUS_BATCHES)
    assert archive.index.find(expected) == expected
    aside = previous.with_name("decided.sqlite.imported")
    assert not previous.exists() and rows_of(aside) == held  # renamed whole: its write-ahead log folded in
    assert not Path(f"{previous}-wal").exists() and not Path(f"{aside}-wal").exists()
    assert imports_of(store) == [(str(previous.resolve()), held)]
    assert archive.index.count() == held

    # it carries on as the store's own: a replayed batch replaces its rows, pruning goes by its batches' hours
    assert archive.index.record(12, [("c", 900, hour_of(T0))]) == 1
    assert archive.index.find(["a", "c", "d"]) == {"a": expected["a"][:1], "c": [Decision(12, 900, hour_of(T0))]}
    assert archive.index.prune(T0 + HOUR_MS) == 3  # batches 11 and 12 (its newest hour is T0 now)
    assert archive.index.count() == 3_000

    # the same file found there again (copied back by hand): not brought in twice, set aside beside the first
    shutil.copyfile(aside, previous)
    again = VerdictArchive(root, store)
    assert again.index.count() == 3_000 and imports_of(store) == [(str(previous.resolve()), held)]
    assert not previous.exists() and rows_of(aside) == held
    (second,) = previous.parent.glob("decided.sqlite.imported-*")
    assert rows_of(second) == held


def test_two_processes_finding_the_file_at_once_bring_it_in_once(store: Store, tmp_path: Path) -> None:
    """Two stores (two processes' engines) on the same database, each with an archive over the same folder, ask at
    the same moment: one brings the file in, the other waits for it and finds the rows, brought once."""
    root = tmp_path / "verdicts"
    batches = {batch: [(f"m-{batch}-{n}", batch, hour_of(T0)) for n in range(20_000)] for batch in range(5)}
    held = write_previous_index(root / "_index" / "decided.sqlite", batches, tmp_path / "writer")
    asked = [f"m-{batch}-7" for batch in range(5)]
    start = threading.Barrier(2)
    found: list[dict[str, list[Decision]] | BaseException] = []

    def ask() -> None:
        other = Store(store.url)
        try:
            archive = VerdictArchive(root, other)
            start.wait()
            found.append(archive.index.find(asked))
        except BaseException as exc:  # handed to the test's thread
            found.append(exc)
        finally:
            other.close()

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    expected = {m: [Decision(int(m.split("-")[1]), int(m.split("-")[1]), hour_of(T0))] for m in asked}
    assert found == [expected, expected]
    assert DecidedIndex(store).count() == held and [rows for _, rows in imports_of(store)] == [held]
    assert [p.name for p in (root / "_index").iterdir()] == ["decided.sqlite.imported"]


def test_a_previous_index_that_is_not_an_sqlite_file_is_refused_by_name_until_moved(
    store: Store, tmp_path: Path
) -> None:
    root = tmp_path / "verdicts"
    previous = root / "_index" / "decided.sqlite"
    previous.parent.mkdir(parents=True)
    previous.write_text("not a database, but something else left here")
    index = VerdictArchive(root, store).index
    for _ in range(2):  # refused at every call, not once and then forgotten
        with pytest.raises(VerdictArchiveError, match=r"'previous index': got '.*decided\.sqlite'.*move it away"):
            index.find(["m1"])
    assert previous.is_file() and imports_of(store) == []
    previous.unlink()
    assert index.find(["m1"]) == {}
