"""Files holding stream data or secrets are their owner's only, whatever the umask and whoever created them first."""

from __future__ import annotations

import os
from pathlib import Path

from khipu.demo.ledger import LedgerWriter
from khipu.files import create_owner_only, ensure_token, tighten, write_owner_only
from khipu.store import Store


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_new_file_is_owner_only_under_an_open_umask_and_an_old_0644_one_is_tightened(tmp_path: Path) -> None:
    previous = os.umask(0o000)
    try:
        create_owner_only(tmp_path / "deep" / "new.db")
        old = tmp_path / "old.db"
        old.write_text("kept")
        old.chmod(0o644)
        create_owner_only(old)  # an existing file: its owner's choice, left as it is
        assert mode(old) == 0o644
        tighten(old)  # what `make up` does to the stack's own files an earlier release left
        tighten(tmp_path / "missing.db")  # nothing to tighten
        rewritten = tmp_path / "secret.json"
        rewritten.write_text("old")
        rewritten.chmod(0o644)
        write_owner_only(rewritten, "new")  # replaced whole, owner-only from its first byte
    finally:
        os.umask(previous)
    assert mode(tmp_path / "deep" / "new.db") == 0o600
    assert mode(old) == 0o600 and old.read_text() == "kept"
    assert mode(rewritten) == 0o600 and rewritten.read_text() == "new"
    assert not (tmp_path / "missing.db").exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "deep",
        "old.db",
        "secret.json",
    ]  # no temporary file left behind


def test_the_sqlite_store_and_the_demo_ledger_are_created_owner_only(tmp_path: Path) -> None:
    previous = os.umask(0o022)  # the usual umask, which leaves files readable by all
    try:
        store = Store(f"sqlite:///{tmp_path / 'state' / 'khipu.db'}")
        store.migrate()
        store.close()
        LedgerWriter(tmp_path / "demo" / "ledger.jsonl").close()
    finally:
        os.umask(previous)
    written = [tmp_path / "state" / "khipu.db", tmp_path / "demo" / "ledger.jsonl"]
    written += list((tmp_path / "state").glob("khipu.db-*"))  # SQLite's WAL and SHM, if any are left
    assert {str(p.name): oct(mode(p)) for p in written} == {str(p.name): "0o600" for p in written}


def test_a_token_is_drawn_once_owner_only_and_read_back_after(tmp_path: Path) -> None:
    path = tmp_path / "exporter.token"
    first = ensure_token(path)
    assert len(first) >= 32 and mode(path) == 0o600
    assert ensure_token(path) == first  # kept, not drawn again
    assert ensure_token(tmp_path / "other.token") != first
