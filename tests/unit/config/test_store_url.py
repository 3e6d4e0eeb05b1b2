"""KHIPU_STORE_URL: every form a user may write opens the store, or is refused at load by name, saying what was
given (never its password) and what is accepted. (The same URLs against the real PostgreSQL server:
tests/integration/store/test_store_url.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from khipu.config import KhipuSection, SettingsError, load


def loaded(url: str) -> str:
    section = load(KhipuSection, {"KHIPU_STORE_URL": url, "KHIPU_STATE_DIR": "/tmp/s"})
    assert section.store_url is not None
    return section.store_url


@pytest.mark.parametrize(
    ("given", "opened"),
    [
        ("postgresql://khipu:s3cret@db:5432/khipu", "postgresql+psycopg2://khipu:s3cret@db:5432/khipu"),
        ("postgres://khipu:s3cret@db:5432/khipu", "postgresql+psycopg2://khipu:s3cret@db:5432/khipu"),
        (
            "postgresql+psycopg2://khipu@db/khipu?sslmode=require",
            "postgresql+psycopg2://khipu@db/khipu?sslmode=require",
        ),
        # a password with the characters a URL escapes keeps them escaped, and means the same password
        ("postgresql://khipu:p%40ss%3Aw%2Frd@db/khipu", "postgresql+psycopg2://khipu:p%40ss%3Aw%2Frd@db/khipu"),
        ("sqlite:////var/lib/khipu/khipu.db", "sqlite:////var/lib/khipu/khipu.db"),
    ],
)
def test_each_accepted_form_loads_as_the_url_the_store_opens(given: str, opened: str) -> None:
    assert loaded(given) == opened
    assert loaded(opened) == opened  # handed on to another process, it reads the same


def test_a_relative_sqlite_path_is_the_file_where_the_setting_was_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = loaded("sqlite:///state/khipu.db")
    assert url == f"sqlite:///{tmp_path / 'state' / 'khipu.db'}"
    monkeypatch.chdir("/")  # an Airflow task or Spark's driver, given the URL, runs elsewhere: the same file
    assert loaded(url) == url


def test_unset_the_store_is_the_state_folders_file() -> None:
    assert load(KhipuSection, {"KHIPU_STATE_DIR": "/tmp/s"}).store_url == "sqlite:////tmp/s/khipu.db"


@pytest.mark.parametrize(
    ("given", "shown", "why"),
    [
        ("postgresql+psycopg://khipu:s3cret@db/khipu", "postgresql+psycopg://khipu:***@db/khipu",
         "names the PostgreSQL driver 'psycopg' (psycopg 3, which Khipu does not install)"),
        ("postgresql+asyncpg://khipu:s3cret@db/khipu", "postgresql+asyncpg://khipu:***@db/khipu",
         "names the PostgreSQL driver 'asyncpg'"),
        ("mysql://khipu:s3cret@db/khipu", "mysql://khipu:***@db/khipu", "is for 'mysql', a database the store"),
        ("sqlite+pysqlcipher:////tmp/k.db", "sqlite+pysqlcipher:////tmp/k.db", "names the SQLite driver"),
        ("sqlite:/tmp/khipu.db", "sqlite:/tmp/khipu.db", "is not a URL"),
        ("db:5432/khipu", "db:5432/khipu", "is not a URL"),
        ("postgresql//khipu:s3cret@db/khipu", "***@db/khipu", "is not a URL"),
        ("postgresql://khipu:s3cret@db:port/khipu", "postgresql://***@db:port/khipu", "is not a URL"),
    ],
)  # fmt: skip
def test_any_other_url_is_refused_at_load_by_name_without_its_password(given: str, shown: str, why: str) -> None:
    with pytest.raises(SettingsError) as caught:
        loaded(given)
    message = str(caught.value)
    assert caught.value.setting == "KHIPU_STORE_URL" and caught.value.value == shown, message
    assert why in message and "postgresql+psycopg2://" in message and "sqlite:////" in message, message
    assert "s3cret" not in message
