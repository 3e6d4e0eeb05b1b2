"""The verdict archive's index, in the store: which micro-batch decided (gave a verdict to) each message.

The detector's verdict writer, every micro-batch, asks :meth:`DecidedRepository.find` for the messages it judged
and :meth:`~DecidedRepository.record`\\ s the batch's own; the view and the CLI ask where a message's archived
verdicts are (:class:`khipu.verdicts.archive.DecidedIndex` is how they reach it). It lives in the store, not as a
file beside the archive, so that every host reaching the store reaches it, wherever the archive is.

A micro-batch is 25,000 messages at 25,000 traces/s, so each call is one statement whatever its size: a batch's
rows go in by ``COPY`` on PostgreSQL (a CSV stream through psycopg2) and by one ``executemany`` on SQLite, in key
order; the ids looked for go as one JSON array, each looked up by the key (``json_array_elements_text`` on
PostgreSQL, ``json_each`` on SQLite).
"""

from __future__ import annotations

import csv
import gc
import io
import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import islice
from typing import Any, NamedTuple, cast

from sqlalchemy import Connection, delete, func, insert, select, text, update
from sqlalchemy.exc import DBAPIError

from khipu.store import schema
from khipu.store.engine import StoreEngine, insert_of
from khipu.trace.archive import hour_of

DecidedRow = tuple[str, int | None, str]  # (message id, first_seen_ms, archive hour YYYY-MM-DD-HH)
ImportedRow = tuple[str, int, int | None, str]  # (message id, batch id, first_seen_ms, hour): an earlier index's
IMPORT_CHUNK = 50_000  # rows written per statement while importing an earlier index

_COLUMNS = ("message_id", "batch_id", "first_seen_ms", "hour")
_COPY = f"COPY {schema.decided.name} ({', '.join(_COLUMNS)}) FROM STDIN WITH (FORMAT csv, FORCE_NULL (first_seen_ms))"
_INSERT = f"INSERT INTO {schema.decided.name} ({', '.join(_COLUMNS)}) VALUES (?, ?, ?, ?)"
_FIND = {  # the ids as one JSON array (:ids), joined on the key
    # PostgreSQL: each id looked up by the key's index (OFFSET 0 keeps the planner from turning the lateral lookup
    # into a join, which it may run as a scan of the whole table when its statistics are missing or old)
    "postgresql": text(
        "SELECT d.message_id, d.batch_id, d.first_seen_ms, d.hour "
        "FROM json_array_elements_text(CAST(:ids AS json)) AS j(id) CROSS JOIN LATERAL "
        f"(SELECT * FROM {schema.decided.name} WHERE message_id = j.id OFFSET 0) AS d"
    ),
    "sqlite": text(
        "SELECT d.message_id, d.batch_id, d.first_seen_ms, d.hour "
        f"FROM json_each(:ids) AS j JOIN {schema.decided.name} AS d ON d.message_id = j.value"
    ),
}


class Decision(NamedTuple):
    """A micro-batch that decided (gave a verdict to) a message, as the index records it."""

    batch_id: int
    first_seen_ms: int | None  # the detector state's: another value is another state (the message seen again)
    hour: str  # the archive hour (YYYY-MM-DD-HH) of the message's verdicts in that batch


