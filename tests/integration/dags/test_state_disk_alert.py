"""The state-disk check of the snapshot DAG, on this machine's real disk: it fires when the disk's free share is
below the limit, never twice, and resolves when it is back. The limits are set around what statvfs says here."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from khipu.alerting.disk import DISK_ALERT_KIND
from khipu.store import Store

pytestmark = pytest.mark.integration


def test_the_disk_alert_fires_once_below_the_limit_and_resolves_above_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from khipu_airflow.offsets import check_state_disk

    state, store_path = tmp_path / "state", tmp_path / "khipu.db"
    state.mkdir()
    monkeypatch.setenv("KHIPU_STATE_DIR", str(state))
    monkeypatch.setenv("AIRFLOW_CONN_KHIPU_STORE", json.dumps({"conn_type": "sqlite", "host": str(store_path)}))
    store = Store(f"sqlite:///{store_path}")
    store.migrate()
    found = os.statvfs(state)
    free_percent = 100.0 * found.f_bavail * found.f_frsize / (found.f_blocks * found.f_frsize)
    above, below = min(99.99, free_percent + 5), max(0.0, free_percent - 5)

    first = check_state_disk("khipu_store", min_free_percent=above)
    again = check_state_disk("khipu_store", min_free_percent=above)
    assert first["alert"] and not again["alert"]
    assert abs(first["free_percent"] - free_percent) < 1.0  # what statvfs says, give or take writes meanwhile
    fired = store.alerts.latest(DISK_ALERT_KIND)
    assert fired is not None and fired.state == "firing" and str(state) in fired.subject
    assert check_state_disk("khipu_store", min_free_percent=below)["alert"]
    resolved = store.alerts.latest(DISK_ALERT_KIND)
    assert resolved is not None and resolved.state == "resolved"
    store.close()
