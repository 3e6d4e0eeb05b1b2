"""Every form of store URL a user may write, against the real PostgreSQL server and SQLite files: the store
migrates and keeps what it is given, from the settings and from the command line; a driver Khipu does not install
is refused by name, not a ``ModuleNotFoundError`` traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from khipu.cli import main
from khipu.store import Store, StoreError


def forms(psycopg2_url: str) -> list[str]:
    """The URL as a user may write it: postgresql://, postgres://, postgresql+psycopg2://."""
    rest = psycopg2_url.removeprefix("postgresql+psycopg2://")
    return [f"postgresql://{rest}", f"postgres://{rest}", f"postgresql+psycopg2://{rest}"]


def keeps_a_heartbeat(url: str, at_ms: int) -> int | None:
    """Migrate the store at ``url``, record a heartbeat, read it back through a second Store of the same URL."""
    store = Store(url)
    try:
        store.migrate()
        store.heartbeat.record({"query_name": "q", "run_id": "r", "batch_id": 1, "at_ms": at_ms, "input_rows": 1,
                                "caught_up": True})  # fmt: skip
    finally:
        store.close()
    again = Store(url)
    try:
        beat = again.heartbeat.latest("q")
    finally:
        again.close()
    return None if beat is None else int(beat["at_ms"])


def test_postgresql_and_postgres_urls_open_the_store_with_the_installed_driver(empty_postgres_url: str) -> None:
    for n, url in enumerate(forms(empty_postgres_url)):
        assert keeps_a_heartbeat(url, 1_000 + n) == 1_000 + n, url


def test_khipu_store_migrate_takes_a_postgresql_url(
    empty_postgres_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KHIPU_STORE_URL", forms(empty_postgres_url)[0])  # postgresql://, as docker-compose has it
    assert main(["store", "migrate"]) == 0, capsys.readouterr().err
    store = Store(empty_postgres_url)
    try:
        assert store.heartbeat.latest("q") is None  # migrated: the table is there, empty
    finally:
        store.close()


def test_a_driver_khipu_does_not_install_is_refused_by_name(
    empty_postgres_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    psycopg3 = empty_postgres_url.replace("+psycopg2://", "+psycopg://")
    with pytest.raises(StoreError, match=r"names the PostgreSQL driver 'psycopg' \(psycopg 3"):
        Store(psycopg3)  # an Airflow connection's URL comes here without the settings' check
    monkeypatch.setenv("KHIPU_STORE_URL", psycopg3)
    assert main(["store", "migrate"]) == 2
    said = capsys.readouterr().err
    assert "KHIPU_STORE_URL" in said and "postgresql+psycopg2://" in said and "Traceback" not in said, said


def test_relative_and_absolute_sqlite_urls_open_the_same_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert keeps_a_heartbeat("sqlite:///state/khipu.db", 5_000) == 5_000
    assert (tmp_path / "state" / "khipu.db").is_file()
    monkeypatch.chdir("/")  # another process, elsewhere, given the absolute URL (sqlite:////...)
    store = Store(f"sqlite:///{tmp_path / 'state' / 'khipu.db'}")
    try:
        beat = store.heartbeat.latest("q")
        assert beat is not None and beat["at_ms"] == 5_000  # what the relative URL wrote
    finally:
        store.close()
