"""When Khipu was installed, as the store keeps it on SQLite and PostgreSQL: migration 0014 writes the time it runs,
once (a fresh store's creation, or an older store's upgrade), and khipu_reconcile's schedule starts at the hour
after it (tests/dags/test_khipu_reconcile_schedule.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from khipu.store import Store, StoreError, schema
from tests.integration.store.test_verdicts import migrate_to

pytestmark = pytest.mark.integration


def now_ms() -> int:
    return int(time.time() * 1000)


def test_a_new_store_keeps_its_creation_as_the_install_once(tmp_path: Path, empty_postgres_url: str) -> None:
    for url in (f"sqlite:///{tmp_path / 'khipu.db'}", empty_postgres_url):
        store = Store(url)
        try:
            before_ms = now_ms()
            store.migrate()
            after_ms = now_ms()
            installed_ms = store.installed_ms()
            assert installed_ms is not None and before_ms <= installed_ms <= after_ms, (url, installed_ms)
            store.migrate()  # make up migrates at every start: the install stays what it was
            assert store.installed_ms() == installed_ms
            with pytest.raises(IntegrityError), store.engine.sql.begin() as tx:  # one install, one row
                tx.execute(insert(schema.installation).values(id=2, installed_ms=after_ms))
            with store.engine.sql.connect() as connection:
                assert connection.execute(select(schema.installation)).all() == [(1, installed_ms)]
        finally:
            store.close()


def test_an_older_store_upgraded_keeps_the_upgrade_as_the_install(tmp_path: Path, empty_postgres_url: str) -> None:
    for url in (f"sqlite:///{tmp_path / 'old.db'}", empty_postgres_url):
        migrate_to(url, "0013")  # a store of the release before: it kept no install
        store = Store(url)
        try:
            store.heartbeat.record_read_to("khipu_detector", 1_000, 2_000)  # ... and holds the detector's progress
            with pytest.raises(StoreError, match=r"installation.*khipu store migrate"):
                store.installed_ms()  # says what to run, as every read of a store not migrated does
            before_ms = now_ms()
            migrate_to(url, "head")
            after_ms = now_ms()
            installed_ms = store.installed_ms()
            assert installed_ms is not None and before_ms <= installed_ms <= after_ms, (url, installed_ms)
            with store.engine.sql.connect() as connection:  # what it held is still there
                kept = connection.execute(
                    select(schema.detector_progress.c.query_name, schema.detector_progress.c.read_to_ms)
                )
                assert kept.all() == [("khipu_detector", 1_000)]

            migrate_to(url, "0013", command.downgrade)  # back to the release before: the table goes with it
            with pytest.raises(StoreError, match="installation"):
                store.installed_ms()
        finally:
            store.close()
