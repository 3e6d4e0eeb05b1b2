"""The detector's driver process, as the driver records itself in ``<checkpoint>/driver.json``.

The entry point (spark/detector.py) writes its pid, its start time and its host there when it
starts, wherever the checkpoint is (a local folder or an object store: the launcher and the
supervisor read it from any host). A supervisor on the same host may ask whether that driver
still runs and stop it; a pid is trusted only while the process's start time still matches (pids
are reused), and a driver on another host is never signalled from here: it is judged by its
heartbeat in the store, and stopped through its cluster manager.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from khipu.storage.location import Location

DRIVER_FILE = "driver.json"


@dataclass(frozen=True, slots=True)
class DriverRecord:
    pid: int
    create_time: float | None  # the process's start time (None in records of older versions)
    host: str
    started_ms: int

    @property
    def local(self) -> bool:
        return self.host == socket.gethostname()

    def alive(self) -> bool | None:
        """True / False on this host; None for a driver on another host."""
        if not self.local:
            return None
        try:
            process = psutil.Process(self.pid)
            same = self.create_time is None or abs(process.create_time() - self.create_time) < 1.0
            return same and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False


def write_driver_record(checkpoint_dir: Location | Path) -> DriverRecord:
    """Record this process as the detector's driver."""
    now_ms = time.time_ns() // 1_000_000
    record = DriverRecord(os.getpid(), psutil.Process().create_time(), socket.gethostname(), now_ms)
    body = {"pid": record.pid, "create_time": record.create_time, "host": record.host, "started_ms": now_ms}
    (Location.of(checkpoint_dir, "checkpoint") / DRIVER_FILE).write_text(json.dumps(body))
    return record


def read_driver_record(checkpoint_dir: Location | Path) -> DriverRecord | None:
    try:
        data = json.loads((Location.of(checkpoint_dir, "checkpoint") / DRIVER_FILE).read_text())
        create_time = data.get("create_time")
        return DriverRecord(
            int(data["pid"]),
            float(create_time) if create_time is not None else None,
            str(data["host"]),
            int(data.get("started_ms", 0)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stop_driver(record: DriverRecord, timeout_s: float = 30.0) -> str:
    """SIGTERM (and SIGCONT, should it be stopped) the recorded driver; SIGKILL it after ``timeout_s``."""
    if not record.local:
        return f"driver runs on {record.host}: stop it through its cluster manager"
    if not record.alive():
        return f"driver {record.pid} already gone"
    try:
        for signum in (signal.SIGTERM, signal.SIGCONT):
            os.kill(record.pid, signum)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not record.alive():
                return f"driver {record.pid} stopped"
            time.sleep(0.5)
        os.kill(record.pid, signal.SIGKILL)
    except ProcessLookupError:  # it ended between our look and our signal
        return f"driver {record.pid} stopped"
    return f"driver {record.pid} killed after {timeout_s:.0f}s"
