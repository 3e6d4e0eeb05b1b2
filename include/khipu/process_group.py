"""Process groups this user started, recorded so that only they are ever signalled.

A process started detached (:meth:`ProcessTable.spawn`) leads a process group of its own and outlives whoever
started it: the detector's ``spark-submit``, launched by an Airflow task that returns once the driver is up, and the
local stack's components. Its record, ``<state>/run/<name>.json``, holds the leader's pid and its start time; a pid
that is alive but started at another time belongs to someone else (pids are reused) and is never signalled.

Nothing here belongs to the local stack: the production launcher (``plugins/khipu_airflow/detector.py``) and the
local stack (:mod:`khipu.localstack.processes`, which adds a keeper that restarts a component) both stand on it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil


def stop_process_group(pid: int, timeout_s: float = 20.0) -> bool:
    """SIGTERM the process group led by ``pid``, SIGKILL it after ``timeout_s``. True if it was running.

    A stopped (SIGSTOPped) group is continued first, so that it can act on the SIGTERM.
    """
    try:
        os.killpg(pid, signal.SIGTERM)
        os.killpg(pid, signal.SIGCONT)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _group_alive(pid):
            _reap(pid)
            return True
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap(pid)
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    _reap(pgid)
    # A zombie leader keeps the group "alive" for killpg; treat a reaped leader with no members as gone.
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


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
    """The ``<state>/run/<name>.json`` records of the process groups started from ``state_dir``."""

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
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str],
        log_path: Path,
        detail: str,
        cwd: Path | None = None,
    ) -> Started:
        """Start ``argv`` in a new process group, its output appended to ``log_path``, and record it."""
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
