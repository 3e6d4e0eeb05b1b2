"""Keeps one component of the local stack running: ``python -m khipu.localstack.keeper --name NAME --state DIR --
COMMAND...`` runs the command, and when it exits on its own, records why (its exit status and the last line it
printed that says what went wrong) in ``<state>/run/<name>.exits.json`` and starts it again after a bounded
back-off (2 s, doubling, at most 60 s; back to 2 s once a run lasted 5 minutes). ``khipu status`` shows the
restarts and the reason. Stopped by a signal (``make down`` signals the whole process group), it stops the
command and does not restart it.

The command's output passes through the keeper to the component's log, so the reason is the command's own words.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIRST_DELAY_S, MOST_DELAY_S, STEADY_AFTER_S = 2.0, 60.0, 300.0
_ERROR_WORDS = ("error", "exception", "failed", "fatal", "refused", "unacknowledged", "traceback")


@dataclass(frozen=True, slots=True)
class Exit:
    """How a run of the command ended: when, its status (negative: the signal), and why in its own words."""

    at_s: float
    status: int
    reason: str


def exits_path(state_dir: Path, name: str) -> Path:
    return state_dir / "run" / f"{name}.exits.json"


def read_exits(state_dir: Path, name: str) -> dict[str, Any] | None:
    """``{"restarts": N, "last": {"at_s", "status", "reason"}}`` for a kept component, or None."""
    try:
        found = json.loads(exits_path(state_dir, name).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def reason_of(lines: Sequence[str], status: int) -> str:
    """The last line that says what went wrong (an error, an exception, a failure), else the last line; with the
    exit status or the signal."""
    how = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
    said = [line.strip() for line in lines if line.strip()]
    telling = [line for line in said if any(word in line.lower() for word in _ERROR_WORDS)]
    words = (telling or said or [""])[-1][:500]
    return f"{how}: {words}" if words else how


def delay_s(restarts: int) -> float:
    """The wait before restart number ``restarts`` (1-based): 2 s doubling, at most 60 s."""
    return float(min(MOST_DELAY_S, FIRST_DELAY_S * 2 ** max(0, restarts - 1)))


class Keeper:
    def __init__(self, name: str, state_dir: Path, command: Sequence[str]) -> None:
        self.name, self.state_dir, self.command = name, state_dir, list(command)
        self.stopping = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def stop(self, *_: Any) -> None:
        self.stopping.set()
        child = self.child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    def run_once(self) -> Exit:
        """Run the command until it exits, passing its output on; how it ended."""
        tail: collections.deque[str] = collections.deque(maxlen=40)
        self.child = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert self.child.stdout is not None
        for raw in self.child.stdout:
            sys.stdout.buffer.write(raw)
            sys.stdout.flush()
            tail.append(raw.decode("utf-8", "replace"))
        status = self.child.wait()
        return Exit(time.time(), status, reason_of(list(tail), status))

    def record(self, ended: Exit) -> None:
        path = exits_path(self.state_dir, self.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        last = {"at_s": ended.at_s, "status": ended.status, "reason": ended.reason}
        path.write_text(json.dumps({"restarts": self.restarts, "last": last}))

    def keep(self) -> int:
        steady = 0
        while not self.stopping.is_set():
            started = time.monotonic()
            ended = self.run_once()
            if self.stopping.is_set():
                return 0
            if time.monotonic() - started >= STEADY_AFTER_S:
                steady = self.restarts  # a run that lasted: the back-off starts over
            self.restarts += 1
            wait = delay_s(self.restarts - steady)
            self.record(ended)
            print(f"khipu keeper: {self.name} ended ({ended.reason}); restart {self.restarts} in {wait:.0f} s",
                  flush=True)  # fmt: skip
            if self.stopping.wait(wait):
                return 0
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m khipu.localstack.keeper", description=__doc__)
    parser.add_argument("--name", required=True)
    parser.add_argument("--state", required=True, type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command to keep running is required after --")
    keeper = Keeper(args.name, args.state, command)
    signal.signal(signal.SIGTERM, keeper.stop)
    signal.signal(signal.SIGINT, keeper.stop)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return keeper.keep()


if __name__ == "__main__":
    sys.exit(main())
