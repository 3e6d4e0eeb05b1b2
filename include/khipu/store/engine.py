"""The store's engine: one SQLAlchemy engine per store URL, its transactions, its migrations.

Every repository of the store (:mod:`khipu.store.snapshots`, ...) writes through :meth:`StoreEngine.begin`,
so a database that cannot be reached or lacks its schema always comes out as a :class:`StoreError` saying
what to do, with the URL's password hidden.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, String, Table, cast, create_engine, event, text, update, values
from sqlalchemy import column as sql_column
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, ProgrammingError

from khipu.config.store_url import StoreUrlError, store_url
from khipu.files import create_owner_only
from khipu.offsets.model import PartitionKey

MIGRATIONS = Path(__file__).parent / "migrations"
ROWS_PER_STATEMENT = 500  # rows a batched statement carries (25 columns: 12,500 parameters, under SQLite's 32,766)


class StoreError(RuntimeError):
    """The store could not be reached or used; the message names the store without its password."""


class StoreUnavailable(StoreError):
    """The store did not answer (down, restarting, unreachable, locked): asking again later may succeed, unlike a
    store that lacks its schema."""


class StoreEngine:
    """The database behind a store URL (SQLite or PostgreSQL): transactions and migrations."""

    def __init__(self, url: str, **engine_options: Any) -> None:
        try:  # postgresql:// and postgres:// opened with psycopg2, a relative SQLite path made absolute
            url = store_url(url, Path.cwd())
        except StoreUrlError as exc:
            raise StoreError(f"cannot open the store: {exc}") from None
        self.url = url
        self.safe_url = make_url(url).render_as_string(hide_password=True)
        if url.startswith("sqlite") and ":memory:" not in url:
            database = make_url(url).database
            if database:
                create_owner_only(Path(database))  # every stream's verdicts: SQLite gives its WAL and SHM this mode
        if url.startswith("sqlite"):
            engine_options.setdefault("connect_args", {"timeout": 30})
        self.sql: Engine = create_engine(url, **engine_options)  # the SQLAlchemy engine
        if url.startswith("sqlite"):
            event.listen(self.sql, "connect", _sqlite_for_concurrent_writers)

    def close(self) -> None:
        self.sql.dispose()

    def migrate(self) -> None:
        """Create or upgrade the schema to the newest migration (safe to repeat)."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        try:
            with self.sql.begin() as connection:
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
        except OperationalError as exc:
            raise StoreError(f"cannot migrate the store at {self.safe_url}: {exc.orig}") from None

    @contextmanager
    def begin(self, commit: bool = True) -> Iterator[Connection]:
        """A transaction; database errors come out as :class:`StoreError` saying what to do. ``commit=False``:
        rolled back at the end whatever happens (a dry run counts exactly what it would change, and keeps
        nothing)."""
        try:
            if commit:
                with self.sql.begin() as tx:
                    yield tx
            else:
                with self.sql.connect() as connection:
                    transaction = connection.begin()
                    try:
                        yield connection
                    finally:
                        transaction.rollback()
        except (OperationalError, ProgrammingError) as exc:
            explained = self._explain(exc)
            lacking = isinstance(exc, ProgrammingError) or explained.startswith(f"the store at {self.safe_url} lacks")
            raise (StoreError if lacking else StoreUnavailable)(explained) from None

    def size_bytes(self) -> int | None:
        """The bytes the database takes: SQLite's file with its write-ahead log, PostgreSQL's database size; None
        for an in-memory database."""
        if self.sql.dialect.name == "sqlite":
            database = make_url(self.url).database
            if not database or database == ":memory:":
                return None
            files = [Path(database + suffix) for suffix in ("", "-wal", "-shm")]
            return sum(f.stat().st_size for f in files if f.exists())
        with self.begin() as tx:
            return int(tx.execute(text("SELECT pg_database_size(current_database())")).scalar() or 0)

    def _explain(self, exc: OperationalError | ProgrammingError) -> str:
        detail = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
        if "no such table" in detail or "does not exist" in detail:
            return (
                f"the store at {self.safe_url} lacks part of its schema ({detail}): it was never migrated or is "
                "older than this Khipu; run `khipu store migrate` (make up does)"
            )
        return f"cannot use the store at {self.safe_url}: {detail}"


def insert_ignoring_duplicate(tx: Connection, table: Table, values: Mapping[str, Any]) -> bool:
    """Insert unless a unique constraint says the row exists (a retried task); True when inserted."""
    statement = insert_of(tx)(table).values(**values).on_conflict_do_nothing()
    return bool(tx.execute(statement).rowcount)


