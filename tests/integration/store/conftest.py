"""The store on both databases it supports: an SQLite file, and the PostgreSQL server on 127.0.0.1:5432
(a database of its own per test session, dropped afterwards).

`make test` starts that server first (scripts/ensure-postgres: role khipu_test, password-less from
127.0.0.1 only); KHIPU_TEST_POSTGRES_DSN points the tests at another server instead.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg2
import pytest

from khipu.store import Store

POSTGRES_ADMIN_DSN = os.environ.get(
    "KHIPU_TEST_POSTGRES_DSN", "host=127.0.0.1 port=5432 dbname=postgres user=khipu_test connect_timeout=5"
)


@contextmanager
def _postgres_database() -> Iterator[str]:
    """A new, empty PostgreSQL database, dropped afterwards."""
    name = f"khipu_test_{secrets.token_hex(4)}"
    try:
        admin = psycopg2.connect(POSTGRES_ADMIN_DSN)
    except psycopg2.OperationalError as exc:
        pytest.fail(
            f"no PostgreSQL server for the store tests ({POSTGRES_ADMIN_DSN}): {str(exc).strip()}; "
            "`make test` starts one (scripts/ensure-postgres), or set KHIPU_TEST_POSTGRES_DSN"
        )
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')
    try:
        params = admin.get_dsn_parameters()
        yield f"postgresql+psycopg2://{params['user']}@{params['host']}:{params['port']}/{name}"
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with _postgres_database() as url:
        yield url


@pytest.fixture
def empty_postgres_url() -> Iterator[str]:
    with _postgres_database() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'khipu.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    built = Store(url)
    built.migrate()
    try:
        yield built
    finally:
        if request.param == "postgresql":
            from sqlalchemy import text

            from khipu.store.schema import metadata

            tables = ", ".join(f'"{table.name}"' for table in metadata.sorted_tables)
            with built.engine.begin() as tx:  # the next test starts from empty tables, ids from 1 (as on SQLite)
                tx.execute(text(f"TRUNCATE TABLE {tables} RESTART IDENTITY"))
        built.close()
