"""Which losses a resend run takes: it reads a message's verdicts from the store and the verdict archive."""

from __future__ import annotations

from pathlib import Path

import pytest

from khipu.registry.loader import load_registry
from khipu.registry.model import ResendMode
from khipu.resend.run import Resender, ResendRequestError, ResendSelection
from khipu.store import Store
from tests.archived import seed_archived
from tests.viewdata import AUDIT_READ, PRODUCE, verdict

ROOT = Path(__file__).resolve().parents[3]
NOW_MS = 1_795_000_000_000


def test_a_named_message_that_is_not_confirmed_lost_is_refused_naming_its_archived_verdicts_too(
    tmp_path: Path,
) -> None:
    store = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    store.migrate()
    archived = seed_archived(store, tmp_path / "verdicts", NOW_MS)
    registry = load_registry(ROOT / "config" / "registry.yaml")
    resender = Resender(store, registry, {}, lambda: NOW_MS, verdict_archive_dir=tmp_path / "verdicts")
    selection = ResendSelection(modes=frozenset(ResendMode), message_ids=(archived.partly_lost,))
    with pytest.raises(ResendRequestError) as refused:
        resender.losses(selection)
    said = str(refused.value)
    assert f"{AUDIT_READ}: LOST" in said and f"{PRODUCE}: DELIVERED" in said  # the store's and the archive's
    store.close()


def test_kafkas_own_semantics_are_never_resent(tmp_path: Path) -> None:
    """An ABORTED or SUPERSEDED hop was never owed to anyone: a run over every stream takes neither, and naming the
    message says why it is refused."""
    store = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    store.migrate()
    rows = [
        verdict("aborted-1", PRODUCE, "ABORTED", NOW_MS - 60_000, count=0, decided_by="reconciliation"),
        verdict("compacted-1", AUDIT_READ, "SUPERSEDED", NOW_MS - 60_000, count=0, cause="compacted"),
        verdict("lost-1", AUDIT_READ, "CONFIRMED_LOST", NOW_MS - 60_000, count=0, cause="skipped_by_consumer"),
    ]
    store.verdicts.upsert(rows)
    resender = Resender(store, load_registry(ROOT / "config" / "registry.yaml"), {}, lambda: NOW_MS)
    taken = resender.losses(ResendSelection(modes=frozenset(ResendMode)))
    assert [r["message_id"] for r in taken] == ["lost-1"]
    for message_id, kind in (("aborted-1", "ABORTED"), ("compacted-1", "SUPERSEDED")):
        with pytest.raises(ResendRequestError, match=kind):
            resender.losses(ResendSelection(modes=frozenset(ResendMode), message_ids=(message_id,)))
    store.close()