def upsert(tx: Connection, table: Table, rows: Sequence[Mapping[str, Any]], key: Sequence[str]) -> None:
    """Insert the rows, or replace the other columns of those whose ``key`` columns exist (a replayed batch)."""
    if not rows:
        return
    statement = insert_of(tx)(table)
    replaced = [column for column in rows[0] if column not in key]
    tx.execute(
        statement.on_conflict_do_update(
            index_elements=list(key), set_={column: statement.excluded[column] for column in replaced}
        ),
        [dict(row) for row in rows],
    )


def insert_many_ignoring_duplicates(tx: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> int:
    """Insert the rows a unique constraint does not say exist, one statement per ROWS_PER_STATEMENT rows; returns
    how many were new."""
    added = 0
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = [dict(row) for row in rows[start : start + ROWS_PER_STATEMENT]]
        added += int(tx.execute(insert_of(tx)(table).values(chunk).on_conflict_do_nothing()).rowcount or 0)
    return added


def update_many(
    tx: Connection,
    table: Table,
    rows: Sequence[Mapping[str, Any]],
    key: Sequence[str],
    guard: Sequence[str] = (),
) -> set[int]:
    """Set the other columns of each row whose ``key`` columns match and, for each name in ``guard``, whose column
    still holds the row's ``was_<name>`` (a row changed meanwhile is left alone); returns the positions in ``rows``
    of those not applied. One statement per ROWS_PER_STATEMENT rows, whatever their number: ``WITH changed(...) AS
    (VALUES ...) UPDATE ... FROM changed ... RETURNING`` (SQLite 3.35+ and PostgreSQL alike). Each value is cast to
    its column's type, as a VALUES list leaves a NULL untyped; text without its length, so that a value too long
    for its column is refused as a plain UPDATE's is (PostgreSQL would cut it short to fit a cast's length). A key
    given twice is updated in order, a statement for each time. Every row names the same columns."""
    if not rows:
        return set()
    names = list(rows[0])
    guarded = {f"was_{name}": table.c[name].type for name in guard}
    set_names = [name for name in names if name not in key and name not in guarded]
    rounds: list[list[int]] = []  # the n-th row of a key goes in round n: no statement has a key twice
    seen: dict[tuple[Any, ...], int] = {}
    for position, row in enumerate(rows):
        k = tuple(row[name] for name in key)
        n = seen[k] = seen.get(k, -1) + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(position)

    def typed(name: str) -> Any:
        kind = table.c[name].type
        return String() if isinstance(kind, String) else kind

    missed: set[int] = set()
    for batch in rounds:
        for start in range(0, len(batch), ROWS_PER_STATEMENT):
            chunk = batch[start : start + ROWS_PER_STATEMENT]
            types = {name: guarded.get(name, table.c[name].type if name in table.c else None) for name in names}
            changed = (
                values(*(sql_column(name, types[name]) for name in names), name="changed")
                .data([tuple(rows[i][name] for name in names) for i in chunk])
                .cte("changed")
            )
            statement = (
                update(table)
                .where(
                    *(table.c[name] == cast(changed.c[name], typed(name)) for name in key),
                    *(table.c[name] == cast(changed.c[f"was_{name}"], typed(name)) for name in guard),
                )
                .values({name: cast(changed.c[name], typed(name)) for name in set_names})
                .returning(*(table.c[name] for name in key))
            )
            done = {tuple(found) for found in tx.execute(statement)}
            missed.update(i for i in chunk if tuple(rows[i][name] for name in key) not in done)
    return missed


def partition_key_is(table: Table, key: PartitionKey) -> tuple[Any, ...]:
    """Conditions: the table's partition-key columns equal ``key``."""
    return (
        table.c.cluster == key.cluster,
        table.c.group_id == key.group,
        table.c.topic == key.topic,
        table.c.partition == key.partition,
    )


def insert_of(tx: Connection) -> Any:
    """The dialect's INSERT, the one with ON CONFLICT."""
    dialect = tx.dialect.name
    if dialect == "postgresql":
        return postgresql_insert
    if dialect == "sqlite":
        return sqlite_insert
    raise StoreError(f"the store supports SQLite and PostgreSQL, not {dialect}")


def _sqlite_for_concurrent_writers(connection: Any, _record: Any) -> None:
    """The local store is shared by the detector and Airflow tasks: write-ahead log, patient locks."""
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()
