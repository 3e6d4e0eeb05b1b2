"""Judging the detector's heartbeat, and stopping a recorded driver (real processes, started here)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from khipu.detector.supervise import DetectorState, judge_detector, stop_driver

STALE = 120_000


@pytest.mark.parametrize(
    ("last_beat_ms", "now_ms", "state", "reason"),
    [
        (None, 1_000_000, DetectorState.NEVER_RAN, "no heartbeat has ever been stored"),
        (1_000_000, 1_005_000, DetectorState.HEALTHY, "last heartbeat 5s ago"),
        (1_000_000, 1_120_000, DetectorState.HEALTHY, "last heartbeat 120s ago"),  # exactly at the limit
        (1_000_000, 1_121_000, DetectorState.STALE, "last heartbeat 121s ago (stale after 120s)"),
    ],
)
def test_heartbeat_age_decides_the_state(last_beat_ms: int | None, now_ms: int, state: str, reason: str) -> None:
    health = judge_detector(last_beat_ms, now_ms, STALE)
    assert (health.state, health.reason, health.last_beat_ms) == (state, reason, last_beat_ms)


def record(checkpoint: Path, pid: int, host: str) -> None:
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / "driver.json").write_text(json.dumps({"pid": pid, "host": host}))


def test_a_driver_is_stopped_politely_and_a_deaf_one_is_killed(tmp_path: Path) -> None:
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    deaf = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"]
    )
    for process in (polite, deaf):  # reap them as they end, as their real parent would: no zombies
        threading.Thread(target=process.wait, daemon=True).start()
    try:
        record(tmp_path / "a", polite.pid, socket.gethostname())
        assert stop_driver(tmp_path / "a", timeout_s=10) == f"driver {polite.pid} stopped"
        polite.wait(timeout=5)
        # it must have installed its handler before we signal it
        subprocess.run([sys.executable, "-c", "import time; time.sleep(0.5)"], check=True)
        record(tmp_path / "b", deaf.pid, socket.gethostname())
        assert stop_driver(tmp_path / "b", timeout_s=1) == f"driver {deaf.pid} killed"
        assert deaf.wait(timeout=5) == -9
    finally:
        for process in (polite, deaf):
            if process.poll() is None:
                process.kill()


def test_nothing_is_signalled_without_a_local_driver_record(tmp_path: Path) -> None:
    assert stop_driver(tmp_path / "none") == "no driver recorded"
    record(tmp_path / "remote", 1, "spark-master-7")
    assert stop_driver(tmp_path / "remote") == "driver runs on spark-master-7: stop it through its cluster manager"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "driver.json").write_text("{not json")
    assert stop_driver(tmp_path / "bad") == "no driver recorded"
