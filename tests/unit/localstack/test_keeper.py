"""The keeper restarts a local-stack component that exits on its own, records why in its own words, and stops it
(without a restart) when the stack is stopped. Real processes: the keeper and a small Python program that fails once."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil

from khipu.localstack.keeper import delay_s, read_exits, reason_of
from khipu.localstack.processes import ProcessTable
from khipu.localstack.stack import restarts_note

FAILS_ONCE = """
import pathlib, sys, time
marker = pathlib.Path(sys.argv[1])
if not marker.exists():
    marker.write_text("failed once")
    print("demo run: stream demo.orders, sampling 100%", flush=True)
    print("khipu: error: demo component processor failed: DemoError('processor: 1 records unacknowledged after 30s')")
    sys.exit(1)
time.sleep(120)
"""


def test_the_reason_is_the_last_line_that_says_what_went_wrong_with_the_exit_status() -> None:
    lines = ["started", "khipu: error: the broker refused it", "closing", ""]
    assert reason_of(lines, 1) == "exit status 1: khipu: error: the broker refused it"
    assert reason_of(["just stopped"], -9) == "killed by signal 9: just stopped"
    assert reason_of([], 3) == "exit status 3"


def test_restarts_back_off_from_2_s_doubling_to_at_most_60_s() -> None:
    assert [delay_s(n) for n in (1, 2, 3, 4, 5, 6, 7, 20)] == [2, 4, 8, 16, 32, 60, 60, 60]


def test_a_component_that_died_is_restarted_and_status_says_why_and_stopping_it_restarts_nothing(
    tmp_path: Path,
) -> None:
    table = ProcessTable(tmp_path)
    marker = tmp_path / "marker"
    started = table.spawn(
        "demo", [sys.executable, "-c", FAILS_ONCE, str(marker)], {}, tmp_path / "demo.log", "the demo", keep=True
    )
    deadline = time.monotonic() + 20
    children: list[psutil.Process] = []
    while time.monotonic() < deadline:
        children = psutil.Process(started.pid).children()
        if marker.exists() and (read_exits(tmp_path, "demo") or {}).get("restarts") == 1 and children:
            break
        time.sleep(0.2)
    exits = read_exits(tmp_path, "demo")
    assert exits is not None and exits["restarts"] == 1
    assert exits["last"]["status"] == 1
    assert "processor: 1 records unacknowledged after 30s" in exits["last"]["reason"]
    assert table.running("demo") is not None and len(children) == 1  # the keeper, and the command run again
    note = restarts_note(tmp_path, "demo")
    assert "restarted 1x" in note and "exit status 1: khipu: error: demo component processor failed" in note
    log = (tmp_path / "demo.log").read_text()
    assert "DemoError" in log and "restart 1 in 2 s" in log  # the command's output and the keeper's word, in its log

    assert table.stop("demo", timeout_s=10)
    time.sleep(0.5)
    assert not children[0].is_running() or children[0].status() == psutil.STATUS_ZOMBIE
    assert read_exits(tmp_path, "demo") == exits  # stopped by the stack: not counted, not restarted