class DecidedRepository:
    """``store.decided``: the ``decided`` table (a row per message and batch) and its batches (``decided_batches``,
    each with its newest hour, which pruning goes by). Hours are the archive's (YYYY-MM-DD-HH, UTC): the caller
    checks them (:meth:`khipu.verdicts.archive.DecidedIndex.record`)."""

    table = schema.decided.name

    def __init__(self, engine: StoreEngine) -> None:
        self._engine = engine

    def record(self, batch_id: int, rows: Iterable[DecidedRow]) -> int:
        """Replace the batch's rows by these (message id, first_seen_ms, hour), in one transaction: a replayed
        batch is recorded once. A message given twice keeps its last row. Returns how many messages it holds."""
        kept = {str(message_id): (first_seen_ms, hour) for message_id, first_seen_ms, hour in rows}
        # in key order: the key index is visited page by page, in order (PostgreSQL ~1.3x faster, SQLite ~1.5x)
        values = [(message_id, batch_id, *kept[message_id]) for message_id in sorted(kept)]
        with self._engine.begin() as tx:
            _forget(tx, batch_id)
            if values:
                _write(tx, values)
                last_hour = max(value[3] for value in values)
                tx.execute(insert(schema.decided_batches).values(batch_id=batch_id, last_hour=last_hour))
        return len(values)

    def forget_batch(self, batch_id: int) -> int:
        """Remove the batch's rows; returns how many there were."""
        with self._engine.begin() as tx:
            return _forget(tx, batch_id)

    def find(self, message_ids: Iterable[str]) -> dict[str, list[Decision]]:
        """The batches that decided each of these messages, oldest batch first (messages never decided, or
        pruned: absent)."""
        ids = sorted(set(message_ids))
        found: dict[str, list[Decision]] = {}
        if not ids:
            return found
        with self._engine.begin() as tx:
            rows = tx.execute(_FIND[tx.dialect.name], {"ids": json.dumps(ids)})
            with _cycle_collection_paused():  # tens of thousands of small acyclic objects: ~25 ms of collections
                for message_id, batch_id, first_seen_ms, hour in rows:
                    found.setdefault(message_id, []).append(Decision(batch_id, first_seen_ms, hour))
        for decisions in found.values():
            if len(decisions) > 1:
                decisions.sort()
        return found

    def prune(self, before_ms: int) -> int:
        """Remove the rows of the batches whose every hour ended at or before ``before_ms`` (by their newest hour,
        ``decided_batches``); returns how many."""
        cutoff = hour_of(before_ms)
        decided, batches = schema.decided, schema.decided_batches
        old = select(batches.c.batch_id).where(batches.c.last_hour < cutoff)
        with self._engine.begin() as tx:
            removed = tx.execute(delete(decided).where(decided.c.batch_id.in_(old))).rowcount
            tx.execute(delete(batches).where(batches.c.last_hour < cutoff))
        return int(removed or 0)

    def count(self) -> int:
        """How many (message, batch) rows it holds."""
        with self._engine.begin() as tx:
            return int(tx.execute(select(func.count()).select_from(schema.decided)).scalar_one())

    def import_once(self, source: str, rows: Iterable[ImportedRow], now_ms: int) -> int | None:
        """Bring an earlier index's rows (message id, batch id, first_seen_ms, hour) in, each batch with its newest
        hour, in one transaction, unless ``source`` (what names that index, e.g. its file's path) was brought in
        before; returns how many rows, None when it was. The import is claimed before ``rows`` is read: a second
        process importing the same source at once waits for the first to commit, then returns None without
        reading it (on SQLite it waits as long as the store's lock timeout, 30 s, then says the store is busy)."""
        imports = schema.decided_imports
        with self._engine.begin() as tx:
            claim = insert_of(tx)(imports).values(source=source, imported_ms=now_ms, rows=0)
            if not tx.execute(claim.on_conflict_do_nothing()).rowcount:
                return None
            last_hours: dict[int, str] = {}  # each batch's newest hour, as record() keeps it
            imported, remaining = 0, iter(rows)
            while chunk := list(islice(remaining, IMPORT_CHUNK)):
                _write(tx, chunk)
                for _, batch_id, _, hour in chunk:
                    last_hours[batch_id] = max(hour, last_hours.get(batch_id, hour))
                imported += len(chunk)
            if last_hours:
                batches = [{"batch_id": batch_id, "last_hour": hour} for batch_id, hour in sorted(last_hours.items())]
                tx.execute(insert(schema.decided_batches), batches)
            tx.execute(update(imports).where(imports.c.source == source).values(rows=imported))
        return imported


def _forget(tx: Connection, batch_id: int) -> int:
    """Delete the batch's rows and its entry; how many rows there were."""
    tx.execute(delete(schema.decided_batches).where(schema.decided_batches.c.batch_id == batch_id))
    return int(tx.execute(delete(schema.decided).where(schema.decided.c.batch_id == batch_id)).rowcount or 0)


def _write(tx: Connection, values: Sequence[ImportedRow]) -> None:
    """Insert (message id, batch id, first_seen_ms, hour) rows in one statement: PostgreSQL's COPY (a CSV stream:
    ids quoted whatever they hold, a missing first_seen_ms empty, which FORCE_NULL reads as NULL), SQLite's
    executemany."""
    if tx.dialect.name == "sqlite":
        tx.exec_driver_sql(_INSERT, list(values))
        return
    stream = io.StringIO()
    csv.writer(stream, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(values)
    stream.seek(0)
    psycopg2, connection = tx.dialect.loaded_dbapi, cast(Any, tx.connection.driver_connection)  # the transaction's
    try:
        with connection.cursor() as cursor:
            cursor.copy_expert(_COPY, stream)
    except psycopg2.Error as exc:  # raised past SQLAlchemy: wrapped as it wraps the driver's errors, so that the
        raise DBAPIError.instance(_COPY, None, exc, psycopg2.Error) from None  # store says it as every other


@contextmanager
def _cycle_collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a block allocates many objects that hold no cycles (it
    would walk them again and again as they are made); back on after, unless it was off already."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
