"""The process table signals only what it started, and stops a stopped (SIGSTOPped) or deaf group too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from khipu.localstack.processes import ProcessTable

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]
DEAF = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"]


def test_a_sigstopped_group_is_continued_so_that_sigterm_ends_it(tmp_path: Path) -> None:
    table = ProcessTable(tmp_path)
    started = table.spawn("frozen", SLEEP, {}, tmp_path / "frozen.log", "a frozen driver")
    os.killpg(started.pid, signal.SIGSTOP)
    began = time.monotonic()
    assert table.stop("frozen", timeout_s=20)
    assert time.monotonic() - began < 5  # ended by its SIGTERM, not by the SIGKILL after 20 s
    assert table.running("frozen") is None


def test_a_group_deaf_to_sigterm_is_killed_after_the_timeout(tmp_path: Path) -> None:
    table = ProcessTable(tmp_path)
    table.spawn("deaf", DEAF, {}, tmp_path / "deaf.log", "ignores SIGTERM")
    time.sleep(0.5)  # let it install its handler
    began = time.monotonic()
    assert table.stop("deaf", timeout_s=1)
    assert 1 <= time.monotonic() - began < 5 and table.running("deaf") is None


def test_a_recorded_pid_whose_start_time_differs_is_someone_else_and_never_signalled(tmp_path: Path) -> None:
    table = ProcessTable(tmp_path)
    other = subprocess.Popen(SLEEP, start_new_session=True)
    try:
        table.path("old").parent.mkdir(parents=True, exist_ok=True)
        table.path("old").write_text(json.dumps({"pid": other.pid, "create_time": 1.0, "detail": "reused pid"}))
        assert table.running("old") is None and not table.stop("old")
        assert other.poll() is None  # untouched
    finally:
        other.kill()
        other.wait()
