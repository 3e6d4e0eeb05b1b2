"""Which losses a resend run takes: it reads a message's verdicts from the store and the verdict archive."""

from __future__ import annotations

from pathlib import Path

import pytest

from khipu.registry.loader import load_registry
from khipu.registry.model import ResendMode
from khipu.resend.run import Resender, ResendRequestError, ResendSelection
from khipu.store import Store
from tests.archived import seed_archived
from tests.viewdata import AUDIT_READ, PRODUCE

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
