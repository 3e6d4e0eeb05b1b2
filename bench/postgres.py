"""Databases of their own on a PostgreSQL server for the benches that time the store on PostgreSQL.

``KHIPU_BENCH_POSTGRES_DSN`` names an admin connection (default: the test server `make test` starts, role
khipu_test on 127.0.0.1:5432); each bench makes a fresh database there and drops it when it ends.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg2

BENCH_POSTGRES_DSN = os.environ.get(
    "KHIPU_BENCH_POSTGRES_DSN", "host=127.0.0.1 port=5432 dbname=postgres user=khipu_test connect_timeout=5"
)


@contextmanager
def postgres_database(prefix: str, dsn: str = BENCH_POSTGRES_DSN) -> Iterator[str]:
    """A new, empty database named ``<prefix>_<random>``, as a store URL; dropped when the block ends."""
    admin = psycopg2.connect(dsn)
    admin.autocommit = True
    database = f"{prefix}_{secrets.token_hex(4)}"
    with admin.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{database}"')
    try:
        params = admin.get_dsn_parameters()
        yield f"postgresql+psycopg2://{params['user']}@{params['host']}:{params['port']}/{database}"
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        admin.close()
