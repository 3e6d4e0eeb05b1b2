"""PID files for the processes the local stack starts, so it stops only what it started.

A PID file records the process-group leader's pid and its start time; a pid that is alive but
started at another time belongs to someone else and is never signalled.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from khipu.localstack.broker import stop_process_group


@dataclass(frozen=True, slots=True)
class Started:
    name: str
    pid: int
    create_time: float
    detail: str

    def alive(self) -> bool:
        try:
            process = psutil.Process(self.pid)
            return abs(process.create_time() - self.create_time) < 1.0 and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False


class ProcessTable:
    """The ``<state>/run/<name>.json`` files of the local stack."""

    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / "run"

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.json"

    def get(self, name: str) -> Started | None:
        path = self.path(name)
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
            return Started(name, int(data["pid"]), float(data["create_time"]), str(data.get("detail", "")))
        except (ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            return None

    def running(self, name: str) -> Started | None:
        started = self.get(name)
        if started is not None and not started.alive():
            self.path(name).unlink(missing_ok=True)
            return None
        return started

    def record(self, name: str, pid: int, detail: str) -> Started:
        self.directory.mkdir(parents=True, exist_ok=True)
        started = Started(name, pid, psutil.Process(pid).create_time(), detail)
        self.path(name).write_text(json.dumps({"pid": pid, "create_time": started.create_time, "detail": detail}))
        return started

    def stop(self, name: str, timeout_s: float = 30.0) -> bool:
        """Stop the named process group if this table started it and it still runs."""
        started = self.running(name)
        if started is None:
            return False
        stop_process_group(started.pid, timeout_s)
        self.path(name).unlink(missing_ok=True)
        return True

    def spawn(
        self, name: str, argv: list[str], env: Mapping[str, str], log_path: Path, detail: str, cwd: Path | None = None
    ) -> Started:
        """Start ``argv`` in a new process group, logging to ``log_path``, and record it."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log_file:
            process = subprocess.Popen(
                argv,
                env=dict(env),
                cwd=cwd,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self.record(name, process.pid, detail)


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env
